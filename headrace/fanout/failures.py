"""What went wrong with a destination (or a whole cycle), classified as a CDC table's failure is.

``materialize.error_boundary.classify`` translates the exception (DuckDB, psycopg, OS, headrace errors) into
``transient`` / ``terminal`` / ``unknown`` with its root cause, and the fan-out follows the same
retry rule as a replicated table: transient failures are retried with backoff (``core.backoff``) for
as long as they last, unknown ones ``retry.give_up_after`` times, terminal ones not at all. A
destination that stops retrying waits for the operator, with the fix in its error; the others carry
on. The fan-out has no per-destination ``resume`` command: restarting the instance retries it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from headrace.core.errors import ConfigError, HeadraceError, SchemaChangeError, ValueNotStorableError
from headrace.materialize.error_boundary import Kind, classify

RESTART = "then restart this fan-out instance (`headrace run -c <file>`), which retries it"


@dataclass(frozen=True, slots=True)
class FanoutFailure:
    """A classified failure: its kind, the message state and logs show, the fix once retrying stops."""

    kind: Kind
    error: HeadraceError  # the translated error
    message: str  # ``ErrorClass: what: root cause``
    fix: str  # what the operator does when the failure waits for them

    def retries(self, failures: int, budget: int) -> bool:
        """Whether the ``failures``-th consecutive failure is retried by itself (the CDC table rule)."""
        return self.kind == "transient" or (self.kind == "unknown" and failures < budget)


def classify_failure(exc: BaseException, what: str, table: str | None = None) -> FanoutFailure:
    """``exc``, raised working on ``what`` ("destination acme-lake"), as a ``FanoutFailure``;
    ``table`` is the lake table the destination writes, named in a schema fix."""
    failure = classify(exc, what)
    text = str(failure.error)
    if what not in text:
        text = f"{what}: {text}"
    return FanoutFailure(failure.kind, failure.error, f"{type(failure.error).__name__}: {text}",
                         _fix(failure.kind, failure.error, table))


def _fix(kind: Kind, error: HeadraceError, table: str | None) -> str:
    if kind == "unknown":
        return f"look at the log (event fanout.destination_failed) for the cause, fix it, {RESTART}"
    match error:
        case ConfigError():
            return f"fix the setting or environment variable the error names, {RESTART}"
        case SchemaChangeError():
            where = f"the destination table {table}" if table else "the destination table"
            return (f"{where} must have the source table's columns (the fan-out does not follow schema "
                    f"changes): alter or drop it, {RESTART}")
        case ValueNotStorableError():
            return f"fix the value the error names in the source table, {RESTART}"
        case _:
            return f"fix what the error says, {RESTART}"


@dataclass(slots=True)
class Attempts:
    """A destination's run of consecutive failures and when it may be tried again."""

    verified: bool = False  # the lake's applied snapshot was reconciled with the stored cursor
    failures: int = 0
    retry_at: float = 0.0  # time.monotonic(); infinite while it waits for the operator

    @property
    def waits_for_operator(self) -> bool:
        return math.isinf(self.retry_at)

    def failed(self, retry_in: float | None, now: float) -> None:
        """Count a failure; ``retry_in`` None: no retry until the instance restarts."""
        self.failures += 1
        self.verified = False
        self.retry_at = math.inf if retry_in is None else now + retry_in

    def succeeded(self) -> None:
        self.failures = 0
        self.retry_at = 0.0
