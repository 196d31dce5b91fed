"""The queries docs/history.md gives users, in DuckDB SQL: the state as of a moment from an scd2 table,
and from a changelog replayed up to it. The tests run these very strings, so the page cannot drift.
Below them, the rules both targets' history writers run in their own dialects (``written_before``,
``rows_now``), spelled once.

``{table}`` is the history table's name, ``{columns}`` the source columns to return, ``{key}`` the
key columns (comma-separated), ``$1`` the moment (a TIMESTAMPTZ). Rows from the initial copy have no
commit time (NULL): they count as being there since before any moment.
"""

from __future__ import annotations

from collections.abc import Callable

from headrace.core.schema import TableSchema
from headrace.history import build as b
from headrace.history.config import Mode

SCD2_AS_OF = """
SELECT {columns} FROM {table}
WHERE coalesce(_hr_valid_from, '-infinity'::TIMESTAMPTZ) <= $1
  AND (_hr_valid_to IS NULL OR _hr_valid_to > $1)
"""

CHANGELOG_AS_OF = """
WITH upto AS (
  SELECT *, row_number() OVER (ORDER BY _hr_lsn, _hr_seq, _hr_op <> 'D') AS n  -- a key change: D, then I
  FROM {table} WHERE coalesce(_hr_commit_ts, '-infinity'::TIMESTAMPTZ) <= $1
), since AS (  -- changes after the last TRUNCATE up to the moment
  SELECT * FROM upto WHERE n > (SELECT coalesce(max(n), 0) FROM upto WHERE _hr_op = 'T')
), latest AS (
  SELECT *, row_number() OVER (PARTITION BY {key} ORDER BY n DESC) AS r FROM since
)
SELECT {columns} FROM latest WHERE r = 1 AND _hr_op <> 'D'
"""

CHANGELOG_BETWEEN = """
SELECT _hr_op, _hr_commit_ts, {columns} FROM {table}
WHERE _hr_commit_ts > $1 AND _hr_commit_ts <= $2
ORDER BY _hr_lsn, _hr_seq, _hr_op <> 'D'
"""

# Spark SQL (Iceberg): the same queries; ``{moment}`` a timestamp literal, e.g. TIMESTAMP '2026-11-27 06:00:00+00:00'.
SCD2_AS_OF_SPARK = """
SELECT {columns} FROM {table}
WHERE coalesce(_hr_valid_from, TIMESTAMP '0001-01-01 00:00:00+00:00') <= {moment}
  AND (_hr_valid_to IS NULL OR _hr_valid_to > {moment})
"""

CHANGELOG_AS_OF_SPARK = """
WITH upto AS (
  SELECT *, row_number() OVER (ORDER BY _hr_lsn, _hr_seq, _hr_op <> 'D') AS n
  FROM {table} WHERE coalesce(_hr_commit_ts, TIMESTAMP '0001-01-01 00:00:00+00:00') <= {moment}
), since AS (
  SELECT * FROM upto WHERE n > (SELECT coalesce(max(n), 0) FROM upto WHERE _hr_op = 'T')
), latest AS (
  SELECT *, row_number() OVER (PARTITION BY {key} ORDER BY n DESC) AS r FROM since
)
SELECT {columns} FROM latest WHERE r = 1 AND _hr_op <> 'D'
"""


def written_before(row: str, change: str) -> str:
    """SQL, in both targets' dialects: the row aliased ``row`` was written before the change aliased
    ``change`` (by position)."""
    return f"({row}.{b.LSN} < {change}.{b.LSN} OR ({row}.{b.LSN} = {change}.{b.LSN} AND {row}.{b.SEQ} < {change}.{b.SEQ}))"


def rows_now(table: TableSchema, mode: Mode, name: str, quote: Callable[[str], str]) -> str:
    """The rows of the history table ``name`` (``table`` written in ``mode`` under its own name) that are
    the source's rows now, as one SELECT both targets' dialects run (``quote``: the dialect's quoting of
    a column name): scd2's open versions, soft_delete's live rows, and a changelog's last change per key
    after its last TRUNCATE, unless a delete."""
    if mode == "scd2":
        return f"SELECT * FROM {name} WHERE {b.CURRENT}"
    if mode == "soft_delete":
        return f"SELECT * FROM {name} WHERE {b.DELETED_AT} IS NULL"
    keys = ", ".join(quote(k) for k in table.key)
    truncated_after = f"EXISTS (SELECT 1 FROM {name} t WHERE t.{b.OP} = 'T' AND {written_before('c', 't')})"
    return (f"SELECT * FROM (SELECT c.*, row_number() OVER (PARTITION BY {keys} ORDER BY c.{b.LSN} DESC,"
            f" c.{b.SEQ} DESC) AS hr_r FROM {name} c WHERE c.{b.OP} <> 'T' AND NOT {truncated_after})"
            f" WHERE hr_r = 1 AND {b.OP} <> 'D'")
