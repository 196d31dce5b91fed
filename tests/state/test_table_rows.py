"""``StateStore.tables``: read at every pass of the run loop, it reads whole only the rows written
since its last call (any writer: another store, its own transaction), on a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore

ID = (Column("id", ColumnType(TypeKind.LONG, "bigint"), 20),)
TABLES = [TableSchema(31 + i, "public", name, ID, ("id",)) for i, name in enumerate(["b orders", "A Customers", "c"])]


@pytest.fixture
def stores(source_dsn: str) -> Iterator[tuple[StateStore, StateStore]]:
    mine, other = StateStore(source_dsn, "rows"), StateStore(source_dsn, "rows")
    mine.install()
    for table in TABLES:
        mine.add_table(table)
    try:
        yield mine, other
    finally:
        for table in TABLES:
            mine.remove_table(table.oid)
        mine.close()
        other.close()


def test_a_row_is_read_again_only_once_written_by_anyone(stores: tuple[StateStore, StateStore]) -> None:
    mine, other = stores
    first = mine.tables()
    names = [r.schema.name for r in first]
    assert names == [r["table_name"] for r in mine.conn.execute(
        "SELECT table_name FROM _headrace.tables WHERE pipeline = 'rows' ORDER BY schema_name, table_name")]
    again = mine.tables()
    assert all(a is b for a, b in zip(first, again, strict=True))  # nothing written: the rows kept
    other.copy_started(TABLES[0].oid, 1000)  # another process's write
    seen = {r.oid: r for r in mine.tables()}
    assert seen[TABLES[0].oid].state is TableState.SNAPSHOT and seen[TABLES[0].oid].snapshot_lsn == 1000
    assert seen[TABLES[1].oid] is first[names.index("A Customers")]
    assert [r.oid for r in mine.tables([TableState.SNAPSHOT])] == [TABLES[0].oid]
    with mine.conn.transaction():  # its own transaction, writing the row twice: seen each time
        mine.copy_finished(TABLES[0].oid, 5)
        assert {r.oid: r.state for r in mine.tables()}[TABLES[0].oid] is TableState.CATCHUP
        mine.caught_up(TABLES[0].oid)
        assert {r.oid: r.state for r in mine.tables()}[TABLES[0].oid] is TableState.STREAMING
    other.remove_table(TABLES[2].oid)
    assert TABLES[2].oid not in {r.oid for r in mine.tables()}
    other.add_table(TABLES[2])
    assert {r.oid: r.state for r in mine.tables()}[TABLES[2].oid] is TableState.PENDING
