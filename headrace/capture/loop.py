"""The capture loop: source change events in, staged files out, stream acknowledged only after both.

One capture runs per pipeline, in a thread of the driver. It buffers changes per table; at a
transaction boundary, when the flush policy says so (rows, bytes or age), it writes one staging
file per table, registers the files and the captured position in one state transaction, and only
then acknowledges the stream (PostgreSQL: the slot). The source's log is therefore released as soon
as changes are durable in staging, however far behind the target is. The source (``source.base``)
gives the stream, the schema of a Relation event, heartbeats and the flushed-position bound.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from headrace.capture.backpressure import Backpressure
from headrace.capture.buffer import TableBuffer, buffered_bytes, stage
from headrace.capture.staging import remove_orphans, write_waiting
from headrace.config import PipelineConfig
from headrace.core.backoff import Backoff
from headrace.core.changes import Begin, Commit, Delete, Insert, Message, Relation, Truncate, Update
from headrace.core.errors import TransientError
from headrace.core.faults import crash_point
from headrace.core.schema import TableSchema
from headrace.log.facts import FileFacts
from headrace.log.index import LogIndex, StagedFile
from headrace.log.store import StagingStore
from headrace.logs import event
from headrace.outage import storage_unavailable
from headrace.source import open_source
from headrace.source.base import ChangeStream, Source
from headrace.state.store import StateStore

log = logging.getLogger("headrace.capture")



class Capture:
    """Reads the slot, stages changes, registers them, acknowledges. Run ``run`` in a thread."""

    def __init__(self, config: PipelineConfig, dsn: str, state_dsn: str, schemas: dict[int, TableSchema],
                 source: Source | None = None) -> None:
        self.config = config
        self.dsn = dsn
        self.source = source or open_source(config, dsn)
        self.state_dsn = state_dsn
        # oid -> schema as tracked in state (keys come from here). Replaced, never changed in place: the
        # stream may keep the dict it was handed and tell a new one by identity (MySQL's NewestSchemas).
        self.known = dict(schemas)
        self.staging = StagingStore.for_pipeline(config.staging.path, config.name)
        self.captured_lsn = 0  # end LSN of the last transaction registered in the log
        self.received_lsn = 0
        self.connected = False
        self.last_error: str | None = None
        self.failure: Exception | None = None  # what stopped capture for good (the run loop re-raises it)
        self.table_errors: dict[int, str] = {}  # oid -> why the stream stopped that table (run.table_watch errors it)
        self.changes_captured: dict[tuple[int, str], int] = {}
        self._heartbeat_due = True
        self._lock = threading.Lock()
        self._source: Any = None  # the source connection of the current attempt
        self._streamed = False  # the current connection attempt registered a flush
        self.storage_error: str | None = None  # why staging refuses files, while capture waits for it
        self._stop = threading.Event()  # run()'s stop: ends a wait for staging space too
        self.backpressure = Backpressure(config.staging)
        self.on_staged: Callable[[], None] = lambda: None  # called once staged files are registered

    @property
    def paused(self) -> bool:
        """Backpressure: not reading WAL until the backlog shrinks."""
        return self.backpressure.paused

    # -- public ---------------------------------------------------------------------------------
    def request_heartbeat(self) -> None:
        """Ask for a heartbeat now (so the captured position passes the current WAL end soon)."""
        self._heartbeat_due = True

    def track(self, schema: TableSchema) -> None:
        """Start capturing a table added while running."""
        with self._lock:
            self.known = {**self.known, schema.oid: schema}

    def run(self, stop: threading.Event) -> None:
        """Capture until ``stop`` is set, reconnecting after transient failures, however long they last.

        A dropped replication connection (walsender terminated, server restart, network), a
        state/source connection that fails, or a staging directory that is full or unwritable is
        retried with the ``reconnect`` backoff; each attempt resumes from the position registered in
        state, so what was buffered but not registered is read again (the slot kept it), and staged
        files left unregistered by the failure are removed first. The backoff starts over once an
        attempt has registered a flush, so a drop after days of streaming reconnects within a second. One log
        line when capture stops streaming and one when it streams again, not one per attempt.
        """
        backoff = self._backoff()
        self._stop = stop
        failures = 0
        passing: tuple[type[BaseException], ...] = (TransientError, psycopg.OperationalError, psycopg.InterfaceError,
                                                    OSError, *self.source.transient_errors)
        while not stop.is_set():
            self._streamed = False
            try:
                self._run_once(stop)
            except passing as exc:
                # psycopg (3) errors come from the state and heartbeat connections: a source or
                # state server that went away is as passing as a dropped replication connection.
                # An OSError is the staging directory refusing a file (full, read-only): capture
                # pauses, the slot keeps the WAL, and it resumes once the directory takes files.
                was_streaming = self.connected
                failures = 1 if self._streamed else failures + 1
                self.connected = False
                error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                if storage_unavailable(exc):
                    error = (f"staging directory {self.staging} cannot take files ({error}):"
                             " free space or fix its permissions; capture resumes by itself")
                if failures == 1 or was_streaming:  # pairs with capture.reconnected, never per attempt
                    event(log, "capture.interrupted", logging.WARNING, error=error,
                          captured_lsn=self.source.format_position(self.captured_lsn))
                else:
                    log.debug("capture attempt %d failed: %s", failures, error)
                self.last_error = error
                stop.wait(backoff.delay(failures))
            except Exception as exc:
                self.connected = False
                self.failure = exc
                self.last_error = str(exc).strip() or type(exc).__name__
                event(log, "capture.failed", logging.ERROR, error=self.last_error)
                raise

    # -- the loop -------------------------------------------------------------------------------
    def _run_once(self, stop: threading.Event) -> None:
        # Every connection opened here is closed whichever step fails: a source that keeps
        # refusing must not leak a connection per attempt.
        with contextlib.ExitStack() as opened:
            state = StateStore(self.state_dsn, self.config.name)
            opened.callback(state.close)
            source = opened.enter_context(self.source.connect())
            self._source = source
            opened.callback(setattr, self, "_source", None)
            self.source.check_same_source(source, state)  # a failover can lose the slot
            self.captured_lsn = state.captured_lsn()
            remove_orphans(self.staging, state.log_index)
            stream = self.source.open_stream(self.captured_lsn, self._known)
            opened.callback(stream.close)
            self._stream(stop, state.log_index, source, stream)

    def _known(self) -> dict[int, TableSchema]:
        with self._lock:
            return self.known  # never changed in place (``track``): safe to hand out

    def _stream(self, stop: threading.Event, index: LogIndex, source: Any, stream: ChangeStream) -> None:
        self.connected = True
        fmt = self.source.format_position
        if self.last_error is not None:
            event(log, "capture.reconnected", slot=self.config.slot_name, start_lsn=fmt(self.captured_lsn))
        self.last_error = None
        event(log, "capture.start", slot=self.config.slot_name, start_lsn=fmt(self.captured_lsn))
        buffers: dict[int, TableBuffer] = {}
        spilled: list[StagedFile] = []
        relations: dict[int, TableSchema] = {}
        txn: Begin | None = None
        seq = 0
        skip = True  # outside a transaction, or in one registered before a restart: changes are skipped
        pending_end = self.captured_lsn  # end LSN of the last complete transaction read
        first_change_at: float | None = None
        last_message_at = time.monotonic()
        last_ack_at = time.monotonic()
        policy = self.config.staging
        flush_bytes = policy.flush_bytes
        try:
            while not stop.is_set():
                if txn is None and self._make_room(index, stream, stop, buffers, spilled, pending_end):
                    first_change_at, last_ack_at = None, time.monotonic()
                if self._heartbeat_due or time.monotonic() - last_message_at > policy.heartbeat_seconds:
                    self.source.heartbeat(source)
                    self._heartbeat_due = False
                    last_message_at = time.monotonic()
                events = stream.read(max_messages=10_000, timeout=0.2)
                self.table_errors.update(stream.new_table_errors())  # tables the stream stopped (MySQL DROP)
                if events:
                    last_message_at = time.monotonic()
                # The per-change path first (the cases are disjoint types, so order is free), and
                # the size of what is buffered kept as a running sum rather than summed per change.
                buffered = buffered_bytes(buffers)
                for _lsn, ev in events:
                    match ev:
                        case Insert() | Update() | Delete() | Truncate():
                            if skip:
                                continue  # already registered before a restart
                            seq += 1
                            if first_change_at is None:
                                first_change_at = time.monotonic()
                            buffered += stage(ev, txn, seq, relations, buffers)  # type: ignore[arg-type]
                            if buffered > flush_bytes:
                                # A large transaction: spill to files now, register them at its commit.
                                spilled += [self._write(oid, tb) for oid, tb in buffers.items() if len(tb.buffer)]
                                buffers.clear()
                                buffered = 0
                        case Begin():
                            txn, seq = ev, 0
                            skip = ev.final_lsn < self.captured_lsn
                        case Commit():
                            txn, skip = None, True
                            pending_end = max(pending_end, ev.end_lsn)
                            self.received_lsn = pending_end
                            if self._full(buffers, spilled):
                                # Flush at this boundary: a read of many transactions mostly ends
                                # inside one, so waiting for a read that ends between two let the
                                # buffer grow to flush_bytes whatever flush_rows said.
                                self._flush(index, stream, buffers, spilled, pending_end)
                                spilled, buffers, first_change_at = [], {}, None
                                last_ack_at = time.monotonic()
                            # Here too, not only between reads: those mostly end inside a transaction.
                            if self._make_room(index, stream, stop, buffers, spilled, pending_end):
                                first_change_at, last_ack_at = None, time.monotonic()
                            buffered = buffered_bytes(buffers)
                        case Relation():
                            known = self.known.get(ev.oid)
                            if known is None:
                                continue  # published, but not one of this pipeline's tables
                            schema = self.source.relation_schema(source, stream, ev, known)
                            old = relations.get(ev.oid)
                            relations[ev.oid] = schema
                            tb = buffers.get(ev.oid)
                            if tb is not None and old is not None and old != schema and len(tb.buffer):
                                # One staged file holds one shape; cut at the schema change.
                                spilled.append(self._write(ev.oid, tb))
                                del buffers[ev.oid]
                                buffered = buffered_bytes(buffers)
                        case Message():
                            pass  # heartbeats only move the position
                if txn is not None:
                    continue
                rows = sum(len(tb.buffer) for tb in buffers.values()) + sum(f.rows for f in spilled)
                due = rows > 0 and (
                    rows >= policy.flush_rows
                    or buffered_bytes(buffers) >= policy.flush_bytes
                    or (first_change_at is not None and time.monotonic() - first_change_at >= policy.flush_seconds)
                    or stop.is_set()
                )
                idle_ack = rows == 0 and pending_end > self.captured_lsn and (
                    time.monotonic() - last_ack_at >= min(policy.flush_seconds, 1.0)
                )
                if due or idle_ack:
                    self._flush(index, stream, buffers, spilled, pending_end)
                    spilled = []
                    buffers = {}
                    first_change_at = None
                    last_ack_at = time.monotonic()
            if txn is None and (buffers or spilled or pending_end > self.captured_lsn):
                self._flush(index, stream, buffers, spilled, pending_end)
        finally:
            self.connected = False
            event(log, "capture.stop", captured_lsn=fmt(self.captured_lsn))

    def _full(self, buffers: dict[int, TableBuffer], spilled: list[StagedFile]) -> bool:
        """The flush policy's size limit (rows or bytes) is reached."""
        rows = sum(len(tb.buffer) for tb in buffers.values()) + sum(f.rows for f in spilled)
        return rows >= self.config.staging.flush_rows or buffered_bytes(buffers) >= self.config.staging.flush_bytes

    def _write(self, oid: int, tb: TableBuffer) -> StagedFile:
        location, size = self.staging.write(oid, tb.buffer)
        return StagedFile(oid, location, len(tb.buffer), size, tb.buffer.min_lsn, tb.buffer.max_lsn, tb.schema,
                          tb.buffer.facts)

    def _make_room(self, index: LogIndex, stream: ChangeStream, stop: threading.Event,
                   buffers: dict[int, TableBuffer], spilled: list[StagedFile], pending_end: int) -> bool:
        """Backpressure, at a transaction boundary: when over the bound, make what is buffered
        durable (emptying ``buffers`` and ``spilled``), then read no WAL (the slot keeps it) until
        the materializer has applied enough. True when it paused."""
        if not self.backpressure.over_bound(index):
            return False
        if buffers or spilled or pending_end > self.captured_lsn:
            self._flush(index, stream, buffers, spilled, pending_end)
            buffers.clear()
            spilled.clear()
        self.backpressure.wait(index, stop, lambda: self._confirm(index, stream))
        return True

    def _confirm(self, index: LogIndex, stream: ChangeStream) -> None:
        """Confirm the captured position again (while paused); the confirmation may carry
        psycopg2's forwarded position, so bound it in state first."""
        assert self._source is not None
        index.register([], self.captured_lsn, self.source.flushed_position(self._source))
        stream.acknowledge(self.captured_lsn)

    def _flush(self, index: LogIndex, stream: ChangeStream, buffers: dict[int, TableBuffer],
               spilled: list[StagedFile], end_lsn: int) -> None:
        files = spilled + self._write_waiting(stream, buffers)
        if files:
            crash_point("capture.after_write")
        # Anything psycopg2 forwarded the confirmation to came from a keepalive already read, so
        # it is at most the server's flushed WAL now.
        bound = self.source.flushed_position(self._source) if self._source is not None else end_lsn
        index.register(files, end_lsn, bound)  # durable and registered: now the slot may move
        if files:
            crash_point("capture.after_register")
            self._count(files)
            self.on_staged()  # the run loop applies them now, not at its next timed pass
        self.captured_lsn = max(self.captured_lsn, end_lsn)
        self._streamed = True  # this attempt got somewhere: the next failure starts the backoff over
        self.backpressure.staged(sum(f.rows for f in files), sum(f.bytes for f in files))
        stream.acknowledge(self.captured_lsn)
        if files:
            event(log, "capture.flush", files=len(files), rows=sum(f.rows for f in files),
                  captured_lsn=self.source.format_position(self.captured_lsn))

    def _count(self, files: list[StagedFile]) -> None:
        """Add the registered files' rows to ``changes_captured`` (per table and op)."""
        counts = self.changes_captured
        for f in files:
            facts = f.facts or FileFacts()
            for op, n in (("I", facts.inserts), ("U", facts.updates), ("D", facts.deletes), ("T", facts.truncates)):
                if n:
                    counts[(f.table_oid, op)] = counts.get((f.table_oid, op), 0) + n

    def _write_waiting(self, stream: ChangeStream, buffers: dict[int, TableBuffer]) -> list[StagedFile]:
        """One file per buffered table, waiting while staging cannot take them (``capture.staging``)."""
        def write(written: list[StagedFile]) -> None:
            written.extend(self._write(oid, tb) for oid, tb in buffers.items() if len(tb.buffer))

        def report(error: str | None) -> None:
            self.storage_error = error

        return write_waiting(write, self.staging, self._backoff(), self._stop,
                             lambda: stream.acknowledge(self.captured_lsn), report)

    def _backoff(self) -> Backoff:
        return Backoff(self.config.reconnect.first_seconds, self.config.reconnect.max_seconds)
