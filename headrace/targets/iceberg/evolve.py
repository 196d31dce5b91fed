"""Column changes of an Iceberg table following its source (``IcebergTarget.evolve``): one ALTER TABLE
each, Iceberg schema evolution (metadata only, no data rewritten).

Each step checks the table's current schema first, so running it again after a crash skips what is
done. Filling an added column with its default is a MERGE over every row.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from pyspark.sql import SparkSession

from headrace.core.names import quote_spark
from headrace.core.schema import SchemaChange, TableSchema, rename_collision
from headrace.core.spark_types import spark_type
from headrace.engines.spark.casts import text_value_frame


def evolve_columns(spark: SparkSession, name: str, new: TableSchema, changes: Sequence[SchemaChange]) -> None:
    """Apply the column ``changes`` (renames of the table aside) to Iceberg table ``name``, whose source
    now has schema ``new``."""
    for change in changes:
        col = change.column
        if not change.apply or change.kind == "rename_table" or col is None:
            continue
        current = {f.name: f.dataType for f in spark.table(name).schema.fields}
        target_type = spark_type(col.type)
        column = quote_spark(col.name)
        if change.kind == "drop_column" and col.name in current:
            spark.sql(f"ALTER TABLE {name} DROP COLUMN {column}")
        elif change.kind == "rename_column" and change.old_name and change.old_name in current:
            if col.name in current:
                raise rename_collision(new, change, name)
            spark.sql(f"ALTER TABLE {name} RENAME COLUMN {quote_spark(change.old_name)} TO {column}")
        elif change.kind == "alter_column_type" and current.get(col.name, target_type) != target_type:
            spark.sql(f"ALTER TABLE {name} ALTER COLUMN {column} TYPE {target_type.simpleString()}")
        elif change.kind == "add_column":
            existed = col.name in current
            if not existed:
                spark.sql(f"ALTER TABLE {name} ADD COLUMN {column} {target_type.simpleString()}")
            if existed or col.missing is not None:
                # Rows older than the column read PostgreSQL's default for it (NULL if none).
                view = f"hr_default_{uuid.uuid4().hex}"
                text_value_frame(spark, col.missing, col.type).createOrReplaceTempView(view)
                try:
                    spark.sql(
                        f"MERGE INTO {name} t USING {view} s ON true WHEN MATCHED THEN UPDATE SET t.{column} = s.v"
                    )
                finally:
                    spark.catalog.dropTempView(view)
