"""A data file's metrics, read from its footer with the IO's own Hadoop configuration
(``files.footer_metrics``), are those Iceberg's ``ParquetUtil.fileMetrics`` reads; no ``.crc`` files;
the footer a sink kept gives the same metrics and size without reading the file back."""

from __future__ import annotations

import datetime
import decimal
import itertools
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from headrace.targets.iceberg import files
from headrace.targets.iceberg.catalog import java_table
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.target import IcebergTarget

_catalogs = itertools.count()


def test_footer_metrics_are_iceberg_own_on_every_kind_of_column(spark: SparkSession, tmp_path: Path) -> None:
    target = IcebergTarget(spark, IcebergConfig(warehouse=str(tmp_path / "wh"),
                                                catalog_name=f"hr_footer_{next(_catalogs)}"), pipeline="p")
    name = f"`{target.settings.catalog_name}`.`public`.`m`"
    spark.sql(f"CREATE TABLE {name} (id bigint, s string, d double, f float, n decimal(38, 9), ts timestamp,"
              " day date, b boolean, raw binary, tags array<string>) USING iceberg")
    long_text = "ünïcödé " * 5  # longer than the 16 characters bounds are truncated to
    spark.sql(f"""INSERT INTO {name} VALUES
        (1, '{long_text}', double('NaN'), float('-Infinity'), 12345678901234567890123456789.123456789,
         TIMESTAMP '1900-01-01 00:00:00', DATE '0001-01-01', true, X'00FF', array('a', NULL)),
        (-9223372036854775808, '', -0.0, NULL, -1, TIMESTAMP '9999-12-31 23:59:59.999999', DATE '9999-12-31',
         false, X'', array()),
        (NULL, NULL, NULL, float('NaN'), NULL, NULL, NULL, NULL, NULL, NULL)""")
    jvm = spark.sparkContext._jvm
    java = files.java_files(jvm)
    iceberg = java_table(spark, name)
    io = iceberg.io()
    config = java.metrics_config.forTable(iceberg)
    added = list(iceberg.currentSnapshot().addedDataFiles(io))
    assert added
    for data_file in added:
        data = io.newInputFile(data_file.location())
        ours, theirs = files.footer_metrics(java, io, data, config), java.parquet_util.fileMetrics(data, config)
        assert ours.recordCount() == theirs.recordCount() == data_file.recordCount()
        for part in ("columnSizes", "valueCounts", "nullValueCounts", "nanValueCounts", "lowerBounds", "upperBounds"):
            assert getattr(ours, part)().equals(getattr(theirs, part)()), part
        assert theirs.lowerBounds().size() > 0
    # The session's local filesystem writes no checksum file beside each (engines.spark.session).
    assert list((tmp_path / "wh").rglob("*.parquet")) and not list((tmp_path / "wh").rglob("*.crc"))
    target.close()


def test_a_kept_footer_gives_the_metrics_and_size_of_the_file_read_back(spark: SparkSession, tmp_path: Path
                                                                         ) -> None:
    """``files.data_file`` from the footer the sink kept (no read of the file) equals ``data_file``
    from the file read back: every metric, the size, the row count."""
    target = IcebergTarget(spark, IcebergConfig(warehouse=str(tmp_path / "wh"),
                                                catalog_name=f"hr_footer_{next(_catalogs)}"), pipeline="p")
    name = f"`{target.settings.catalog_name}`.`public`.`Kept Footer`"
    spark.sql(f"CREATE TABLE {name} (id bigint, `Mixed Case` string, d double, f float, n decimal(38, 9),"
              " ts timestamp_ntz, day date, b boolean, raw binary) USING iceberg")
    iceberg = java_table(spark, name)
    sink = files.table_sink(iceberg, files.field_ids(spark, iceberg))
    assert sink is not None
    rows = pa.table({
        "id": pa.array([1, -9223372036854775808, None], pa.int64()),
        "Mixed Case": ["ünïcödé " * 5, "", None],
        "d": pa.array([float("nan"), -0.0, None], pa.float64()),
        "f": pa.array([float("-inf"), None, float("nan")], pa.float32()),
        "n": pa.array([decimal.Decimal("12345678901234567890123456789.123456789"), decimal.Decimal(-1), None],
                      pa.decimal128(38, 9)),
        "ts": pa.array([datetime.datetime(1900, 1, 1), datetime.datetime(9999, 12, 31, 23, 59, 59, 999999), None],
                       pa.timestamp("us")),
        "day": pa.array([datetime.date(1, 1, 1), datetime.date(9999, 12, 31), None], pa.date32()),
        "b": [True, False, None],
        "raw": [b"\x00\xff", b"", None],
    })
    written = sink.write(rows, "kept")
    assert written.footer
    java = files.java_files(spark.sparkContext._jvm)
    config = java.metrics_config.forTable(iceberg)
    kept = files.data_file(java, iceberg, config, written)
    read = files.data_file(java, iceberg, config, replace(written, footer=None))
    assert kept.fileSizeInBytes() == read.fileSizeInBytes() == Path(written.path.removeprefix("file:")).stat().st_size
    assert kept.recordCount() == read.recordCount() == 3
    for part in ("columnSizes", "valueCounts", "nullValueCounts", "nanValueCounts", "lowerBounds", "upperBounds"):
        assert getattr(kept, part)().equals(getattr(read, part)()), part
    assert kept.lowerBounds().size() > 0
    # Manifests are cached in the JVM (catalog.spark_catalog_conf): the table's FileIO has the property.
    assert str(iceberg.io().properties().get("io.manifest.cache-enabled")) == "true"
    target.close()
