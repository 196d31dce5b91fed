"""Iceberg catalog settings: the config's rules, the JDBC URL built from a libpq URI, no password shown."""

from __future__ import annotations

from typing import Any

import pytest

from headrace.config import parse_config
from headrace.core.errors import ConfigError
from headrace.targets.iceberg.catalog import jdbc_database, pyiceberg_properties, spark_catalog_conf
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.session import JDBC_DRIVER_JAR


def pipeline(iceberg: dict[str, Any], rename: str = "keep") -> dict[str, Any]:
    return {"name": "p", "source": {"dsn": "dbname=x", "tables": ["public.t"]}, "target": {"iceberg": iceberg},
            "staging": {"path": "/tmp/s"}, "schema_changes": {"rename_table": rename}}


JDBC = {"warehouse": "/data/lake", "catalog": {"type": "jdbc", "uri": "postgresql://lake:s3cret@db.example:6543/lakecat"}}


def test_hadoop_is_the_default_and_cannot_follow_renames() -> None:
    assert parse_config(pipeline({"warehouse": "/w"})).target.settings.catalog.type == "hadoop"
    with pytest.raises(ConfigError, match="Hadoop catalog.*JDBC catalog"):
        parse_config(pipeline({"warehouse": "/w"}, rename="follow"))


def test_jdbc_follows_renames_and_needs_one_uri() -> None:
    config = parse_config(pipeline(JDBC, rename="follow"))
    assert config.target.spark_conf({})["spark.driver.extraClassPath"] == JDBC_DRIVER_JAR  # the JDBC driver
    with pytest.raises(ConfigError, match="exactly one of: uri, uri_env"):
        parse_config(pipeline({"warehouse": "/w", "catalog": {"type": "jdbc"}}))
    with pytest.raises(ConfigError, match="hadoop takes no uri"):
        parse_config(pipeline({"warehouse": "/w", "catalog": {"uri": "postgresql://h/db"}}))


def test_spark_and_pyiceberg_see_the_same_database(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = IcebergConfig.model_validate({**JDBC, "catalog_name": "lakehouse"})
    conf = spark_catalog_conf(settings)
    assert conf["spark.sql.catalog.lakehouse.type"] == "jdbc"
    assert conf["spark.sql.catalog.lakehouse.uri"] == "jdbc:postgresql://db.example:6543/lakecat"
    assert (conf["spark.sql.catalog.lakehouse.jdbc.user"], conf["spark.sql.catalog.lakehouse.jdbc.password"]) == (
        "lake", "s3cret")
    assert pyiceberg_properties(settings) == {
        "uri": "postgresql+psycopg2://lake:s3cret@db.example:6543/lakecat", "warehouse": "file:///data/lake"}
    monkeypatch.setenv("LAKECAT", "host=10.0.0.5 dbname=cat user=u sslmode=require connect_timeout=3")
    database = jdbc_database(IcebergConfig.model_validate(
        {"warehouse": "/w", "catalog": {"type": "jdbc", "uri_env": "LAKECAT"}}).catalog.resolved_uri())
    assert database.jdbc_url == "jdbc:postgresql://10.0.0.5:5432/cat?connectTimeout=3&sslmode=require"
    assert database.sqlalchemy_url == "postgresql+psycopg2://u@10.0.0.5:5432/cat?connect_timeout=3&sslmode=require"


def test_uris_jdbc_cannot_take_are_refused_without_showing_the_password() -> None:
    with pytest.raises(ConfigError, match="over TCP") as info:
        jdbc_database("host=/var/run/postgresql dbname=cat password=s3cret")
    assert "s3cret" not in str(info.value)
    with pytest.raises(ConfigError, match="target_session_attrs") as info:
        jdbc_database("postgresql://u:s3cret@h/cat?target_session_attrs=read-write")
    assert "s3cret" not in str(info.value)
    with pytest.raises(ConfigError, match="not a PostgreSQL URL") as info:
        jdbc_database("postgresql://u:s3cret@h/cat?nonsense=1")
    assert "s3cret" not in str(info.value)
    assert "s3cret" not in jdbc_database("postgresql://u:s3cret@h/cat").shown


def test_a_rest_catalog_reaches_s3_through_hadoop_unless_the_session_names_another_file_io() -> None:
    settings = IcebergConfig.model_validate(
        {"warehouse": "s3://lake/w", "catalog_name": "lakehouse", "catalog": {"type": "rest", "uri": "http://h:8181"}})
    key = "spark.sql.catalog.lakehouse.io-impl"
    assert spark_catalog_conf(settings)[key] == "org.apache.iceberg.hadoop.HadoopFileIO"
    # A user with the AWS SDK v2 bundle names S3FileIO in spark.conf: the catalog keeps it.
    assert spark_catalog_conf(settings, "org.apache.iceberg.aws.s3.S3FileIO")[key] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert key not in spark_catalog_conf(IcebergConfig.model_validate(JDBC), "x.Y")  # theirs alone, untouched
