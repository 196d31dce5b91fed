"""The ``target: {faulty: ...}`` section: another registered target, and the calls on it to fail.

```yaml
target:
  faulty:
    inner: {ducklake: {catalog: /tmp/lake/meta.ducklake, data_path: /tmp/lake/data}}
    faults:
      - {fail_on: apply_batch, table: public.orders, error: transient, times: 2}
```
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from headrace.core.names import TableName, TableNameError
from headrace.core.settings import Frozen
from headrace.targets.registry import TargetSection

# The Target methods a fault can fail (headrace.core.interfaces.Target).
Call = Literal["ensure_table", "write_snapshot", "apply_batch", "evolve", "drop_table", "read_table",
               "read_cursor", "maintain", "expire_snapshots", "table_files"]
ErrorKind = Literal["transient", "terminal", "unknown", "crash", "hold"]


class Fault(Frozen):
    """One injected failure: which call, on which table, failing how, how many times."""

    fail_on: Call = Field(description="the Target method that fails")
    table: str | None = Field(None, description="only calls for this table (schema.table); default: any table")
    error: ErrorKind = Field(
        "transient", description="transient: TransientError (retried with backoff); terminal: TerminalError (the"
        " table waits for the operator); unknown: an error no rule classifies (retried RETRY_BUDGET times, then"
        " waits); crash: the process exits at once (os._exit, like kill -9); hold: the call waits until"
        " FaultyTarget.release() (at most HOLD_LIMIT_SECONDS), then delegates (a slow call, e.g. a long"
        " maintenance pass)"
    )
    times: int | None = Field(1, ge=1, description="fail this many matching calls, then delegate; null: every one")

    @field_validator("table")
    @classmethod
    def _table(cls, table: str | None) -> str | None:
        if table is None:
            return None
        try:
            return str(TableName.parse(table))
        except TableNameError as exc:
            raise ValueError(str(exc)) from None


class FaultyConfig(Frozen):
    """A registered target to delegate to, and the faults to inject in front of it."""

    inner: TargetSection = Field(description="the target that does the work, e.g. {ducklake: {...}}")
    faults: list[Fault] = Field(default_factory=list, description="failures to inject; more can be added"
                                " while running (FaultyTarget.inject)")
