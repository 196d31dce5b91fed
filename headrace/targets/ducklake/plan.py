"""The SQL a DuckLake apply runs: table DDL, the plan joining a batch to the target rows of its keys,
and the statements that apply a plan or a keyless table's net row changes.

Every statement reads the batch DuckDB sees as ``hr_batch`` (and the plan as ``hr_planned``);
``target`` is the table's qualified, quoted name in the lake. The rules a change follows
(``written_before_sql``, ``left_unchanged_sql``) are Iceberg's too when it applies a batch on the
driver (``targets/iceberg/driver_apply``).
"""

from __future__ import annotations

from headrace.core.names import quote_ident
from headrace.core.rows import (
    HR_COMMIT_TS,
    HR_DELTA,
    HR_FROM,
    HR_LSN,
    HR_OP,
    HR_SEQ,
    HR_UNCHANGED,
    POSITION_COLUMNS,
    unchanged_token,
)
from headrace.core.schema import TableSchema
from headrace.engines.driver.key_rows import IDX
from headrace.targets.ducklake.types import cast_in, duck_type

META = (f"{HR_LSN} BIGINT", f"{HR_SEQ} BIGINT", f"{HR_COMMIT_TS} TIMESTAMPTZ")  # the position columns' types


def literal(text: str) -> str:
    """A DuckDB string literal."""
    return "'" + text.replace("'", "''") + "'"


def written_before_sql(row: str, change: str) -> str:
    """The target row aliased ``row`` was written before the change aliased ``change`` (by position):
    only then does the change replace or delete it, which makes a replayed batch change nothing."""
    return (f"({row}.{HR_LSN} < {change}.{HR_LSN} OR "
            f"({row}.{HR_LSN} = {change}.{HR_LSN} AND {row}.{HR_SEQ} < {change}.{HR_SEQ}))")


def left_unchanged_sql(change: str, column: str) -> str:
    """The change aliased ``change`` left TOAST column ``column`` unchanged (its ``_hr_unchanged`` list
    names it): the row keeps the value the target holds."""
    return (f"list_contains(string_split(coalesce({change}.{HR_UNCHANGED}, ''), ','), "
            f"{literal(unchanged_token(column))})")


def create_sql(target: str, table: TableSchema) -> str:
    """``CREATE TABLE``: the source columns in their DuckDB types, then the position columns."""
    cols = [f"{quote_ident(c.name)} {duck_type(c.type)}" for c in table.columns]
    return f"CREATE TABLE {target} ({', '.join(cols + list(META))})"


def plan_sql(target: str, table: TableSchema, key: tuple[str, ...], moved: bool = False,
             kept_columns: list[str] | None = None, unchanged: bool = True, known: bool = False) -> str:
    """Batch rows cast to target types, joined to the current target row of the same key.

    ``known``: the target rows of the batch's keys are ``hr_known`` (``kept_keys``: key, ``rowid``,
    positions and each row's number in the index, ``hr_old_idx``), joined instead of the table.

    ``unchanged``: some change of the batch leaves a TOAST column unchanged, which then keeps the
    target row's value. Without it (and without ``moved`` or ``kept_columns``) the plan reads only
    the target's key and position columns: the scan it pays for every batch reads less of the table.

    ``moved``: the batch has ``_hr_from`` (rows whose key changed, leaving TOAST columns
    unchanged): those take the unchanged values from the old key's target row instead.
    ``kept_columns``: columns dropped in the source but kept in the target; a new version of a row
    carries the old version's values there (what an UPDATE of the other columns would do).
    """
    eq = "=" if table.key else "IS NOT DISTINCT FROM"
    join = " AND ".join(
        f"o.{quote_ident(k)} {eq} {cast_in('b.' + quote_ident(k), table.column(k).type)}" for k in key
    )
    from_join = ""
    if moved:
        on = " AND ".join(
            f"f.{quote_ident(k)} = {cast_in(f'struct_extract(b.{HR_FROM}, {literal(k)})', table.column(k).type)}"
            for k in key
        )
        from_join = f" LEFT JOIN {target} f ON {on}"
    select = []
    for col in table.columns:
        new = cast_in(f"b.{quote_ident(col.name)}", col.type)
        if col.name not in key and (unchanged or moved):
            # A TOAST column the update did not send keeps the value already in the target.
            kept = f"o.{quote_ident(col.name)}"
            if moved:
                kept = f"CASE WHEN b.{HR_FROM} IS NOT NULL THEN f.{quote_ident(col.name)} ELSE {kept} END"
            new = f"CASE WHEN {left_unchanged_sql('b', col.name)} THEN {kept} ELSE {new} END"
        select.append(f"{new} AS {quote_ident(col.name)}")
    select += [f"o.{quote_ident(k)} AS {quote_ident(k)}" for k in kept_columns or ()]
    older = written_before_sql("o", "b")
    if known:
        select.append(f"o.{IDX} AS hr_old_idx")
    return (
        f"SELECT {', '.join(select)}, b.{HR_LSN}, b.{HR_SEQ}, b.{HR_COMMIT_TS}, b.{HR_OP}, "
        f"o.rowid AS hr_old_rowid, coalesce(o.rowid IS NOT NULL AND {older}, false) AS hr_older, "
        f"coalesce(o.rowid IS NOT NULL AND NOT {older}, false) AS hr_stale "
        f"FROM hr_batch b LEFT JOIN {'hr_known' if known else target} o ON {join}{from_join}"
    )


def insert_planned_sql(target: str, table: TableSchema, kept_columns: list[str]) -> str:
    """Insert the new versions of the plan's rows (not deletes, not stale changes)."""
    cols = [quote_ident(c.name) for c in table.columns] + list(POSITION_COLUMNS)
    values = [f"CAST({quote_ident(c.name)} AS {duck_type(c.type)})" for c in table.columns]
    values += list(POSITION_COLUMNS)
    cols += [quote_ident(k) for k in kept_columns]
    values += [quote_ident(k) for k in kept_columns]
    return (f"INSERT INTO {target} ({', '.join(cols)}) SELECT {', '.join(values)} "
            f"FROM hr_planned WHERE {HR_OP} <> 'D' AND NOT hr_stale")


def net_delete_sql(target: str, table: TableSchema) -> str:
    """Remove the copies a keyless batch removes: for a row removed n times, its n oldest copies."""
    same = " AND ".join(
        f"o.{quote_ident(c.name)} IS NOT DISTINCT FROM {cast_in('b.' + quote_ident(c.name), c.type)}"
        for c in table.columns
    )
    return (
        f"DELETE FROM {target} WHERE rowid IN (SELECT hr_rowid FROM ("
        f"SELECT o.rowid AS hr_rowid, b.{HR_DELTA} AS hr_delta, row_number() OVER "
        f"(PARTITION BY b.hr_row ORDER BY o.{HR_LSN}, o.{HR_SEQ}, o.rowid) AS hr_nth "
        f"FROM (SELECT *, row_number() OVER () AS hr_row FROM hr_batch WHERE {HR_DELTA} < 0) b "
        f"JOIN {target} o ON {same}) WHERE hr_nth <= -hr_delta)"
    )


def net_insert_sql(target: str, table: TableSchema) -> str:
    """Add the copies a keyless batch adds (each ``+1`` row is one more copy)."""
    cols = [quote_ident(c.name) for c in table.columns] + list(POSITION_COLUMNS)
    values = [f"CAST({cast_in(quote_ident(c.name), c.type)} AS {duck_type(c.type)})" for c in table.columns]
    return (f"INSERT INTO {target} ({', '.join(cols)}) SELECT {', '.join(values + list(POSITION_COLUMNS))} "
            f"FROM hr_batch WHERE {HR_DELTA} > 0")


def insert_from_parquet_sql(target: str, table: TableSchema) -> str:
    """Copy Spark's snapshot files (``read_parquet(?)``) into the table with DuckDB's casts."""
    values = [cast_in(quote_ident(c.name), c.type) for c in table.columns] + list(POSITION_COLUMNS)
    return f"INSERT INTO {target} SELECT {', '.join(values)} FROM read_parquet(?)"


def insert_from_relation_sql(target: str, table: TableSchema, relation: str) -> str:
    """``insert_from_parquet_sql``'s casts from a relation DuckDB knows by name (registered Arrow rows
    in the row shape), columns by name."""
    values = [cast_in(quote_ident(c.name), c.type) for c in table.columns] + list(POSITION_COLUMNS)
    return f"INSERT INTO {target} SELECT {', '.join(values)} FROM {relation}"
