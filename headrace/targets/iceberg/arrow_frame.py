"""A pyarrow Table on the driver as a Spark DataFrame: Arrow record batches handed to the JVM as they
are, with no Python row loop and no pandas.

PySpark 3.5 has no public ``createDataFrame(pyarrow.Table)``; its pandas route
(``_create_from_pandas_with_arrow``) converts pandas to Arrow, writes the record batches as an Arrow
IPC stream to a temporary file (``SparkContext._serialize_to_jvm``) and has the JVM read them into a
``LocalRelation`` (``PythonSQLUtils.toDataFrame``). This is that route from the Arrow step on. The
JVM loads the batches' buffers into vectors it builds from the Spark schema, so the Arrow types must
be the ones Spark's ``toArrow`` gives for that schema (decimal128(p, s), timestamp[us, UTC] for
``timestamp``, timestamp[us] for ``timestamp_ntz``, int32 days for ``date``, binary, 32-bit offset
strings and lists): the values then arrive bit for bit, NULLs included. ``arrow_frame`` checks it.

A ``LocalRelation`` lives in the plan, so this is for small tables (a driver-built batch); its
creation runs no Spark job.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.serializers import ArrowStreamSerializer

_SIMPLE: dict[type[T.DataType], pa.DataType] = {
    T.BooleanType: pa.bool_(), T.ByteType: pa.int8(), T.ShortType: pa.int16(), T.IntegerType: pa.int32(),
    T.LongType: pa.int64(), T.FloatType: pa.float32(), T.DoubleType: pa.float64(), T.StringType: pa.string(),
    T.BinaryType: pa.binary(), T.DateType: pa.date32(), T.TimestampType: pa.timestamp("us", tz="UTC"),
    T.TimestampNTZType: pa.timestamp("us"),
}


def spark_arrow_type(kind: T.DataType) -> pa.DataType:
    """The Arrow type Spark reads and writes a column of ``kind`` as (its ``ArrowUtils``; the zone of
    ``timestamp`` is only a label: the values are UTC microseconds either way)."""
    simple = _SIMPLE.get(type(kind))
    if simple is not None:
        return simple
    if isinstance(kind, T.DecimalType):
        return pa.decimal128(kind.precision, kind.scale)
    if isinstance(kind, T.ArrayType):
        return pa.list_(pa.field("element", spark_arrow_type(kind.elementType)))
    raise TypeError(f"no Arrow route into Spark for {kind.simpleString()}")


def _same_layout(have: pa.DataType, want: pa.DataType) -> bool:
    """``have``'s buffers read correctly as ``want`` (a timestamp's zone and a list's field name aside)."""
    if pa.types.is_timestamp(have) and pa.types.is_timestamp(want):
        return have.unit == want.unit and (have.tz is None) == (want.tz is None)
    if pa.types.is_list(have) and pa.types.is_list(want):
        return _same_layout(have.value_type, want.value_type)
    return bool(have == want)


def arrow_frame(spark: SparkSession, rows: pa.Table, schema: T.StructType) -> DataFrame:
    """``rows`` as a DataFrame of ``schema`` (same column names, in order; types per
    ``spark_arrow_type``). Raises ``TypeError`` for a column in another Arrow type: converting it
    here could change a value, so the caller must build it in the right type."""
    if rows.column_names != schema.names:
        raise TypeError(f"Arrow columns {rows.column_names} are not the schema's {schema.names}")
    for field, arrow_field in zip(schema.fields, rows.schema, strict=True):
        want = spark_arrow_type(field.dataType)
        if not _same_layout(arrow_field.type, want):
            raise TypeError(f"column {field.name}: Arrow {arrow_field.type} is not Spark's {want} for"
                            f" {field.dataType.simpleString()}")
    sc = spark.sparkContext
    jvm: Any = sc._jvm

    def reader(path: str) -> Any:
        return jvm.PythonSQLUtils.readArrowStreamFromFile(path)

    def server() -> Any:
        return jvm.ArrowIteratorServer()  # used instead of the file when spark.io.encryption is on

    # One record batch: a LocalRelation keeps the rows in the plan whatever the batching.
    batches = rows.combine_chunks().to_batches() or [pa.RecordBatch.from_pylist([], schema=rows.schema)]
    jbatches = sc._serialize_to_jvm(batches, ArrowStreamSerializer(), reader, server)  # type: ignore[attr-defined]
    jdf = jvm.PythonSQLUtils.toDataFrame(jbatches, schema.json(), spark._jsparkSession)
    return DataFrame(jdf, spark)
