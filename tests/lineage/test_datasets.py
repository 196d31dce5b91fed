"""Dataset names and column history for lineage events (no servers needed)."""

from __future__ import annotations

from pathlib import Path

from headrace.config import parse_config
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.lineage.datasets import column_history, source_dataset, target_dataset
from tests.e2e.helpers import make_config, raw_config

ITEMS = TableSchema(oid=1, schema="shop", name="items", key=("id",),
                    columns=(Column("id", ColumnType(TypeKind.INT, "integer"), 23),))


def test_names_follow_the_openlineage_conventions(tmp_path: Path) -> None:
    assert source_dataset("postgresql://app:pw@db.example:6432/sales", ITEMS).__dict__ == {
        "namespace": "postgres://db.example:6432", "name": "sales.shop.items"}
    assert source_dataset("host=db dbname=sales user=app", ITEMS).namespace == "postgres://db:5432"
    # MySQL/MariaDB: mysql://host:port (mariadb:// too, as OpenLineage has no MariaDB scheme), database.table
    assert source_dataset("mysql://repl:secret@db.example:3307/shop", ITEMS).__dict__ == {
        "namespace": "mysql://db.example:3307", "name": "shop.items"}
    assert source_dataset("mariadb://repl@127.0.0.1/shop", ITEMS).namespace == "mysql://127.0.0.1:3306"
    iceberg = make_config("postgresql://x@h/d", tmp_path, ["shop.items"], "iceberg")
    assert target_dataset(iceberg, ITEMS).__dict__ == {"namespace": "file",
                                                       "name": f"{tmp_path}/warehouse/shop/items"}
    raw = raw_config("postgresql://x@h/d", tmp_path, ["shop.items"])
    raw["target"] = {"iceberg": {"warehouse": "hdfs://nn:8020/lake", "namespace": "raw"}}
    on_hdfs = parse_config(raw)
    assert target_dataset(on_hdfs, ITEMS).__dict__ == {"namespace": "hdfs://nn:8020", "name": "/lake/raw/items"}
    lake = make_config("postgresql://x@h/d", tmp_path, ["shop.items"], "ducklake")
    assert target_dataset(lake, ITEMS).__dict__ == {"namespace": f"ducklake://{tmp_path}/lake/data",
                                                    "name": "shop.items"}


def test_column_history_follows_renames_of_renamed_and_kept_columns() -> None:
    events = [
        {"kind": "rename_column", "detail": "column name renamed to title"},
        {"kind": "drop_column", "detail": "column note dropped (kept in the target; rows inserted from now on get NULL)"},
        {"kind": "drop_column", "detail": "column gone dropped"},  # drop_column: drop — not in the target
        {"kind": "rename_column", "detail": "column title renamed to heading"},
    ]
    history = column_history(events)
    assert history.renamed_from == {"heading": "name"}
    assert history.kept == ["note"]


def test_schema_facets_name_the_source_type_and_the_target_type() -> None:
    """A MySQL table's source dataset lists MySQL's types; the target dataset the target's own."""
    from headrace.lineage.datasets import schema_facet
    from headrace.source.mysql.types import column_type

    table = TableSchema(oid=2, schema="shop", name="orders", key=("id",), columns=(
        Column("id", column_type("bigint", "bigint(20) unsigned", 20, 0, None, None), 1),
        Column("u", column_type("uuid", "uuid", None, None, None, None), 2),
        Column("at", column_type("datetime", "datetime(6)", None, None, 6, None), 3)))
    types = {kind: [f.type for f in schema_facet(table, [], kind is not None, kind).fields]
             for kind in (None, "iceberg", "ducklake")}
    assert types == {None: ["bigint unsigned", "uuid", "datetime(6)"],
                     "iceberg": ["decimal(20,0)", "string", "timestamp_ntz"],
                     "ducklake": ["DECIMAL(20,0)", "UUID", "TIMESTAMP"]}
