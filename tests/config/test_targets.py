"""The ``target:`` section read through the registry: one registered name, its own settings model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from headrace.config import load_config, parse_config
from headrace.core.errors import ConfigError
from headrace.core.names import TableName
from headrace.engines.spark.session import merged_conf
from headrace.targets import registry
from headrace.targets.ducklake.config import DuckLakeConfig
from headrace.targets.faulty.config import FaultyConfig
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.session import JDBC_DRIVER_JAR

LAKE = {"catalog": "/lake/meta.ducklake", "data_path": "/lake/data"}


def pipeline(target: Any, **more: Any) -> dict[str, Any]:
    return {"name": "p", "source": {"dsn": "dbname=x", "tables": ["public.t"]}, "target": target,
            "staging": {"path": "/tmp/s"}, **more}


def problems(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    return str(info.value)


def test_every_target_folder_with_a_plugin_is_registered() -> None:
    assert registry.names() == ["ducklake", "faulty", "iceberg"]
    for name in registry.names():
        assert registry.get(name).name == name


def test_an_unknown_target_names_the_registered_ones() -> None:
    assert "target: Value error, unknown target 'delta'; registered targets: ducklake, faulty, iceberg" \
        in problems(pipeline({"delta": {"path": "/d"}}))
    with pytest.raises(ConfigError, match="unknown target 'delta'; registered targets: ducklake, faulty, iceberg"):
        registry.get("delta")


def test_exactly_one_target() -> None:
    assert "give exactly one target, one of: ducklake, faulty, iceberg (got iceberg and ducklake)" \
        in problems(pipeline({"iceberg": {"warehouse": "/w"}, "ducklake": LAKE}))
    assert "target: Value error, give exactly one target" in problems(pipeline({}))
    assert "target: Field required" in problems({k: v for k, v in pipeline(None).items() if k != "target"})


def test_settings_errors_keep_their_place() -> None:
    text = problems(pipeline({"iceberg": {"warehous": "/w"}}))
    assert "target.iceberg.warehouse: Field required" in text
    assert "target.iceberg.warehous: Extra inputs are not permitted" in text
    assert "target.ducklake: Value error, ducklake needs exactly one of: catalog, catalog_env" \
        in problems(pipeline({"ducklake": {"data_path": "/d"}}))
    assert "target.iceberg.catalog: Value error, catalog type jdbc needs exactly one of: uri, uri_env" \
        in problems(pipeline({"iceberg": {"warehouse": "/w", "catalog": {"type": "jdbc"}}}))


def test_each_target_reads_its_own_settings() -> None:
    iceberg = parse_config(pipeline({"iceberg": {"warehouse": "/w", "namespace": "lake"}})).target
    assert iceberg.kind == "iceberg" and isinstance(iceberg.settings, IcebergConfig)
    assert (iceberg.settings.catalog_name, iceberg.settings.catalog.type) == ("headrace", "hadoop")
    assert iceberg.section("iceberg") is iceberg.settings and iceberg.section("ducklake") is None

    ducklake = parse_config(pipeline({"ducklake": {**LAKE, "schema": "mirror"}})).target
    assert ducklake.kind == "ducklake" and isinstance(ducklake.settings, DuckLakeConfig)
    assert ducklake.settings.schema_ == "mirror"

    faulty = parse_config(pipeline({"faulty": {"inner": {"ducklake": LAKE}, "faults": [
        {"fail_on": "apply_batch", "table": "Orders", "error": "terminal"}]}})).target
    assert faulty.kind == "faulty" and isinstance(faulty.settings, FaultyConfig)
    assert faulty.settings.inner.kind == "ducklake"
    (fault,) = faulty.settings.faults
    assert (fault.fail_on, fault.table, fault.error, fault.times) == ("apply_batch", "public.orders", "terminal", 1)
    text = problems(pipeline({"faulty": {"inner": {"ducklake": {"catalog": "/c"}}, "faults": [{"fail_on": "x"}]}}))
    assert "target.faulty.inner.ducklake.data_path: Field required" in text
    assert "target.faulty.faults.0.fail_on: Input should be 'ensure_table'" in text
    assert "unknown target 'nope'" in problems(pipeline({"faulty": {"inner": {"nope": {}}}}))


def test_names_users_query_come_from_the_target() -> None:
    table = TableName("Sales", "order items")
    iceberg = parse_config(pipeline({"iceberg": {"warehouse": "/w", "catalog_name": "lake"}})).target
    assert iceberg.table_name("p", table) == "lake.`Sales`.`order items`"  # Spark SQL's quoting
    assert iceberg.table_name("p", TableName("public", "a/b")) == "lake.public.`a%2Fb`"  # one directory
    assert iceberg.plugin.name_mapped(iceberg.settings, TableName("public", "a/b"))
    ducklake = parse_config(pipeline({"ducklake": {**LAKE, "schema": "mirror"}})).target
    assert ducklake.table_name("p", table) == 'mirror."order items"'
    assert not ducklake.plugin.name_mapped(ducklake.settings, TableName("public", "a/b"))
    faulty = parse_config(pipeline({"faulty": {"inner": {"iceberg": {"warehouse": "/w"}}}})).target
    assert faulty.table_name("p", table) == "headrace.`Sales`.`order items`"


def test_renames_are_refused_where_the_target_cannot_rename() -> None:
    hadoop = {"iceberg": {"warehouse": "/w"}}
    follow = {"schema_changes": {"rename_table": "follow"}}
    assert ("schema_changes.rename_table: follow is not possible with target.iceberg on a Hadoop catalog: it cannot"
            " rename tables") in problems(pipeline(hadoop, **follow))
    assert "follow is not possible with target.faulty on a Hadoop catalog" \
        in problems(pipeline({"faulty": {"inner": hadoop}}, **follow))
    parse_config(pipeline({"ducklake": LAKE}, **follow))  # DuckLake renames within a schema


def test_env_indirection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKECAT", "postgresql://lake@db.example/lakecat")
    iceberg = parse_config(pipeline({"iceberg": {"warehouse": "/w", "catalog": {"type": "jdbc",
                                                                                "uri_env": "LAKECAT"}}}))
    assert iceberg.target.settings.catalog.resolved_uri() == "postgresql://lake@db.example/lakecat"
    monkeypatch.delenv("LAKECAT")
    with pytest.raises(ConfigError, match="target.iceberg.catalog.uri: environment variable LAKECAT is not set"):
        iceberg.target.settings.catalog.resolved_uri()
    both = {"warehouse": "/w", "catalog": {"type": "jdbc", "uri": "postgresql://h/c", "uri_env": "LAKECAT"}}
    assert "exactly one of: uri, uri_env" in problems(pipeline({"iceberg": both}))
    ducklake = parse_config(pipeline({"ducklake": {"catalog_env": "LAKE_CATALOG", "data_path": "/d"}}))
    assert ducklake.target.settings.catalog_env == "LAKE_CATALOG"


def test_a_dumped_config_reads_back(tmp_path: Path) -> None:
    raw = pipeline({"faulty": {"inner": {"ducklake": {**LAKE, "schema": "mirror"}},
                               "faults": [{"fail_on": "write_snapshot", "error": "crash"}]}})
    config = parse_config(raw)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(config.model_dump(mode="json", by_alias=True,
                                                                            exclude_none=True)))))
    again = load_config(path)
    assert again == config and again.target.settings.inner.settings.schema_ == "mirror"
    assert parse_config({**raw, "target": config.target}).target == config.target  # an instance passes as is


def test_spark_conf_comes_from_the_target() -> None:
    jdbc = parse_config(pipeline({"iceberg": {"warehouse": "/w", "catalog": {"type": "jdbc",
                                                                             "uri": "postgresql://h/c"}}})).target
    conf = jdbc.spark_conf({})
    assert "IcebergSparkSessionExtensions" in conf["spark.sql.extensions"]
    assert JDBC_DRIVER_JAR in conf["spark.jars"] and conf["spark.driver.extraClassPath"] == JDBC_DRIVER_JAR
    # Maven brings the jars: the wheel's are left out (and the driver too when Maven brings it).
    maven = jdbc.spark_conf({"spark.jars.packages": "org.apache.iceberg:x:1,org.postgresql:postgresql:42.7.4"})
    assert "spark.jars" not in maven and "spark.driver.extraClassPath" not in maven
    ducklake = parse_config(pipeline({"ducklake": LAKE})).target.spark_conf({})
    assert "spark.jars" not in ducklake and "spark.sql.extensions" not in ducklake
    # The user's list-valued conf adds to the target's; other keys override it.
    merged = merged_conf(conf, {"spark.jars": "/mine.jar", "spark.sql.extensions": "my.Ext",
                                "spark.sql.iceberg.handle-timestamp-without-timezone": "false"})
    assert merged["spark.jars"].endswith(",/mine.jar") and merged["spark.jars"].startswith(conf["spark.jars"])
    assert merged["spark.sql.extensions"].split(",") == [conf["spark.sql.extensions"], "my.Ext"]
    assert merged["spark.sql.iceberg.handle-timestamp-without-timezone"] == "false"


def test_servers_a_target_depends_on_are_watched_like_the_source() -> None:
    from headrace.run.outage import servers_of

    lake = {"catalog": "postgres:dbname=lake host=127.0.0.1", "data_path": "/d"}
    for target in ({"ducklake": lake}, {"faulty": {"inner": {"ducklake": lake}}}):
        config = parse_config(pipeline(target))
        assert servers_of(config, "dbname=x", "dbname=x") == {"source": "dbname=x",
                                                               "ducklake catalog": "dbname=lake host=127.0.0.1"}
    for target in ({"ducklake": LAKE}, {"iceberg": {"warehouse": "/w"}}):
        assert servers_of(parse_config(pipeline(target)), "dbname=x", "dbname=y") == {
            "source": "dbname=x", "state": "dbname=y"}


def test_apply_concurrency_unset_is_the_targets_own_and_set_is_the_users() -> None:
    from headrace.run.apply_pass import ApplyPass
    from headrace.targets.ducklake.target import DuckLakeTarget
    from headrace.targets.iceberg.target import IcebergTarget

    def concurrency(raw: dict[str, Any], target: type) -> int:
        run = ApplyPass(parse_config(raw), *[None] * 6)  # type: ignore[arg-type]  # only the config is read
        return run._concurrency(target)  # type: ignore[arg-type]  # a class attribute is all it reads

    ducklake = pipeline({"ducklake": LAKE})
    assert concurrency(ducklake, DuckLakeTarget) == 2  # one writer: a batch built beside its commit
    assert concurrency(pipeline({"iceberg": {"warehouse": "/wh"}}), IcebergTarget) == 4
    assert concurrency({**ducklake, "apply": {"concurrency": 6}}, DuckLakeTarget) == 6
