"""The last verify result of each table: what `status`, the API and metrics show."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from headrace.state.own_table import OwnTableStore

DDL = """
CREATE TABLE IF NOT EXISTS _headrace.verify_results (
    pipeline      text NOT NULL,
    table_oid     bigint NOT NULL,
    table_name    text NOT NULL,
    checked_at    timestamptz NOT NULL DEFAULT now(),
    position      bigint,               -- the source position compared at (the first round's)
    status        text NOT NULL,        -- equal, different, unsettled, error
    sampled       double precision NOT NULL DEFAULT 1,  -- the share of keys compared
    rows_source   bigint,
    rows_target   bigint,
    differences   bigint NOT NULL DEFAULT 0,
    unsettled     bigint NOT NULL DEFAULT 0,  -- keys still changing when verify stopped
    error         text,
    detail        jsonb,                -- the first differences (key, kind, columns)
    PRIMARY KEY (pipeline, table_oid)
);
"""

DETAIL_LIMIT = 100  # differences kept per table (the count is always whole)


class VerifyStore(OwnTableStore):
    """Reads and writes ``_headrace.verify_results`` for one pipeline."""

    DDL = DDL

    def record(self, result: dict[str, Any]) -> None:
        """Store one table's result (``TableReport.as_dict``'s shape), replacing the last."""
        self.conn.execute(
            "INSERT INTO _headrace.verify_results AS v (pipeline, table_oid, table_name, checked_at, position,"
            " status, sampled, rows_source, rows_target, differences, unsettled, error, detail)"
            " VALUES (%(p)s, %(oid)s, %(table)s, now(), %(position_int)s, %(status)s, %(sample)s, %(rows_source)s,"
            " %(rows_target)s, %(n)s, %(unsettled)s, %(error)s, %(detail)s)"
            " ON CONFLICT (pipeline, table_oid) DO UPDATE SET table_name = excluded.table_name,"
            " checked_at = excluded.checked_at, position = excluded.position, status = excluded.status,"
            " sampled = excluded.sampled, rows_source = excluded.rows_source, rows_target = excluded.rows_target,"
            " differences = excluded.differences, unsettled = excluded.unsettled, error = excluded.error,"
            " detail = excluded.detail",
            {**result, "p": self.pipeline, "n": len(result["differences"]) or result["differing_rows_not_listed"],
             "detail": json.dumps(result["differences"][:DETAIL_LIMIT])},
        )

    def all(self) -> dict[int, dict[str, Any]]:
        """table oid -> its last result (JSON-able)."""
        rows = self.conn.execute("SELECT * FROM _headrace.verify_results WHERE pipeline = %s",
                                 (self.pipeline,)).fetchall()
        return {int(r["table_oid"]): {
            "checked_at": _iso(r["checked_at"]), "status": r["status"], "position": r["position"],
            "sampled": r["sampled"], "rows_source": r["rows_source"], "rows_target": r["rows_target"],
            "differences": int(r["differences"]), "unsettled": int(r["unsettled"]), "error": r["error"],
            "first_differences": r["detail"] or []} for r in rows}


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None
