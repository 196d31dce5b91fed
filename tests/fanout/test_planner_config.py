"""Routing rules on hand-written change reads (Arrow only) and the fan-out config model."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pytest

from headrace.core.errors import ConfigError
from headrace.fanout.config import PartitionConfig, parse_fanout_config
from headrace.fanout.planner import route, split_by_index

# (snapshot, rowid, change_type, event_id, company, payload)
CHANGES = [
    (2, 0, "insert", 1, "acme", "a"),
    (3, 0, "update_preimage", 1, "acme", "a"),  # cross-tenant move acme -> beta
    (3, 0, "update_postimage", 1, "beta", "a"),
    (2, 1, "insert", 7, "acme", "x"),  # insert then delete: cancels
    (4, 1, "delete", 7, "acme", "x"),
    (3, 2, "update_preimage", 8, "beta", "old"),  # update shadowed by a later delete
    (3, 2, "update_postimage", 8, "beta", "new"),
    (5, 2, "delete", 8, "beta", "new"),
    (4, 3, "delete", 9, "acme", "gone"),  # plain delete of a row seeded earlier
    (5, 4, "insert", 9, "acme", "back"),  # same key re-inserted in a later snapshot
    (6, 5, "insert", 10, None, "null routing"),
    (6, 6, "insert", 11, "nobody", "unknown routing"),
]


def changes(rows: Sequence[tuple[object, ...]] = CHANGES) -> pa.Table:
    names = ["snapshot_id", "rowid", "change_type", "event_id", "company", "payload"]
    cols = list(zip(*rows, strict=True))
    types = [pa.int64(), pa.int64(), pa.string(), pa.int64(), pa.string(), pa.string()]
    return pa.table({n: pa.array(c, t) for n, c, t in zip(names, cols, types, strict=True)})


def test_full_change_mode_rules() -> None:
    routed = route(changes(), "company", ["event_id"], ["acme", "beta"])
    acme, beta = routed.by_value["acme"], routed.by_value["beta"]
    # acme: key 9 existed before (delete first) and is back with a new payload; key 1 arrived in
    # the range and left, key 7 cancelled: neither is deleted nor written there.
    assert acme.delete_keys.column("event_id").to_pylist() == [9]
    assert acme.upserts.to_pylist() == [{"event_id": 9, "company": "acme", "payload": "back"}]
    assert acme.removed == 0
    # beta: gets the moved row; key 8 existed before and was deleted after its update.
    assert beta.delete_keys.column("event_id").to_pylist() == [8]
    assert beta.upserts.to_pylist() == [{"event_id": 1, "company": "beta", "payload": "a"}]
    assert beta.removed == 1
    assert routed.cancelled == 1  # key 7: inserted and deleted inside the range
    assert acme.rows_read == 6 and beta.rows_read == 4


def test_move_seen_by_old_tenant_only() -> None:
    """A read filtered to acme sees only the preimage: the row leaves acme."""
    only_acme = [r for r in CHANGES if r[4] == "acme"]
    routed = route(changes(only_acme), "company", ["event_id"], ["acme"])
    assert sorted(routed.by_value["acme"].delete_keys.column("event_id").to_pylist()) == [9]
    move = [(3, 0, "update_preimage", 1, "acme", "a")]
    assert route(changes(move), "company", ["event_id"], ["acme"]).by_value["acme"].removed == 1


def test_append_only_appends_inserts() -> None:
    routed = route(changes(), "company", [], ["acme", "beta"])
    assert [r["event_id"] for r in routed.by_value["acme"].upserts.to_pylist()] == [1, 7, 9]
    assert routed.by_value["beta"].upserts.num_rows == 0
    assert routed.by_value["acme"].delete_keys.num_rows == 0


def test_split_by_index_drops_nulls() -> None:
    table = pa.table({"x": [1, 2, 3, 4]})
    parts = split_by_index(table, pa.array([1, None, 0, 1], pa.int32()), 3)
    assert [p.column("x").to_pylist() for p in parts] == [[3], [1, 4], []]


def _raw(**extra: object) -> dict[str, object]:
    return {
        "name": "events-fanout",
        "source": {"ducklake": {"catalog": "/s/meta.ducklake", "data_path": "/s/data", "table": "main.events"}},
        "routing": {"field": "company", "key_columns": ["event_id"]},
        "defaults": {"ducklake": {"catalog": "/lakes/{id}.ducklake", "data_path": "/lakes/{id}", "table": "events"}},
        "destinations": [{"id": "acme-lake", "routing_value": "acme"},
                         {"id": "beta-lake", "routing_value": "beta",
                          "ducklake": {"catalog_env": "BETA_CATALOG"}}],
        **extra,
    }


def test_defaults_are_inherited_and_expanded() -> None:
    config = parse_fanout_config(_raw())
    acme, beta = config.destinations
    assert acme.ducklake.catalog == "/lakes/acme-lake.ducklake" and acme.ducklake.table == "main.events"
    assert beta.ducklake.catalog is None and beta.ducklake.catalog_env == "BETA_CATALOG"
    assert beta.ducklake.data_path == "/lakes/beta-lake"
    with pytest.raises(ConfigError, match="BETA_CATALOG"):
        beta.ducklake.resolved_catalog("destination beta-lake")


def test_config_errors_name_the_problem() -> None:
    raw = _raw(destinations=[{"id": "a", "routing_value": "x"}, {"id": "b", "routing_value": "x"}])
    with pytest.raises(ConfigError, match="routing values listed twice"):
        parse_fanout_config(raw)
    with pytest.raises(ConfigError, match="ordinal"):
        parse_fanout_config(_raw(instance={"id": "i", "partition": {"mode": "hash", "total": 2, "ordinal": 2}}))
    with pytest.raises(ConfigError, match="unknown destinations"):
        parse_fanout_config(_raw(instance={"partition": {"mode": "explicit", "include": ["nope"]}}))


def test_partition_modes_split_destinations() -> None:
    ids = [f"tenant-{i}" for i in range(100)]
    shares = [[i for i in ids if PartitionConfig(mode="hash", total=3, ordinal=o).owns(i)] for o in range(3)]
    assert sorted(sum(shares, [])) == sorted(ids) and all(shares)
    assert [i for i in ids if PartitionConfig(mode="explicit", include=["tenant-5"]).owns(i)] == ["tenant-5"]
    assert all(PartitionConfig().owns(i) for i in ids)
