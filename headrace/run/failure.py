"""A table that failed: ERRORED, with a retry planned or waiting for the operator.

Transient errors retry with backoff; terminal ones wait for the operator. An error no rule
classifies (``unknown``) is retried ``RETRY_BUDGET`` times, then waits too: retrying forever what
may need a person only hides it. The classification itself is ``materialize.error_boundary``.
"""

from __future__ import annotations

import logging

from headrace.logs import event
from headrace.materialize.error_boundary import classify
from headrace.run.observer import RunObserver
from headrace.state.lifecycle import RETRY_BUDGET, TableState, next_retry
from headrace.state.store import StateStore, TableRow

log = logging.getLogger("headrace.pipeline")


class Failures:
    """Puts failed tables in ERRORED, for the run loop, the copy round and the catalog watch."""

    def __init__(self, source_user: str | None, observer: RunObserver) -> None:
        self.source_user = source_user  # the role named in GRANT fixes
        self.observer = observer

    def fail(self, state: StateStore, row: TableRow, exc: Exception, resume: TableState) -> None:
        """Put the table in ERRORED; it resumes in ``resume`` once retried or resumed."""
        failure = classify(exc, row.qualified_name, self.source_user)
        count = row.error_count + 1
        retries = failure.kind == "transient" or (failure.kind == "unknown" and count < RETRY_BUDGET)
        retry_at = next_retry(count) if retries else None
        fix = failure.fix if retry_at is None else None
        state.errored(row.oid, failure.message, kind=failure.kind, fix=fix, count=count, retry_at=retry_at,
                      resume=resume)
        self.observer.table_failed(row.qualified_name, failure.kind)
        event(log, "table.errored", logging.ERROR, table=row.qualified_name, kind=failure.kind,
              error=failure.message, attempt=count, retry_at=retry_at.isoformat() if retry_at else None, fix=fix)
        # An unclassified error's traceback is the operator's only lead; the others say enough.
        log.log(logging.WARNING if failure.kind == "unknown" else logging.DEBUG, "traceback", exc_info=exc)

