"""The queries docs/history.md gives users, in DuckDB SQL: the state as of a moment from an scd2 table,
and from a changelog replayed up to it. The tests run these very strings, so the page cannot drift.

``{table}`` is the history table's name, ``{columns}`` the source columns to return, ``{key}`` the
key columns (comma-separated), ``$1`` the moment (a TIMESTAMPTZ). Rows from the initial copy have no
commit time (NULL): they count as being there since before any moment.
"""

from __future__ import annotations

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
