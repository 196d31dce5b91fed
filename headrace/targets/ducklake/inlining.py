"""Small batches' rows kept in the catalog (DuckLake's data inlining) and flushed to Parquet in bulk.

Without it, each change batch commits a Parquet file of its inserted rows and a delete file, and every
later batch's plan and delete read all of them until a maintenance pass compacts the table (at most
every ``maintenance.max_batches`` batches). A busy table taking a batch or two a second then pays more
for each batch the longer it runs: 10 tables of 2,000 rows taking batches of 40 updates (a micro bench
of ``apply_arrow_batch`` alone, idle machine) went from a 13.7 ms plan and 9.9 ms delete to 31.8 ms and
24.5 ms within 150 batches a table; with ``target.ducklake.inline_rows`` at 1,000 they stayed at 12.7-15.0
ms and 8.1-9.8 ms. The connection's DuckLake default is set to that limit (``extension.attach``), so
DuckLake writes an insert of at most that many rows, and a delete of at most that many rows of one data
file, into the catalog's inlined tables; readers see them as any other rows.

A copy never inlines (``Inlined.allow``): a table's first inlined write creates its inlined-data table
in the catalog, which made the commit of a 1,000-row copy of a new table 3.5x dearer (22 -> 77 ms, a
DuckDB catalog, idle machine), and copies commit one after another under the target's lock: 200 tables of
1,000 rows took 28.4 s to STREAMING instead of 12.4 s (``bench/initial_copy.py --small-tables 200``).

Inlined rows are read by every scan of the table (from a PostgreSQL catalog, over the wire), so they
are not left to grow: once about ``FLUSH_ROWS`` rows of a table went in by small batches, the commit
path writes them out as one Parquet file (``ducklake_flush_inlined_data``), and every maintenance pass
does the same first (``maintenance._pass``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import duckdb

from headrace.logs import event

log = logging.getLogger("headrace.targets.ducklake.inlining")

FLUSH_ROWS = 50_000  # a table's rows inlined since its last flush, past which the next commit flushes them


class Inlined:
    """Rows each table took through inlined writes since its last flush (used under the target's lock)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._rows: dict[tuple[str, str], int] = {}
        self._set: int | None = None  # the connection's limit as last set here

    def allow(self, con: duckdb.DuckDBPyConnection, inline: bool) -> None:
        """The limit for the connection's next writes: ``limit`` (``inline``), else 0 (a copy). The lake is
        attached without one of its own, so DuckLake reads the connection's default at each write."""
        want = self.limit if inline else 0
        if want != self._set:
            con.execute(f"SET ducklake_default_data_inlining_row_limit = {int(want)}")
            self._set = want

    def committed(self, con: duckdb.DuckDBPyConnection, lake: str, writes: Iterable[tuple[str, str, int]]) -> None:
        """After a commit of ``writes`` (schema, table, rows written; inlined when at most the limit):
        write out the inlined rows of every table past ``FLUSH_ROWS``, each in its own commit.

        The batches are committed by then: a flush that fails is logged and left to a later one (or
        the next maintenance pass), never made their error."""
        for schema, table, rows in writes:
            if 0 < rows <= self.limit:
                self._rows[(schema, table)] = self._rows.get((schema, table), 0) + rows
        for (schema, table), rows in list(self._rows.items()):
            if rows >= FLUSH_ROWS:
                del self._rows[(schema, table)]  # counted again from nothing, flushed or not
                try:
                    flush(con, lake, schema, table)
                except duckdb.Error as exc:
                    event(log, "ducklake.inline_flush_failed", logging.WARNING, table=f"{schema}.{table}",
                          error=str(exc).splitlines()[0][:300])

    def flushed(self, schema: str, table: str) -> None:
        """The table's inlined rows were written out elsewhere (a maintenance pass)."""
        self._rows.pop((schema, table), None)


def flush(con: duckdb.DuckDBPyConnection, lake: str, schema: str, table: str) -> None:
    """Write ``schema.table``'s inlined rows (and inlined deletes) to Parquet in one commit."""
    con.execute("CALL ducklake_flush_inlined_data(?, schema_name => ?, table_name => ?)", [lake, schema, table]).fetchall()
