"""Change batches read, deduplicated and cast by DuckDB on the driver: no Spark job.

A Spark batch costs about half a second of jobs and JVM round trips whatever its size; for a batch of
a few hundred staged rows that is nearly all of its cost, and up to a few hundred thousand rows DuckDB
on the driver is still faster than Spark on two cores. A target that takes Arrow batches
(``Target.applies_arrow``: DuckLake, which applies in DuckDB anyway, and Iceberg, which hands the
batch to one MERGE as a local relation) gets batches of up to its driver bound
(``apply.driver_batch_rows``) built here instead: the same Arrow
table ``read_change_batch`` followed by ``toArrow`` gives (same columns, types and values), from the
staged files read with pyarrow and one DuckDB query.

The query is ``headrace.materialize.batch`` written in SQL: the same order of changes (commit LSN,
ordinal, sub-ordinal), key changes split into a delete of the old key and the new row, the last
change per key kept, TOAST columns left unchanged filled from the latest earlier change in the batch
that sent them. Casts: ``headrace.materialize.driver_casts``.

``materialize.lanes.batch_build_lane`` says from the batch's facts which batches stay on Spark (too
big, no facts registered, no key, a key change that left TOAST columns unchanged, a floating-point
key); a batch whose values the casts here do not take (``NotOnLane``) goes to Spark too, which casts
them or stops the table with its message. Every value the driver writes is one Spark would have written.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pyarrow as pa

from headrace.core.lanes import Lane, NotOnLane
from headrace.core.names import quote_ident
from headrace.core.position import Position
from headrace.core.rows import HR_COMMIT_TS, HR_LSN, HR_OP, HR_SEQ, HR_UNCHANGED, unchanged_token
from headrace.core.schema import TableSchema
from headrace.core.spark_types import ValueRules
from headrace.log.codec import STAGING_SCHEMA, read_staging_file
from headrace.log.facts import FileFacts, total
from headrace.materialize.batch import ChangeBatch
from headrace.materialize.driver_casts import (
    FALLBACK_MARKER,
    arrow_type,
    cast_sql,
    connection,
    literal,
)

_MAP = "'\"MAP(VARCHAR, VARCHAR)\"'"  # json_transform's target: the row's column -> text map


def read_driver_batch(paths: Sequence[str], table: TableSchema, skip_through: Position | None,
                      rules: ValueRules, facts: Sequence[FileFacts | None]) -> ChangeBatch:
    """The ``ChangeBatch`` of ``paths`` with ``changes`` as an Arrow table (see the module docstring).

    Call only when ``lanes.batch_build_lane`` chose the driver. Raises ``NotOnLane`` when a value needs Spark.
    Under ``values.infinity: clamp`` nothing is clamped here (a value that would be is outside the
    fast forms and falls back), so ``values_changed`` is empty.
    """
    known = total(f for f in facts if f is not None)
    truncate = known.last_truncate
    if truncate is not None and skip_through is not None and truncate <= skip_through:
        truncate = None  # the truncate is in the copy already
    staged = pa.concat_tables([read_staging_file(p) for p in paths]) if paths else STAGING_SCHEMA.empty_table()
    con = connection()
    con.register("hr_staged", staged)
    try:
        result = con.execute(batch_sql(table, skip_through, truncate, rules, known.unchanged)).arrow()
        changes = result if isinstance(result, pa.Table) else result.read_all()
    except duckdb.Error as exc:
        message = str(exc)
        at = message.find(FALLBACK_MARKER)  # the casts' own reason, else DuckDB's whole message
        raise NotOnLane(" ".join(message[max(at, 0):].split())[:300]) from exc
    finally:
        con.unregister("hr_staged")
    return ChangeBatch(changes=changes.cast(batch_schema(table)), truncate_before=truncate, rows_in=known.rows,
                       values_changed={}, lane=Lane.DRIVER)


def batch_schema(table: TableSchema) -> pa.Schema:
    """The Arrow schema of a keyed table's batch as Spark's ``toArrow`` gives it (nullability aside)."""
    fields = [pa.field(c.name, arrow_type(c.type)) for c in table.columns]
    fields += [pa.field(HR_LSN, pa.int64()), pa.field(HR_SEQ, pa.int64()),
               pa.field(HR_COMMIT_TS, pa.timestamp("us", tz="UTC")), pa.field(HR_OP, pa.string()),
               pa.field(HR_UNCHANGED, pa.string())]
    return pa.schema(fields)


def _after(pos: Position) -> str:
    return f"(_lsn > {pos.lsn} OR (_lsn = {pos.lsn} AND _seq > {pos.seq}))"


def batch_sql(table: TableSchema, skip_through: Position | None, truncate: Position | None, rules: ValueRules,
              has_unchanged: bool) -> str:
    """The query over ``hr_staged`` (the staged rows) giving the batch in the Target row shape.

    Every staged value after the skip point is cast, also those a later change or a truncate in
    the batch supersedes: a value the fast casts do not take then sends the batch to Spark, which
    also keeps ``values.infinity: clamp``'s counts (over every staged value) exact.
    """
    cols = list(table.columns)
    skip = f" AND {_after(skip_through)}" if skip_through is not None else ""
    typed = ", ".join(
        f"{cast_sql(f'v[{literal(c.name)}]', c.type, rules, c.name)} AS c{i}" for i, c in enumerate(cols))
    key_at = [f"c{table.column_names.index(k)}" for k in table.key]
    by_key = ", ".join(key_at)
    order = "_lsn, _seq, sub"
    values = {c.name: f"c{i}" for i, c in enumerate(cols)}
    stills: list[str] = []
    toast = ""
    if has_unchanged:
        # What each change says about a non-key column: a value (in a struct, so a sent NULL
        # counts) unless it left the column unchanged; the latest such statement up to the change.
        parts = []
        for i, c in enumerate(cols):
            if c.name in table.key:
                continue
            unchanged = f"list_contains(string_split(coalesce(unch, ''), ','), {literal(unchanged_token(c.name))})"
            parts.append(f"{unchanged} AS u{i}, last_value(CASE WHEN NOT {unchanged} THEN struct_pack(v := c{i}) END "
                         f"IGNORE NULLS) OVER (PARTITION BY {by_key} ORDER BY {order} ROWS BETWEEN UNBOUNDED "
                         f"PRECEDING AND CURRENT ROW) AS s{i}")
            values[c.name] = f"CASE WHEN u{i} THEN s{i}.v ELSE c{i} END"
            stills.append(f"CASE WHEN u{i} AND s{i} IS NULL THEN {literal(unchanged_token(c.name))} END")
        toast = ", " + ", ".join(parts)
    after_truncate = f"WHERE {_after(truncate)}" if truncate is not None else ""
    out = []
    for i, c in enumerate(cols):
        value = f"c{i}" if c.name in table.key else f"CASE WHEN op = 'D' THEN NULL ELSE {values[c.name]} END"
        out.append(f"{value} AS {quote_ident(c.name)}")
    remaining = f"concat_ws(',', {', '.join(stills)})" if stills else "''"
    out += [f"_lsn AS {HR_LSN}", f"_seq AS {HR_SEQ}", f"_ts AS {HR_COMMIT_TS}", f"op AS {HR_OP}",
            f"CASE WHEN op = 'D' OR {remaining} = '' THEN NULL ELSE {remaining} END AS {HR_UNCHANGED}"]
    return f"""
WITH s AS (
  SELECT _op, _lsn, _seq, _ts, _unchanged_cols, _old_key,
         json_transform(_data, {_MAP}) AS d, json_transform(_old_key, {_MAP}) AS ok
  FROM hr_staged WHERE _op <> 'T'{skip}
), split AS (
  SELECT _lsn, _seq, _ts, 1 AS sub, _op AS op, d AS v, CASE WHEN _op = 'D' THEN NULL ELSE _unchanged_cols END AS unch
  FROM s
  UNION ALL
  SELECT _lsn, _seq, _ts, 0 AS sub, 'D' AS op, ok AS v, NULL AS unch FROM s WHERE _op = 'U' AND _old_key IS NOT NULL
), typed AS (
  SELECT _lsn, _seq, _ts, sub, op, unch, {typed} FROM split
), kept AS (
  SELECT *, max([_lsn, _seq, sub]) OVER (PARTITION BY {by_key}) AS hr_last{toast}
  FROM (SELECT * FROM typed {after_truncate})
)
SELECT {', '.join(out)} FROM kept WHERE [_lsn, _seq, sub] = hr_last
"""
