"""Per-chunk progress of initial copies, so a crash or stop mid-table resumes with what is left."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg.rows import dict_row

DDL = """
CREATE TABLE IF NOT EXISTS _headrace.snapshot_progress (
    pipeline     text NOT NULL,
    table_oid    bigint NOT NULL,
    chunk        integer NOT NULL,
    start_page   bigint NOT NULL,
    end_page     bigint NOT NULL,       -- exclusive; 4294967295 = open-ended last chunk
    snapshot_lsn bigint,                -- LSN of the snapshot the chunk was copied under
    rows         bigint,
    done_at      timestamptz,
    PRIMARY KEY (pipeline, table_oid, chunk)
);
"""


@dataclass(frozen=True)
class Chunk:
    """One ctid page range of a table's copy."""

    number: int
    start_page: int
    end_page: int
    snapshot_lsn: int | None
    rows: int | None
    done: bool


@dataclass(frozen=True)
class CopyProgress:
    """How far a table's copy is."""

    chunks_total: int
    chunks_done: int
    rows: int
    min_snapshot_lsn: int | None  # oldest snapshot any finished chunk was copied under


class ProgressStore:
    """Reads and writes ``_headrace.snapshot_progress`` for one pipeline."""

    def __init__(self, dsn: str, pipeline: str) -> None:
        self.pipeline = pipeline
        self.conn = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
        self.conn.execute(DDL)

    def close(self) -> None:
        self.conn.close()

    def plan(self, oid: int, ranges: list[tuple[int, int]]) -> list[Chunk]:
        """Forget any earlier copy of the table and record a fresh chunk plan."""
        with self.conn.transaction():
            self.conn.execute("DELETE FROM _headrace.snapshot_progress WHERE pipeline = %s AND table_oid = %s",
                              (self.pipeline, oid))
            for number, (start, end) in enumerate(ranges):
                self.conn.execute(
                    "INSERT INTO _headrace.snapshot_progress (pipeline, table_oid, chunk, start_page, end_page)"
                    " VALUES (%s, %s, %s, %s, %s)", (self.pipeline, oid, number, start, end))
        return self.chunks(oid)

    def chunks(self, oid: int) -> list[Chunk]:
        rows = self.conn.execute(
            "SELECT * FROM _headrace.snapshot_progress WHERE pipeline = %s AND table_oid = %s ORDER BY chunk",
            (self.pipeline, oid)).fetchall()
        return [Chunk(r["chunk"], r["start_page"], r["end_page"], r["snapshot_lsn"], r["rows"],
                      r["done_at"] is not None) for r in rows]

    def mark_done(self, oid: int, chunks: list[Chunk], snapshot_lsn: int, rows: int) -> None:
        """Record chunks as copied (``rows`` is spread over them for progress display)."""
        share = rows // max(1, len(chunks))
        with self.conn.transaction():
            for i, chunk in enumerate(chunks):
                n = share + (rows - share * len(chunks) if i == 0 else 0)
                self.conn.execute(
                    "UPDATE _headrace.snapshot_progress SET snapshot_lsn = %s, rows = %s, done_at = now()"
                    " WHERE pipeline = %s AND table_oid = %s AND chunk = %s",
                    (snapshot_lsn, n, self.pipeline, oid, chunk.number))

    def progress(self) -> dict[int, CopyProgress]:
        """Copy progress of every table that has a chunk plan."""
        rows = self.conn.execute(
            "SELECT table_oid, count(*) AS total, count(done_at) AS done, coalesce(sum(rows), 0) AS rows,"
            " min(snapshot_lsn) AS min_lsn FROM _headrace.snapshot_progress WHERE pipeline = %s"
            " GROUP BY table_oid", (self.pipeline,)).fetchall()
        return {int(r["table_oid"]): CopyProgress(int(r["total"]), int(r["done"]), int(r["rows"]), r["min_lsn"])
                for r in rows}
