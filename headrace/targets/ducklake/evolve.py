"""A DuckLake table's columns changed to follow the source's (``DuckLakeTarget.evolve``), inside the
caller's transaction. Each step checks the table as it stands, so a second run after a crash skips
what is done."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pyarrow as pa

from headrace.core.errors import SchemaChangeError
from headrace.core.names import quote_ident
from headrace.core.rows import POSITION_COLUMNS
from headrace.core.schema import SchemaChange, TableSchema, rename_collision
from headrace.targets.ducklake import plan
from headrace.targets.ducklake.extension import scalar
from headrace.targets.ducklake.types import cast_in, duck_type


def evolve_columns(con: duckdb.DuckDBPyConnection, name: str, new: TableSchema, changes: Sequence[SchemaChange],
                   fills: dict[str, pa.Table]) -> None:
    """Drop, rename, retype and add ``changes``' columns of table ``name`` (qualified); an added column
    with a default fills the older rows from ``fills`` (its value as a one-row Arrow table)."""
    current = {r[0]: r[1] for r in con.execute(f"DESCRIBE {name}").fetchall()}
    for change in changes:
        col = change.column
        if not change.apply or col is None:
            continue
        column = quote_ident(col.name)
        if change.kind == "drop_column" and col.name in current:
            con.execute(f"ALTER TABLE {name} DROP COLUMN {column}")
        elif change.kind == "rename_column" and change.old_name and change.old_name in current:
            if col.name in current:
                raise rename_collision(new, change, name)
            con.execute(f"ALTER TABLE {name} RENAME COLUMN {quote_ident(change.old_name)} TO {column}")
        elif change.kind == "alter_column_type" and col.name in current:
            wanted = scalar(con, f"SELECT typeof(CAST(NULL AS {duck_type(col.type)}))")
            if current[col.name] != wanted:
                con.execute(f"ALTER TABLE {name} ALTER COLUMN {column} SET DATA TYPE {wanted}")
        elif change.kind == "add_column":
            existed = col.name in current
            if not existed:
                con.execute(f"ALTER TABLE {name} ADD COLUMN {column} {duck_type(col.type)}")
            if existed or col.missing is not None:
                # Rows older than the column read PostgreSQL's default for it (NULL if none).
                con.register("hr_default", fills[col.name])
                try:
                    con.execute(
                        f"UPDATE {name} SET {column} = (SELECT {cast_in('v', col.type)} FROM hr_default)"
                    )
                finally:
                    con.unregister("hr_default")


def shape_matches(con: duckdb.DuckDBPyConnection, name: str, table: TableSchema) -> bool:
    """Table ``name`` (qualified) has exactly the columns and types ``table`` maps to."""
    have = [(r[0], r[1]) for r in con.execute(f"DESCRIBE {name}").fetchall()]
    types = [duck_type(c.type) for c in table.columns] + [m.split(" ", 1)[1] for m in plan.META]
    names = [*table.column_names, *POSITION_COLUMNS]
    row = con.execute(f"SELECT {', '.join(f'typeof(CAST(NULL AS {t}))' for t in types)}").fetchone()
    return row is not None and have == list(zip(names, row, strict=True))


def rename_table(con: duckdb.DuckDBPyConnection, lake: str, schema: str, old: TableSchema, new: TableSchema,
                 new_schema: str) -> None:
    """Rename the target table of ``old`` in ``schema`` to follow the source (``new``, whose target
    schema is ``new_schema``), unless done already."""
    if schema != new_schema:
        raise SchemaChangeError(
            f"{old.qualified_name} moved to {new.qualified_name}: DuckLake renames tables only within a"
            " schema; set schema_changes.rename_table: keep and restart, or set target.ducklake.schema"
        )
    exists = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND schema_name = ?"
                         " AND table_name = ?", [lake, schema, old.target_table]).fetchone()
    if exists and exists[0]:
        con.execute(f"ALTER TABLE {quote_ident(lake)}.{quote_ident(schema)}.{quote_ident(old.target_table)} RENAME TO"
                    f" {quote_ident(new.target_table)}")
