"""Change batches read, deduplicated and cast by DuckDB on the driver: no Spark job.

A Spark batch costs about half a second of jobs and JVM round trips whatever its size; for a batch of
a few hundred staged rows that is nearly all of its cost, and up to a few hundred thousand rows DuckDB
on the driver is still faster than Spark on two cores. A target that takes Arrow batches
(``Target.applies_arrow``: DuckLake, which applies in DuckDB anyway, and Iceberg, which hands the
batch to one MERGE as a local relation) gets batches of up to its driver bound
(``apply.driver_batch_rows``) built here instead: the same Arrow
table ``read_change_batch`` followed by ``toArrow`` gives (same columns, types and values), from the
staged files read with pyarrow and one DuckDB query.

The query is ``headrace.engines.spark.batch`` written in SQL: the same order of changes (commit LSN,
ordinal, sub-ordinal), key changes split into a delete of the old key and the new row, the last
change per key kept, TOAST columns left unchanged filled from the latest earlier change in the batch
that sent them. Casts: ``headrace.engines.driver.casts``.

``materialize.lanes.batch_build_lane`` says from the batch's facts which batches stay on Spark (too
big, no facts registered, a key change that left TOAST columns unchanged, a floating-point key, a
keyless table with a floating-point column or an update without its old row); a batch whose values the casts here do not take (``NotOnLane``) goes to Spark too, which casts
them or stops the table with its message. Every value the driver writes is one Spark would have written.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pyarrow as pa

from headrace.core.batch import ChangeBatch
from headrace.core.lanes import Lane, NotOnLane
from headrace.core.names import quote_ident
from headrace.core.position import Position
from headrace.core.rows import HR_COMMIT_TS, HR_LSN, HR_OP, HR_SEQ, HR_UNCHANGED, unchanged_token
from headrace.core.schema import TableSchema
from headrace.core.spark_types import ValueRules
from headrace.engines.driver.casts import FALLBACK_MARKER, arrow_type, cast_sql, connection, literal
from headrace.log.codec import STAGING_SCHEMA, read_staging_file
from headrace.log.facts import FileFacts, total

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
        old_keys = staged.column("_old_key").null_count < staged.num_rows
        sql = batch_sql(table, skip_through, truncate, rules, known.unchanged, old_keys) if table.key else \
            row_images(table, skip_through, truncate, rules)
        result = con.execute(sql).arrow()
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
    """The Arrow schema of a batch as Spark's ``toArrow`` gives it (nullability aside)."""
    fields = [pa.field(c.name, arrow_type(c.type)) for c in table.columns]
    fields += [pa.field(HR_LSN, pa.int64()), pa.field(HR_SEQ, pa.int64()),
               pa.field(HR_COMMIT_TS, pa.timestamp("us", tz="UTC")), pa.field(HR_OP, pa.string()),
               pa.field(HR_UNCHANGED, pa.string())]
    return pa.schema(fields)


# The change rules, each one function under the same name in ``engines.spark.batch`` (compared by
# ``tests/engines/test_rules.py``): ``change_order``, ``after_position``, ``key_changes``,
# ``last_change_per_key``, ``toast_fill``, each a part of the one query ``batch_sql`` builds, and for
# a table without a key ``row_images`` (and ``engines.driver.keyless.net_row_changes``).


def change_order() -> list[str]:
    """The order of a batch's changes: commit position, ordinal in the transaction, then the two
    halves of a key change (the old key's delete, ``sub`` 0, before the new row, 1)."""
    return ["_lsn", "_seq", "sub"]


def after_position(pos: Position) -> str:
    """Changes strictly after ``pos`` (compared as (commit position, ordinal))."""
    return f"(_lsn > {pos.lsn} OR (_lsn = {pos.lsn} AND _seq > {pos.seq}))"


def key_changes(source: str, old_keys: bool = True) -> str:
    """One row per change of ``source`` with ``sub``, ``op``, ``v`` (the row's column -> text map) and
    ``unch``: an update with ``_old_key`` also yields a delete of the old key just before it.
    ``old_keys``: some staged change has an ``_old_key``; without one the second half is left out, which
    DuckDB would otherwise pay for with a second read of every change's JSON (0.61 -> 0.35 s for 200K
    updates of a 7-column row)."""
    changes = f"""
  SELECT _lsn, _seq, _ts, 1 AS sub, _op AS op, d AS v, CASE WHEN _op = 'D' THEN NULL ELSE _unchanged_cols END AS unch
  FROM {source}"""
    if not old_keys:
        return changes
    return changes + f"""
  UNION ALL
  SELECT _lsn, _seq, _ts, 0 AS sub, 'D' AS op, ok AS v, NULL AS unch FROM {source} WHERE _op = 'U' AND _old_key IS NOT NULL"""


def toast_fill(table: TableSchema, by_key: str) -> tuple[str, dict[str, str], list[str]]:
    """A TOAST column an update left unchanged takes its value from the latest earlier change of the
    same key in the batch that sent it: the window columns to add, each column's value expression,
    and the TOAST tokens still unchanged (the target keeps its row's value)."""
    order = ", ".join(change_order())
    parts, values, still = [], {}, []
    for i, c in enumerate(table.columns):
        if c.name in table.key:
            continue
        # What each change says about the column: a value (in a struct, so a sent NULL counts)
        # unless it left the column unchanged; the latest such statement up to the change.
        unchanged = f"list_contains(string_split(coalesce(unch, ''), ','), {literal(unchanged_token(c.name))})"
        parts.append(f"{unchanged} AS u{i}, last_value(CASE WHEN NOT {unchanged} THEN struct_pack(v := c{i}) END "
                     f"IGNORE NULLS) OVER (PARTITION BY {by_key} ORDER BY {order} ROWS BETWEEN UNBOUNDED "
                     f"PRECEDING AND CURRENT ROW) AS s{i}")
        values[c.name] = f"CASE WHEN u{i} THEN s{i}.v ELSE c{i} END"
        still.append(f"CASE WHEN u{i} AND s{i} IS NULL THEN {literal(unchanged_token(c.name))} END")
    return ", ".join(parts), values, still


def last_change_per_key(typed: str, table: TableSchema, has_unchanged: bool) -> str:
    """The last change per key of ``typed`` (its values cast, as ``c<i>``), TOAST columns filled
    (``toast_fill``), in the Target row shape."""
    by_key = ", ".join(f"c{table.column_names.index(k)}" for k in table.key)
    order = f"[{', '.join(change_order())}]"
    values = {c.name: f"c{i}" for i, c in enumerate(table.columns)}
    still: list[str] = []
    toast = ""
    if has_unchanged:
        toast, filled, still = toast_fill(table, by_key)
        toast, values = ", " + toast, {**values, **filled}
    out = []
    for i, c in enumerate(table.columns):
        value = f"c{i}" if c.name in table.key else f"CASE WHEN op = 'D' THEN NULL ELSE {values[c.name]} END"
        out.append(f"{value} AS {quote_ident(c.name)}")
    remaining = f"concat_ws(',', {', '.join(still)})" if still else "''"
    out += [f"_lsn AS {HR_LSN}", f"_seq AS {HR_SEQ}", f"_ts AS {HR_COMMIT_TS}", f"op AS {HR_OP}",
            f"CASE WHEN op = 'D' OR {remaining} = '' THEN NULL ELSE {remaining} END AS {HR_UNCHANGED}"]
    return f"""SELECT {', '.join(out)} FROM (
  SELECT *, max({order}) OVER (PARTITION BY {by_key}) AS hr_last{toast} FROM {typed}
) WHERE {order} = hr_last"""


def batch_sql(table: TableSchema, skip_through: Position | None, truncate: Position | None, rules: ValueRules,
              has_unchanged: bool, old_keys: bool = True) -> str:
    """The query over ``hr_staged`` (the staged rows) giving the batch in the Target row shape.

    Every staged value after the skip point is cast, also those a later change or a truncate in
    the batch supersedes: a value the fast casts do not take then sends the batch to Spark, which
    also keeps ``values.infinity: clamp``'s counts (over every staged value) exact. ``old_keys``: some
    staged change carries an ``_old_key`` (``key_changes``).
    """
    skip = f" AND {after_position(skip_through)}" if skip_through is not None else ""
    typed = ", ".join(
        f"{cast_sql(f'v[{literal(c.name)}]', c.type, rules, c.name)} AS c{i}" for i, c in enumerate(table.columns))
    after_truncate = f" WHERE {after_position(truncate)}" if truncate is not None else ""
    return f"""
WITH s AS (
  SELECT _op, _lsn, _seq, _ts, _unchanged_cols, _old_key,
         json_transform(_data, {_MAP}) AS d, json_transform(_old_key, {_MAP}) AS ok
  FROM hr_staged WHERE _op <> 'T'{skip}
), split AS ({key_changes("s", old_keys)}
), typed AS (
  SELECT _lsn, _seq, _ts, sub, op, unch, {typed} FROM split
)
{last_change_per_key(f"(SELECT * FROM typed{after_truncate})", table, has_unchanged)}
"""


def row_images(table: TableSchema, skip_through: Position | None, truncate: Position | None, rules: ValueRules) -> str:
    """A keyless table's changes as row images added (``I``) or removed (``D``), cast, not deduplicated
    (``engines.spark.keyless``): an update removes its old row (staged whole in ``_old_key``) and adds
    its new one at the change's position; a delete removes the row staged in ``_data``."""
    skip = f" AND {after_position(skip_through)}" if skip_through is not None else ""
    after_truncate = f" AND {after_position(truncate)}" if truncate is not None else ""
    typed = ", ".join(f"{cast_sql(f'v[{literal(c.name)}]', c.type, rules, c.name)} AS {quote_ident(c.name)}"
                      for c in table.columns)
    return f"""
WITH s AS (
  SELECT _op, _lsn, _seq, _ts, json_transform(_data, {_MAP}) AS d, json_transform(_old_key, {_MAP}) AS ok
  FROM hr_staged WHERE _op <> 'T'{skip}{after_truncate}
), images AS (
  SELECT _lsn, _seq, _ts, CASE WHEN _op = 'D' THEN 'D' ELSE 'I' END AS op, d AS v FROM s
  UNION ALL
  SELECT _lsn, _seq, _ts, 'D' AS op, ok AS v FROM s WHERE _op = 'U'
)
SELECT {typed}, _lsn AS {HR_LSN}, _seq AS {HR_SEQ}, _ts AS {HR_COMMIT_TS}, op AS {HR_OP},
       NULL::VARCHAR AS {HR_UNCHANGED}
FROM images
"""
