"""A history table's append (a changelog's batch) committed on the driver: no Spark job.

pyarrow writes the rows as one Parquet file into the table's data folder (``files.table_sink``: field
ids, the table's codec) and one append through Iceberg's Java API commits it, its snapshot carrying
the batch's offset as Spark's ``snapshot-property`` does (``history.OFFSET``). A column the table
keeps and the batch has not (a dropped source column) is written NULL. Anything else returns False
and Spark appends: a type other than the row shape's, a partitioned table, a folder ``pyarrow.fs``
does not reach. A
crash before the commit leaves an orphan file (maintenance's ``remove_orphan_files``); after it, the
replay finds the offset and appends nothing.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from headrace.targets.iceberg import files
from headrace.targets.iceberg.catalog import java_table
from headrace.targets.iceberg.driver_apply import SUMMARY_PROPERTY, iceberg_arrow_type


def append_on_driver(spark: SparkSession, name: str, rows: pa.Table, properties: dict[str, str]) -> bool:
    """Append ``rows`` to Iceberg table ``name`` in one commit whose snapshot summary has ``properties``;
    False (nothing written) where Spark must append them."""
    jvm: Any = spark.sparkContext._jvm
    iceberg = java_table(spark, name)
    iceberg.refresh()
    if not iceberg.spec().isUnpartitioned():
        return False  # a file's partition values are Spark's to write
    fields = json.loads(str(jvm.org.apache.iceberg.SchemaParser.toJson(iceberg.schema())))["fields"]
    columns, ids = [], {}
    for field in fields:
        arrow = iceberg_arrow_type(field["type"])
        column = rows.column(field["name"]) if field["name"] in rows.column_names else None
        if arrow is None or (column is not None and column.type != arrow):
            return False
        # the cast gives a list's element its field id (equal types otherwise: nothing converted)
        columns.append(column.cast(arrow) if column is not None else pa.nulls(rows.num_rows, arrow))
        ids[field["name"]] = int(field["id"])
    if set(rows.column_names) - set(ids):
        return False  # a column the table has not (yet): Spark's append says so
    sink = files.table_sink(iceberg, ids)
    if sink is None:
        return False
    written = sink.write(pa.Table.from_arrays(columns, names=list(ids)), f"{uuid.uuid4().hex}-history")
    java = files.java_files(jvm)
    append = iceberg.newAppend()
    append.appendFile(files.data_file(java, iceberg, java.metrics_config.forTable(iceberg), written))
    for key, value in {**properties, SUMMARY_PROPERTY: "driver"}.items():
        append.set(key, value)
    append.commit()
    return True
