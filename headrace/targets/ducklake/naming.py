"""DuckDB (and so DuckLake) matches names case-insensitively: two source tables, or two columns,
whose names differ only in case cannot both live in one lake. Refused with the fix, before DuckDB
would take one for the other or fail on a catalog error."""

from __future__ import annotations

import duckdb

from headrace.core.errors import UnsupportedError
from headrace.core.names import TableName, display_ident
from headrace.core.schema import TableSchema


def refuse_table_twin(con: duckdb.DuckDBPyConnection, lake: str, schema: str, table: TableSchema) -> bool:
    """Refuse ``table`` (lake table ``schema``.its target name) when the lake ``lake`` has a table whose
    name matches but for case: DuckDB would take one for the other and mix two source tables' rows.
    True when the table itself exists."""
    name = table.target_table
    # From DuckLake's own catalog tables: duckdb_tables() rebuilds every table's entry after each
    # commit (1.4 s at 200 tables on a busy 2-core machine, against 4 ms here), once per copied table.
    meta = f"__ducklake_metadata_{lake}"
    exists = False
    for have_schema, have_name in con.execute(
            f"SELECT s.schema_name, t.table_name FROM {meta}.ducklake_table t JOIN {meta}.ducklake_schema s"
            " ON s.schema_id = t.schema_id WHERE t.end_snapshot IS NULL AND s.end_snapshot IS NULL"
            " AND lower(s.schema_name) = lower(?) AND lower(t.table_name) = lower(?)", [schema, name]).fetchall():
        exists |= (have_schema, have_name) == (schema, name)
        if (have_schema, have_name) != (schema, name):
            raise UnsupportedError(
                f"table {table.qualified_name} would be DuckLake table {TableName(schema, name)}, but the lake"
                f" has {TableName(have_schema, have_name)}, a name that differs only in case: DuckDB names are"
                " case-insensitive; replicate only one of the two tables to this lake (remove"
                f" {table.qualified_name} from the pipeline), or rename one in the source")
    return exists


def refuse_case_twins(table: TableSchema) -> None:
    """DuckDB (and so DuckLake) matches names case-insensitively: columns "ID" and "id" cannot live
    in one table. Refuse such a table with the fix rather than fail on a DuckDB catalog error."""
    seen: dict[str, str] = {}
    for name in table.column_names:
        twin = seen.setdefault(name.lower(), name)
        if twin != name:
            raise UnsupportedError(
                f"table {table.qualified_name} has columns {display_ident(twin)} and {display_ident(name)}, which"
                " differ only in case: DuckLake (DuckDB) names are case-insensitive and cannot hold both;"
                f" rename one in the source (ALTER TABLE {table.qualified_name} RENAME COLUMN"
                f" {display_ident(name)} TO <new name>) and resync the table, or replicate it to Iceberg")
