"""The one storage section spelled for each engine: Spark's JVM gets no credential on its command line,
and a session's settings follow the section."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace import storage
from headrace.storage import S3Access, StorageConfig
from headrace.storage.spark_conf import CREDENTIAL_KEYS, storage_session_conf


def test_credentials_stay_off_the_spark_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "t0ken")
    monkeypatch.setattr(storage, "_config", StorageConfig(endpoint="http://10.0.0.5:9000", region="eu-west-1"))
    hadoop = S3Access.resolve(storage.current_config()).hadoop_conf()
    assert {k: hadoop[k] for k in CREDENTIAL_KEYS} == {"fs.s3a.access.key": "key-id", "fs.s3a.secret.key": "s3cr3t",
                                                       "fs.s3a.session.token": "t0ken"}
    assert hadoop["fs.s3a.aws.credentials.provider"].endswith("TemporaryAWSCredentialsProvider")
    conf = storage_session_conf("local[2]", {}, with_jars=True)
    assert not any(v in ("s3cr3t", "t0ken", "key-id") for v in conf.values())
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "10.0.0.5:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"


def test_spark_jars_packages_with_hadoop_aws_replace_the_jar_folder() -> None:
    conf = storage_session_conf("spark://m:7077", {"spark.jars.packages": "org.apache.hadoop:hadoop-aws:3.3.4"},
                                with_jars=True)
    assert "spark.jars" not in conf and "spark.driver.extraClassPath" not in conf


def test_a_store_off_loopback_is_virtual_hosted_over_https_unless_told() -> None:
    access = S3Access.resolve(StorageConfig(endpoint="https://s3.eu-central-1.example.com"))
    assert (access.path_style, access.use_ssl) == (False, True)
    assert access.pyiceberg_properties()["s3.force-virtual-addressing"] == "true"
    assert S3Access.resolve(StorageConfig(endpoint="https://minio.lan", path_style=True)).path_style


def test_a_cluster_gets_the_s3a_jars_shipped_to_its_executors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lighter check of tests/e2e/test_cluster.py's run on S3 (slow): on a cluster master the jars go
    to the executors with spark.jars besides the driver's class path; in local mode the driver's is all."""
    jars = [tmp_path / "hadoop-aws-3.3.1.jar", tmp_path / "aws-java-sdk-bundle-1.11.901.jar"]
    for jar in jars:
        jar.write_bytes(b"")
    monkeypatch.setenv("HEADRACE_S3A_JARS", str(tmp_path))
    monkeypatch.setattr(storage, "_config", None)
    conf = storage_session_conf("spark://m:7077", {}, with_jars=True)
    assert conf["spark.jars"].split(",") == [str(j) for j in jars]
    assert conf["spark.driver.extraClassPath"].split(":") == [str(j) for j in jars]
    assert "spark.jars" not in storage_session_conf("local[2]", {}, with_jars=True)
