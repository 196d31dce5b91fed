"""Consistent cuts (``apply.consistency: transaction``) of a target that commits one table at a time
(Iceberg): for each cut, the snapshot id of every streaming table at it. A reader that time-travels
each table to its snapshot of one cut sees every table at the same source transaction."""

from __future__ import annotations

import json
from typing import Any

from headrace.state.own_table import OwnTableStore

KEEP = 1000  # cuts kept per pipeline: readers use the newest; older ones may name expired snapshots

DDL = """
CREATE TABLE IF NOT EXISTS _headrace.cuts (
    pipeline      text NOT NULL,
    log_offset    bigint NOT NULL,      -- the cut: every table's staged entries up to this offset
    applied_lsn   bigint NOT NULL,      -- the source position the cut reaches (its last transaction's commit)
    committed_at  timestamptz NOT NULL DEFAULT now(),
    snapshots     jsonb NOT NULL,       -- target table name -> snapshot id at the cut
    whole         boolean NOT NULL DEFAULT false,  -- the catalog made all of it visible at once (REST)
    PRIMARY KEY (pipeline, log_offset)
);
ALTER TABLE _headrace.cuts ADD COLUMN IF NOT EXISTS whole boolean NOT NULL DEFAULT false;
"""


class CutStore(OwnTableStore):
    """Reads and writes ``_headrace.cuts`` for one pipeline."""

    DDL = DDL

    def record(self, log_offset: int, applied_lsn: int, snapshots: dict[str, int], whole: bool = False) -> None:
        """Store a cut (again: the same offset replaces it) and drop all but the newest ``KEEP``;
        ``whole``: its batches became visible in one catalog commit (a REST catalog's multi-table
        commit), not table by table."""
        with self.conn.transaction():
            self.conn.execute(
                "INSERT INTO _headrace.cuts (pipeline, log_offset, applied_lsn, snapshots, whole)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (pipeline, log_offset) DO UPDATE SET"
                " applied_lsn = excluded.applied_lsn, snapshots = excluded.snapshots, whole = excluded.whole,"
                " committed_at = now()",
                (self.pipeline, log_offset, applied_lsn, json.dumps(snapshots), whole))
            self.conn.execute(
                "DELETE FROM _headrace.cuts WHERE pipeline = %s AND log_offset < (SELECT min(log_offset) FROM"
                " (SELECT log_offset FROM _headrace.cuts WHERE pipeline = %s ORDER BY log_offset DESC LIMIT %s) k)",
                (self.pipeline, self.pipeline, KEEP))

    def named(self, table: str) -> int | None:
        """The snapshot id the newest cut names for ``table`` (its target name); None: it names none."""
        row = self.conn.execute("SELECT snapshots ->> %s AS at FROM _headrace.cuts WHERE pipeline = %s"
                                " ORDER BY log_offset DESC LIMIT 1", (table, self.pipeline)).fetchone()
        return None if row is None or row["at"] is None else int(row["at"])

    def latest(self) -> dict[str, Any] | None:
        """The newest cut: log_offset, applied_lsn, committed_at (ISO) and snapshots."""
        row = self.conn.execute("SELECT * FROM _headrace.cuts WHERE pipeline = %s ORDER BY log_offset DESC LIMIT 1",
                                (self.pipeline,)).fetchone()
        if row is None:
            return None
        return {"log_offset": row["log_offset"], "applied_lsn": row["applied_lsn"],
                "committed_at": row["committed_at"].isoformat(), "snapshots": row["snapshots"], "whole": row["whole"]}
