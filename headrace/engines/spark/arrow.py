"""The Arrow bridge out of Spark: a DataFrame collected to the driver as one Arrow table."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame



def to_arrow(changes: DataFrame) -> pa.Table:
    """``changes`` on the driver as one Arrow table (Spark 3.5 has no public ``toArrow``)."""
    to_arrow = getattr(changes, "toArrow", None)
    if to_arrow is not None:
        table: pa.Table = to_arrow()
        return table
    from pyspark.sql.pandas.types import to_arrow_schema

    batches = changes._collect_as_arrow()
    schema = to_arrow_schema(changes.schema)
    return pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()
