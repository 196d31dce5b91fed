"""Emit OpenLineage run events for a running pipeline, through the ``openlineage-python`` client.

One COMPLETE run event per finished initial copy, and per apply batch (``lineage.every: batch``) or
per table and interval (``every: interval``). Each names the source table as input and the target
table as output, with schema and column-lineage facets, row counts, and the positions covered in a
``headrace_positions`` run facet. Lineage never stops replication: a failed emission is logged.
Events are sent at most once: a copy that finishes just before a crash may go unreported.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import attr
from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import (
    InputDataset,
    Job,
    OutputDataset,
    Run,
    RunEvent,
    RunState,
    set_producer,
)
from openlineage.client.generated import input_statistics_input_dataset as ins
from openlineage.client.generated import job_type_job as jt
from openlineage.client.generated import output_statistics_output_dataset as outs
from openlineage.client.generated.base import RunFacet
from openlineage.client.uuid import generate_new_uuid

from headrace.config import PipelineConfig, source_kind
from headrace.core.position import format_lsn
from headrace.core.schema import TableSchema
from headrace.lineage.config import LineageConfig
from headrace.lineage.datasets import (
    column_history,
    column_lineage_facet,
    schema_facet,
    source_dataset,
    target_dataset,
)
from headrace.logs import event
from headrace.state.lifecycle import TableState

if TYPE_CHECKING:
    from headrace.materialize.apply import Applied
    from headrace.state.store import StateStore, TableRow

log = logging.getLogger("headrace.lineage")

PRODUCER = "https://pypi.org/project/headrace/"
STEP_SECONDS = 1.0  # how often the run loop's step looks for finished copies and due summaries


@attr.define
class HeadracePositionsRunFacet(RunFacet):
    """What a run covered: the source positions (LSNs) and how many staged batches."""

    kind: str  # copy | apply
    toLsn: str  # noqa: N815  the copy's snapshot position, or the last applied commit
    fromLsn: str | None = attr.field(default=None)  # noqa: N815  exclusive; absent for a copy (all up to toLsn)
    batches: int = 0

    @staticmethod
    def _get_schema() -> str:
        return "urn:headrace:facets:HeadracePositionsRunFacet:1-0-0"


@dataclass
class _Summary:
    """Apply batches of one table since its last event."""

    from_lsn: int | None
    to_lsn: int
    rows: int
    batches: int
    started: float


def make_client(settings: LineageConfig) -> OpenLineageClient | None:
    """The client for the configured transport; None when lineage is off."""
    if settings.transport == "off":
        return None
    set_producer(PRODUCER)  # the facets' _producer: headrace made them (the client adds a tag with its version)
    if settings.transport == "file":
        from openlineage.client.transport.file import FileConfig, FileTransport

        assert settings.file is not None
        return OpenLineageClient(transport=FileTransport(FileConfig(log_file_path=settings.file, append=True)))
    from openlineage.client.transport.http import (
        ApiKeyTokenProvider,
        HttpConfig,
        HttpTransport,
        TokenProvider,
    )

    assert settings.url is not None
    key = settings.api_key()
    auth = ApiKeyTokenProvider({"apiKey": key}) if key else TokenProvider({})
    return OpenLineageClient(transport=HttpTransport(HttpConfig(url=settings.url, endpoint=settings.endpoint,
                                                                auth=auth)))


class Lineage:
    """The run loop's lineage hooks: ``step`` each loop pass, ``batch_applied`` after each batch."""

    def __init__(self, config: PipelineConfig, dsn: str) -> None:
        self.config = config
        self.dsn = dsn
        self.client = make_client(config.lineage)
        self._copied: dict[int, int | None] | None = None  # oid -> snapshot LSN whose copy was reported
        self._pending: dict[int, _Summary] = {}
        self._next_step = 0.0

    @property
    def enabled(self) -> bool:
        return self.client is not None

    def step(self, state: StateStore) -> None:
        """Report copies finished since the last look, and interval summaries that are due."""
        if self.client is None or time.monotonic() < self._next_step:
            return
        self._next_step = time.monotonic() + STEP_SECONDS
        rows = state.tables()
        copied = {r.oid: r.snapshot_lsn for r in rows if r.state in (TableState.CATCHUP, TableState.STREAMING)}
        if self._copied is None:
            self._copied = copied  # copies finished before this run were reported by the run that made them
            return
        for row in rows:
            if row.oid in copied and self._copied.get(row.oid) != copied[row.oid] and row.snapshot_lsn is not None:
                self._emit(state, row.schema, "copy", None, row.snapshot_lsn, row.rows_copied, 0, BATCH_COPY)
        self._copied = copied
        now = time.monotonic()
        for oid, summary in list(self._pending.items()):
            if now - summary.started >= self.config.lineage.interval_seconds:
                self._flush(state, oid)

    def batch_applied(self, state: StateStore, row: TableRow, applied: Applied) -> None:
        """Report one apply batch (or add it to the table's interval summary)."""
        if self.client is None:
            return
        from_lsn = row.applied_lsn if row.applied_lsn is not None else row.snapshot_lsn
        summary = self._pending.get(row.oid)
        if summary is None:
            summary = self._pending[row.oid] = _Summary(from_lsn, applied.applied_lsn, 0, 0, time.monotonic())
        summary.to_lsn = max(summary.to_lsn, applied.applied_lsn)
        summary.rows += applied.rows_in
        summary.batches += 1
        if self.config.lineage.every == "batch":
            self._flush(state, row.oid)

    def close(self, state: StateStore) -> None:
        """Send the summaries still open (the run is stopping) and close the client."""
        if self.client is None:
            return
        for oid in list(self._pending):
            self._flush(state, oid)
        self.client.close(timeout=5.0)

    # -- emitting ---------------------------------------------------------------------------------
    def _flush(self, state: StateStore, oid: int) -> None:
        summary = self._pending.pop(oid, None)
        row = state.table(oid)  # the schema after any change the batch applied
        if summary is None or row is None:
            return
        self._emit(state, row.schema, "apply", summary.from_lsn, summary.to_lsn, summary.rows, summary.batches,
                   BATCH_APPLY)

    def _position(self, pos: int) -> str:
        """A position as the source writes it: an LSN (``0/16B3748``), a binlog ``000003:1234``."""
        if source_kind(self.dsn) == "mysql":
            from headrace.source.mysql.position import format_position

            return format_position(pos)
        return format_lsn(pos)

    def _emit(self, state: StateStore, table: TableSchema, kind: str, from_lsn: int | None, to_lsn: int,
              rows: int, batches: int, job_type: jt.JobTypeJobFacet) -> None:
        assert self.client is not None
        try:
            ddl = [e for e in reversed(state.recent_ddl(1000)) if e["table_name"] == table.qualified_name]
            history = column_history(ddl)
            source = source_dataset(self.dsn, table)
            target = target_dataset(self.config, table)
            run_event = RunEvent(
                eventType=RunState.COMPLETE,
                eventTime=datetime.now(timezone.utc).isoformat(),
                run=Run(runId=str(generate_new_uuid()), facets={"headrace_positions": HeadracePositionsRunFacet(
                    kind=kind, fromLsn=self._position(from_lsn) if from_lsn is not None else None,
                    toLsn=self._position(to_lsn), batches=batches)}),
                job=Job(namespace=self.config.lineage.namespace, name=f"{self.config.name}.{table.qualified_name}",
                        facets={"jobType": job_type}),
                producer=PRODUCER,
                inputs=[InputDataset(source.namespace, source.name, facets={"schema": schema_facet(table)},
                                     inputFacets={"inputStatistics": ins.InputStatisticsInputDatasetFacet(
                                         rowCount=rows)})],
                outputs=[OutputDataset(target.namespace, target.name, facets={
                    "schema": schema_facet(table, history.kept, target=True, target_kind=self.config.target.kind),
                    "columnLineage": column_lineage_facet(source, table, history)},
                    outputFacets={"outputStatistics": outs.OutputStatisticsOutputDatasetFacet(rowCount=rows)})],
            )
            self.client.emit(run_event)
        except Exception as exc:  # lineage must never stop replication
            event(log, "lineage.failed", logging.WARNING, table=table.qualified_name, kind=kind,
                  error=str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)


BATCH_COPY = jt.JobTypeJobFacet(processingType="BATCH", integration="HEADRACE", jobType="COPY")
BATCH_APPLY = jt.JobTypeJobFacet(processingType="STREAMING", integration="HEADRACE", jobType="APPLY")

