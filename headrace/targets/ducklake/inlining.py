"""Small batches' rows kept in the catalog (DuckLake's data inlining) and flushed to Parquet in bulk.

Without it, each change batch commits a Parquet file of its inserted rows and a delete file, and every
later batch's plan and delete read all of them until a maintenance pass compacts the table (at most
every ``maintenance.max_batches`` batches). A busy table taking a batch or two a second then pays more
for each batch the longer it runs: 10 tables of 2,000 rows taking batches of 40 updates (a micro bench
of ``apply_arrow_batch`` alone, idle machine) went from a 13.7 ms plan and 9.9 ms delete to 31.8 ms and
24.5 ms within 150 batches a table; with ``target.ducklake.inline_rows`` at 1,000 they stayed at 12.7-15.0
ms and 8.1-9.8 ms. The lake is attached with that limit (``extension.attach``), so DuckLake writes an
insert of at most that many rows, and a delete of at most that many rows of one data file, into the
catalog's inlined tables; readers see them as any other rows.

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
