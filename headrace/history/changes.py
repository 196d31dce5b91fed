"""A batch's staged changes read one by one, typed, in commit order: what every history mode is built from.

The mirror keeps only the last change per key (``engines.driver.batch``); history needs every
change with its position, commit time and transaction id. The staged files are read with pyarrow
and cast by DuckDB with the driver's casts (``engines.driver.casts``), so a history row holds
the value the mirror holds for the same change. A value only Spark's casts take raises
``HistoryCastError``: history tables are built on the driver lane only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from headrace.core.errors import TerminalError
from headrace.core.names import quote_ident
from headrace.core.position import Position
from headrace.core.rows import unchanged_token
from headrace.core.schema import TableSchema
from headrace.core.spark_types import ValueRules
from headrace.engines.driver.casts import FALLBACK_MARKER, cast_sql, literal, register_functions
from headrace.log.codec import STAGING_SCHEMA, read_staging_file

Key = tuple[Any, ...]


class HistoryCastError(TerminalError):
    """A staged value the driver's casts do not take; history tables are built on the driver only."""


@dataclass(frozen=True)
class Change:
    """One source change: ``values`` the row after it (the key's columns only for a delete; empty for
    a truncate), ``old_key`` the key before an update that changed it, ``unchanged`` the TOAST
    columns the update left as they were (their ``values`` entry is meaningless)."""

    op: str  # I, U, D, T
    lsn: int
    seq: int
    ts: datetime
    xid: int | None
    values: dict[str, Any]
    old_key: dict[str, Any] | None = None
    unchanged: frozenset[str] = frozenset()

    @property
    def position(self) -> Position:
        return Position(self.lsn, self.seq)


def key_of(table: TableSchema, values: dict[str, Any]) -> Key:
    """The key tuple of a row's values (every column for a table without a key)."""
    return tuple(values.get(k) for k in (table.key or table.column_names))




def _connection() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(config={"threads": 1})
    con.execute("SET TimeZone = 'UTC'")
    register_functions(con)
    return con


def read_staged(paths: Sequence[str]) -> pa.Table:
    """The staged rows of ``paths`` (``STAGING_SCHEMA``)."""
    return pa.concat_tables([read_staging_file(p) for p in paths]) if paths else STAGING_SCHEMA.empty_table()


def read_changes(paths: Sequence[str], table: TableSchema, skip_through: Position | None,
                 rules: ValueRules) -> list[Change]:
    """Every change of the staged files ``paths`` after ``skip_through``, typed, in (lsn, seq) order."""
    return changes_of(read_staged(paths), table, skip_through, rules)


def _skip_sql(skip_through: Position | None) -> str:
    if skip_through is None:
        return ""
    return f"WHERE _lsn > {skip_through.lsn} OR (_lsn = {skip_through.lsn} AND _seq > {skip_through.seq})"


def _value(column: str, source: str) -> str:
    return f"json_extract_string({source}, {literal('$.' + _json_path(column))})"


def changelog_arrow(staged: pa.Table, table: TableSchema, skip_through: Position | None,
                    rules: ValueRules) -> pa.Table | None:
    """The changelog rows of ``staged`` built by one DuckDB query (``build.changelog_rows``'s rows, without
    a Python object per change); None when a change left a TOAST column unchanged: its value is in the
    row before, which ``build.changelog_rows`` looks up."""
    if staged.num_rows and staged.column("_unchanged_cols").null_count < staged.num_rows:
        return None
    keyed = bool(table.key)

    def row(op: str, data: str, keys_only: bool) -> str:
        cols = []
        for c in table.columns:
            value = cast_sql(_value(c.name, data), c.type, rules, c.name)
            if keys_only and c.name not in table.key:
                value = "NULL"
            elif keyed and c.name not in table.key and op == "_op":
                value = f"CASE WHEN _op = 'D' THEN NULL ELSE {value} END"
            cols.append(f"{value} AS {quote_ident(c.name)}")
        return ", ".join([*cols, f"{op} AS _hr_op", "_ts AS _hr_commit_ts", "_lsn AS _hr_lsn", "_seq AS _hr_seq",
                          "_xid AS _hr_xid"])

    moved = " OR ".join(f"{_value(k, '_old_key')} IS DISTINCT FROM {_value(k, '_data')}" for k in table.key)
    moves = f"_op = 'U' AND _old_key IS NOT NULL AND ({moved})" if keyed else "false"
    sql = f"""
WITH s AS (SELECT * FROM hr_staged {_skip_sql(skip_through)})
SELECT * FROM (
  SELECT {row('_op', '_data', False)}, 1 AS hr_sub FROM s WHERE NOT ({moves})
  UNION ALL SELECT {row("'D'", '_old_key', True)}, 0 AS hr_sub FROM s WHERE {moves}
  UNION ALL SELECT {row("'I'", '_data', False)}, 1 AS hr_sub FROM s WHERE {moves}
) ORDER BY _hr_lsn, _hr_seq, hr_sub
"""
    con = _connection()
    try:
        con.register("hr_staged", staged)
        rows = _read_all(con.execute(sql).arrow())  # before the close: the result may be a lazy reader
    except duckdb.Error as exc:
        raise _cast_error(table, exc) from exc
    finally:
        con.close()
    return rows.drop_columns(["hr_sub"])


def soft_delete_arrow(changelog: pa.Table, table: TableSchema) -> tuple[pa.Table, pa.Table] | None:
    """``build.soft_delete_batch`` for a batch whose changelog (``changelog_arrow``) holds no TRUNCATE: per
    key touched, the row after its last change (a deleted one with the values of its last change before
    the delete), and the keys whose last change deleted a row the batch never held (marked deleted in
    place). One DuckDB aggregation over the positions picks each key's last change and last change that
    is not a delete; the rows are taken from the changelog by their index (the values are not sorted).
    None when the batch holds a TRUNCATE."""
    ops = changelog.column("_hr_op")
    if pc.any(pc.equal(ops, "T")).as_py():
        return None
    key = ", ".join(quote_ident(k) for k in table.key)
    at = "(_hr_lsn, _hr_seq)"
    con = _connection()
    try:
        con.register("hr_changelog", pa.table({**{k: changelog.column(k) for k in table.key},
                                                "_hr_op": ops, "_hr_lsn": changelog.column("_hr_lsn"),
                                                "_hr_seq": changelog.column("_hr_seq"),
                                                "hr_i": pa.array(range(changelog.num_rows), pa.int64())}))
        picked = _read_all(con.execute(
            f"SELECT arg_max(hr_i, {at}) AS hr_last, arg_max(hr_i, {at}) FILTER (WHERE _hr_op <> 'D') AS hr_live"
            f" FROM hr_changelog GROUP BY {key}").arrow())
    finally:
        con.close()
    live = picked.column("hr_live")
    held = pc.is_valid(live)
    final = changelog.take(pc.filter(picked.column("hr_last"), held))
    values = changelog.take(pc.drop_null(live))
    rows = pa.table({**{c: values.column(c) for c in table.column_names},
                     "_hr_deleted_at": pc.if_else(pc.equal(final.column("_hr_op"), "D"), final.column("_hr_commit_ts"),
                                              pa.nulls(final.num_rows, final.column("_hr_commit_ts").type)),
                     "_hr_commit_ts": final.column("_hr_commit_ts"), "_hr_lsn": final.column("_hr_lsn"), "_hr_seq": final.column("_hr_seq")})
    gone = changelog.take(pc.filter(picked.column("hr_last"), pc.invert(held)))
    deletes = pa.table({**{k: gone.column(k) for k in table.key}, "_hr_lsn": gone.column("_hr_lsn"),
                        "_hr_seq": gone.column("_hr_seq"), "_hr_commit_ts": gone.column("_hr_commit_ts")})
    return rows, deletes


def scd2_arrow(changelog: pa.Table, table: TableSchema) -> tuple[pa.Table, pa.Table] | None:
    """``build.scd2_batch`` for a batch whose changelog (``changelog_arrow``) holds no TRUNCATE, by one
    DuckDB query: every version the batch opens (an ``I`` or ``U`` row, closed by the key's next change
    in the batch, else current) in ``tables.arrow_schema``'s columns, and per key its first change (key
    columns, ``_hr_lsn``, ``_hr_seq``, ``_hr_commit_ts``), which closes the version open before the batch.
    A key change is a ``D`` of the old key and an ``I`` of the new one already. None when the batch holds
    a TRUNCATE."""
    if "T" in changelog.column("_hr_op").to_pylist():
        return None
    key = ", ".join(quote_ident(k) for k in table.key)
    keys = ", ".join(f"{quote_ident(k)}" for k in table.key)
    cols = ", ".join(quote_ident(c) for c in table.column_names)
    order = f"PARTITION BY {key} ORDER BY _hr_lsn, _hr_seq"
    con = _connection()
    try:
        con.register("hr_changelog", changelog)
        versions = _read_all(con.execute(
            f"SELECT {cols}, _hr_commit_ts AS _hr_valid_from, hr_next_ts AS _hr_valid_to,"
            f" hr_next_lsn IS NULL AS _hr_current, _hr_lsn, _hr_seq, hr_next_lsn AS _hr_end_lsn,"
            f" hr_next_seq AS _hr_end_seq FROM (SELECT *, lead(_hr_commit_ts) OVER ({order}) AS hr_next_ts,"
            f" lead(_hr_lsn) OVER ({order}) AS hr_next_lsn, lead(_hr_seq) OVER ({order}) AS hr_next_seq"
            f" FROM hr_changelog) WHERE _hr_op <> 'D'").arrow())
        closes = _read_all(con.execute(
            f"SELECT {keys}, _hr_lsn, _hr_seq, _hr_commit_ts FROM (SELECT *, row_number() OVER ({order}) AS r"
            " FROM hr_changelog) WHERE r = 1").arrow())
    finally:
        con.close()
    return versions, closes


def _read_all(result: pa.Table | pa.RecordBatchReader) -> pa.Table:
    return result if isinstance(result, pa.Table) else result.read_all()


def _cast_error(table: TableSchema, exc: duckdb.Error) -> HistoryCastError:
    message = str(exc)
    at = message.find(FALLBACK_MARKER)
    return HistoryCastError(
        f"table {table.qualified_name}: a staged value the history tables' casts (driver lane) do not"
        f" take ({' '.join(message[max(at, 0):].split())[:200]}); write the table as mirror only"
        " (history.tables) until it is supported")


def changes_of(staged: pa.Table, table: TableSchema, skip_through: Position | None, rules: ValueRules) -> list[Change]:
    """``read_changes`` over staged rows already read (``STAGING_SCHEMA``)."""
    cols = table.columns
    typed = [cast_sql(f"json_extract_string(_data, {literal('$.' + _json_path(c.name))})", c.type, rules, c.name)
             for c in cols]
    old = [cast_sql(f"json_extract_string(_old_key, {literal('$.' + _json_path(c.name))})", c.type, rules, c.name)
           for c in cols if c.name in table.key]
    where = _skip_sql(skip_through)
    select = ", ".join(["_op", "_lsn", "_seq", "_ts", "_xid", "_unchanged_cols", "_old_key IS NOT NULL",
                        "_data IS NOT NULL", *typed, *old])
    con = _connection()
    try:
        con.register("hr_staged", staged)
        rows = tuples(con.execute(f"SELECT {select} FROM hr_staged {where} ORDER BY _lsn, _seq").arrow())
    except duckdb.Error as exc:
        raise _cast_error(table, exc) from exc
    finally:
        con.close()
    tokens = {unchanged_token(c.name): c.name for c in cols}
    key_cols = [c.name for c in cols if c.name in table.key]
    out = []
    n = len(cols)
    for row in rows:
        op, lsn, seq, ts, xid, unch, has_old, has_data = row[:8]
        values = dict(zip(table.column_names, row[8:8 + n], strict=True)) if has_data else {}
        if op == "D" and table.key:
            values = {k: values.get(k) for k in table.key}
        old_key = dict(zip(key_cols, row[8 + n:], strict=True)) if has_old and table.key else None
        unchanged = frozenset(tokens[t] for t in (unch or "").split(",") if t in tokens) if op == "U" else frozenset()
        out.append(Change(op, lsn, seq, ts, xid, values, old_key, unchanged))
    return out


def tuples(result: pa.Table | pa.RecordBatchReader) -> list[tuple[Any, ...]]:
    """A DuckDB result's rows through Arrow (DuckDB's own ``fetchall`` needs pytz for timestamps with
    time zone)."""
    table = result if isinstance(result, pa.Table) else result.read_all()
    return list(zip(*[c.to_pylist() for c in table.columns], strict=True))


def _json_path(name: str) -> str:
    """A JSON path step naming key ``name`` exactly (quoted)."""
    return json.dumps(name)
