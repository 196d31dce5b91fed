"""When each table was last maintained, and its file counts then: what `status` and metrics show."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from headrace.core.maintenance import TableFiles
from headrace.state.own_table import OwnTableStore

DDL = """
CREATE TABLE IF NOT EXISTS _headrace.maintenance (
    pipeline      text NOT NULL,
    table_oid     bigint NOT NULL,
    last_run_at   timestamptz,          -- last maintenance pass that finished
    last_error    text,                 -- the last pass's error, NULL when it succeeded
    data_files    bigint,               -- counts measured after the last pass (or first sight)
    delete_files  bigint,
    snapshots     bigint,
    bytes         bigint,
    measured_at   timestamptz,
    PRIMARY KEY (pipeline, table_oid)
);
"""


class MaintenanceStore(OwnTableStore):
    """Reads and writes ``_headrace.maintenance`` for one pipeline."""

    DDL = DDL

    def record(self, oid: int, files: TableFiles | None, ran: bool, error: str | None = None) -> None:
        """Store a measurement; ``ran``: a maintenance pass finished (or failed, with ``error``)."""
        counts = files.as_dict() if files else {"data_files": None, "delete_files": None, "snapshots": None,
                                                "bytes": None}
        self.conn.execute(
            "INSERT INTO _headrace.maintenance AS m (pipeline, table_oid, last_run_at, last_error, data_files,"
            " delete_files, snapshots, bytes, measured_at) VALUES (%(p)s, %(oid)s, CASE WHEN %(ran)s THEN now() END,"
            " %(error)s, %(data_files)s, %(delete_files)s, %(snapshots)s, %(bytes)s, now())"
            " ON CONFLICT (pipeline, table_oid) DO UPDATE SET"
            " last_run_at = CASE WHEN %(ran)s THEN now() ELSE m.last_run_at END,"
            " last_error = CASE WHEN %(ran)s THEN %(error)s ELSE m.last_error END,"
            " data_files = coalesce(excluded.data_files, m.data_files),"
            " delete_files = coalesce(excluded.delete_files, m.delete_files),"
            " snapshots = coalesce(excluded.snapshots, m.snapshots), bytes = coalesce(excluded.bytes, m.bytes),"
            " measured_at = now()",
            {"p": self.pipeline, "oid": oid, "ran": ran, "error": error, **counts},
        )

    def all(self) -> dict[int, dict[str, Any]]:
        """table oid -> last run, error and counts (JSON-able)."""
        rows = self.conn.execute("SELECT * FROM _headrace.maintenance WHERE pipeline = %s",
                                 (self.pipeline,)).fetchall()
        return {int(r["table_oid"]): {
            "last_run_at": _iso(r["last_run_at"]), "last_error": r["last_error"],
            "data_files": r["data_files"], "delete_files": r["delete_files"], "snapshots": r["snapshots"],
            "bytes": r["bytes"], "measured_at": _iso(r["measured_at"])} for r in rows}


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None
