"""The capture loop: source change events in, staged files out, stream acknowledged only after both.

One capture runs per pipeline, in a thread of the driver. It buffers changes per table; at a
transaction boundary, when the flush policy says so (rows, bytes or age), it writes one staging
file per table, registers the files and the captured position in one state transaction, and only
then acknowledges the stream (PostgreSQL: the slot). The source's log is therefore released as soon
as changes are durable in staging, however far behind the target is. The source (``source.base``)
gives the stream, the schema of a Relation event, heartbeats and the flushed-position bound.

Writing and registering a flush runs on a thread of its own (``capture.flusher``) while this one
decodes on; this thread confirms the stream up to what that one registered. While a flush is
still being written, the next one grows (``staging.flush_rows_under_load``) instead of queueing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from headrace.capture.backpressure import Backpressure
from headrace.capture.buffer import TableBuffer, buffered_bytes, flush_due, stage
from headrace.capture.confirm import SlotConfirmation
from headrace.capture.flusher import Flusher, FlushJob
from headrace.capture.spill import Committed, StreamedTransactions
from headrace.capture.staging import remove_orphans, spill_folder, write_files, write_waiting
from headrace.config import PipelineConfig
from headrace.core.backoff import Backoff
from headrace.core.changes import (
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Relation,
    StreamCommit,
    Truncate,
    Update,
)
from headrace.core.errors import TransientError
from headrace.core.schema import TableSchema
from headrace.log.index import LogIndex, StagedFile
from headrace.log.store import StagingStore
from headrace.logs import event
from headrace.outage_signs import storage_unavailable
from headrace.source import open_source
from headrace.source.base import ChangeStream, Source
from headrace.state.store import StateStore

log = logging.getLogger("headrace.capture")

# A flush's files (one per table) written at once on a staging store that is not a local folder
# (uploads wait on the network). On a local folder one at a time: side by side measured ~5% more
# CPU per change for the same wall clock (bench/capture.py, 4 runs each), and capture is CPU-bound.
FILE_WRITERS = 4



class Capture(SlotConfirmation):
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
        self.tables_created = threading.Event()  # the stream read a CREATE TABLE (run.table_watch polls)
        self.table_errors: dict[int, str] = {}  # oid -> why the stream stopped that table (run.table_watch errors it)
        self.changes_captured: dict[tuple[int, str], int] = {}
        self._heartbeat_due = True
        self._lock = threading.Lock()
        self._source_lock = threading.Lock()  # the source connection: capture's thread and the flusher's
        self._acked = 0  # the position last confirmed to the stream
        self._bounded = 0  # the most a confirmation may carry, as recorded in state (acked_lsn)
        self._forwarded = 0  # a closed stream's ``forwardable``: recorded before its slot is checked again
        self._submitted = 0  # the end of the last flush handed to the flusher
        self._pending_token: str | None = None  # the source's resume token at the last Commit read
        self._writers: ThreadPoolExecutor | None = None  # a flush's files, written side by side
        self._halt = threading.Event()  # the current flusher's: ends its wait for staging space
        self._source: Any = None  # the source connection of the current attempt
        self._streamed = False  # the current connection attempt registered a flush
        self.storage_error: str | None = None  # why staging refuses files, while capture waits for it
        self._stop = threading.Event()  # run()'s stop: ends a wait for staging space too
        self.backpressure = Backpressure(config.staging)
        self._backoff = Backoff(config.reconnect.first_seconds, config.reconnect.max_seconds)
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
                stop.wait(self._backoff.delay(failures))
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
            # The flush thread registers on a connection of its own: a registering transaction must
            # not take in the capture thread's backpressure queries (one psycopg connection is one
            # session, whichever thread uses it).
            flush_state = StateStore(self.state_dsn, self.config.name)
            opened.callback(flush_state.close)
            source = opened.enter_context(self.source.connect())
            self._source = source
            opened.callback(setattr, self, "_source", None)
            if self._forwarded > self._bounded:
                # The last stream's final read may have answered the server's goodbye with its
                # forwarded position (a restart asks for one) before it could be recorded.
                self._bound(state.log_index, self._forwarded)
            self.source.check_same_source(source, state)  # a failover can lose the slot
            self.captured_lsn = state.captured_lsn()
            remove_orphans(self.staging, state.log_index)
            stream = self.source.open_stream(self.captured_lsn, self._known)
            opened.callback(self._closed, stream)
            self._stream(stop, state.log_index, flush_state.log_index, source, stream)

    def _known(self) -> dict[int, TableSchema]:
        with self._lock:
            return self.known  # never changed in place (``track``): safe to hand out

    def _stream(self, stop: threading.Event, index: LogIndex, flush_index: LogIndex, source: Any,
                stream: ChangeStream) -> None:
        self.connected = True
        fmt = self.source.format_position
        if self.last_error is not None:
            event(log, "capture.reconnected", slot=self.config.slot_name, start_lsn=fmt(self.captured_lsn))
        self.last_error = None
        event(log, "capture.start", slot=self.config.slot_name, start_lsn=fmt(self.captured_lsn))
        flusher = Flusher(lambda buffers: self._write_waiting(buffers, flusher.halt),
                          lambda files, end_lsn, token: self._register(flush_index, files, end_lsn, token),
                          finish=lambda committed: committed.finish(self.staging, policy.flush_rows_busy))
        self._writers = (None if self.staging.local
                         else ThreadPoolExecutor(max_workers=FILE_WRITERS, thread_name_prefix="capture-write"))
        self._halt = flusher.halt
        self._acked = self.captured_lsn
        self._submitted = self.captured_lsn  # end of the last flush handed to the flusher
        buffers: dict[int, TableBuffer] = {}
        spilled_rows = 0  # rows of this transaction's spills, handed to the flusher, not yet registered
        relations: dict[int, TableSchema] = {}
        txn: Begin | None = None
        seq = 0
        skip = True  # outside a transaction, or in one registered before a restart: changes are skipped
        pending_end = self.captured_lsn  # end LSN of the last complete transaction read
        self._pending_token = None  # the source's resume token at pending_end (``Commit.token``)
        first_change_at: float | None = None
        last_message_at = time.monotonic()
        last_ack_at = time.monotonic()
        policy = self.config.staging
        flush_bytes = policy.flush_bytes
        codec = self.source.undecoded()  # stages the changes the stream hands over as bytes
        streamed = StreamedTransactions(spill_folder(self.staging, self.config.name), relations,
                                        lambda ev: self._schema(source, stream, ev), codec, flush_bytes)
        in_block = False  # between a StreamStart and its StreamStop: changes are the streamed transaction's
        try:
            while not stop.is_set():
                flusher.check()
                self._ack(stream)
                if txn is None and self._make_room(index, stream, stop, flusher, buffers, pending_end):
                    first_change_at, last_ack_at, spilled_rows = None, time.monotonic(), 0
                if self._heartbeat_due or time.monotonic() - last_message_at > policy.heartbeat_seconds:
                    with self._source_lock:
                        self.source.heartbeat(source)
                    self._heartbeat_due = False
                    last_message_at = time.monotonic()
                events = stream.read(max_messages=10_000, timeout=0.2)
                if stream.forwardable > self._bounded:
                    self._bound(index, stream.forwardable)
                self.table_errors.update(stream.new_table_errors())  # tables the stream stopped (MySQL DROP)
                if stream.tables_created():  # MySQL: a CREATE TABLE read; the table watch polls now
                    self.tables_created.set()
                    self.on_staged()  # ends the run loop's idle wait
                if events:
                    last_message_at = time.monotonic()
                # The per-change path first (the cases are disjoint types, so order is free), and
                # the size of what is buffered kept as a running sum rather than summed per change.
                buffered = buffered_bytes(buffers)
                for _lsn, ev in events:
                    match ev:
                        case bytes() | Insert() | Update() | Delete() | Truncate():  # bytes: undecoded
                            if in_block:
                                streamed.take(ev)
                                continue
                            if skip:
                                continue  # already registered before a restart
                            seq += 1
                            if first_change_at is None:
                                first_change_at = time.monotonic()
                            buffered += stage(ev, txn, seq, relations, buffers, codec)  # type: ignore[arg-type]
                            if buffered > flush_bytes:
                                # A large transaction: spill to files now, register them at its commit.
                                spilled_rows += self._hand_over(flusher, stream, buffers, None)
                                buffered = 0
                        case Begin():
                            txn, seq = ev, 0
                            skip = ev.final_lsn < self.captured_lsn
                        case Commit():
                            txn, skip = None, True
                            if ev.end_lsn >= pending_end:
                                self._pending_token = ev.token
                            pending_end = max(pending_end, ev.end_lsn)
                            self.received_lsn = pending_end
                            if flush_due(buffers, spilled_rows, flusher.idle, self.config.staging):
                                # Flush at this boundary: a read of many transactions mostly ends
                                # inside one, so waiting for a read that ends between two let the
                                # buffer grow to flush_bytes whatever flush_rows said.
                                self._hand_over(flusher, stream, buffers, pending_end)
                                spilled_rows, first_change_at = 0, None
                                last_ack_at = time.monotonic()
                            # Here too, not only between reads: those mostly end inside a transaction.
                            if self._make_room(index, stream, stop, flusher, buffers, pending_end):
                                first_change_at, last_ack_at, spilled_rows = None, time.monotonic(), 0
                            buffered = buffered_bytes(buffers)
                        case StreamCommit():
                            committed = streamed.commit(ev)
                            pending_end = self.received_lsn = max(pending_end, ev.end_lsn)
                            if committed is not None and ev.commit_lsn >= self.captured_lsn:
                                # Registered at its commit's place: after what is buffered, before what follows.
                                self._hand_over(flusher, stream, buffers, pending_end, committed)
                                relations.update(committed.relations)  # the server counts them as sent now
                                spilled_rows, first_change_at, last_ack_at = 0, None, time.monotonic()
                            elif committed is not None:
                                committed.discard()  # registered before a restart
                            buffered = 0
                        case Relation():
                            schema = self._schema(source, stream, ev)
                            if schema is None:
                                continue  # published, but not one of this pipeline's tables
                            old = relations.get(ev.oid)
                            relations[ev.oid] = schema
                            tb = buffers.get(ev.oid)
                            if tb is not None and old is not None and old != schema and len(tb.buffer):
                                # One staged file holds one shape; cut at the schema change.
                                spilled_rows += len(tb.buffer)
                                flusher.submit(FlushJob([(ev.oid, tb)], None), lambda: self._keep_alive(stream))
                                del buffers[ev.oid]
                                buffered = buffered_bytes(buffers)
                        case Message():
                            pass  # heartbeats only move the position
                        case _:  # StreamStart, StreamStop, StreamAbort, a Streamed message
                            in_block = streamed.message(ev)
                if txn is not None:
                    continue
                rows = sum(len(tb.buffer) for tb in buffers.values()) + spilled_rows
                # Under load (the previous flush still being written) the next one grows instead of
                # queueing behind it: fewer, larger files, each one's fixed cost (fsyncs, the
                # registering commit) paid less often. Quiet, the flusher is idle: nothing changes.
                idle = rows > 0 and flusher.idle
                due = rows > 0 and (
                    flush_due(buffers, spilled_rows, idle, self.config.staging)
                    or (idle and first_change_at is not None
                        and time.monotonic() - first_change_at >= flusher.linger(policy.flush_seconds))
                    or stop.is_set()
                )
                idle_ack = rows == 0 and pending_end > self._submitted and (
                    time.monotonic() - last_ack_at >= min(policy.flush_seconds, 1.0)
                )
                if due or idle_ack:
                    self._hand_over(flusher, stream, buffers, pending_end)
                    spilled_rows = 0
                    first_change_at = None
                    last_ack_at = time.monotonic()
            # Stopping: staging that cannot take files ends the last flush instead of waiting for it.
            flusher.halt.set()
            if txn is None and (buffers or spilled_rows or pending_end > self._submitted):
                self._hand_over(flusher, stream, buffers, pending_end)
            flusher.drain(lambda: self._keep_alive(stream))
            self._ack(stream)
            self._settle(index, source, stream)
        finally:
            flusher.close()
            streamed.close()
            if self._writers is not None:
                self._writers.shutdown()
            self._writers = None
            self.connected = False
            event(log, "capture.stop", captured_lsn=fmt(self.captured_lsn))

    def _hand_over(self, flusher: Flusher, stream: ChangeStream, buffers: dict[int, TableBuffer],
                   end_lsn: int | None, committed: Committed | None = None) -> int:
        """Hand ``buffers`` (and a ``committed`` streamed transaction after them) to the flusher
        (emptied here) with the position to register after them (None: a spill, registered with the
        next; ``token``: the source's resume token there); the rows handed over."""
        job = FlushJob([(oid, tb) for oid, tb in buffers.items() if len(tb.buffer)], end_lsn,
                       self._pending_token if end_lsn is not None else None, committed)
        buffers.clear()
        flusher.submit(job, lambda: self._keep_alive(stream))
        if end_lsn is not None:
            self._submitted = max(self._submitted, end_lsn)
        return job.rows

    def _schema(self, source: Any, stream: ChangeStream, ev: Relation) -> TableSchema | None:
        """The schema a RELATION message gives (None: published, but not one of this pipeline's tables)."""
        known = self.known.get(ev.oid)
        if known is None:
            return None
        with self._source_lock:
            return self.source.relation_schema(source, stream, ev, known)

    def _make_room(self, index: LogIndex, stream: ChangeStream, stop: threading.Event, flusher: Flusher,
                   buffers: dict[int, TableBuffer], pending_end: int) -> bool:
        """Backpressure, at a transaction boundary: when over the bound, make what is buffered
        durable (emptying ``buffers``), then read no WAL (the slot keeps it) until the materializer
        has applied enough. True when it paused."""
        if not self.backpressure.over_bound(index):
            return False
        if buffers or pending_end > self._submitted:
            self._hand_over(flusher, stream, buffers, pending_end)
        flusher.drain(lambda: self._keep_alive(stream))
        self._ack(stream)
        self.backpressure.wait(index, stop, lambda: self._confirm(index, stream))
        return True

    def _write_waiting(self, buffers: list[tuple[int, TableBuffer]], halt: threading.Event) -> list[StagedFile]:
        """The flusher's thread: one file per buffered table, waiting while staging cannot take them
        (``capture.staging``) until ``halt``. Capture's thread keeps the connection alive meanwhile."""
        def write(written: list[StagedFile]) -> None:
            write_files(self.staging, buffers, written, self._writers)

        def report(error: str | None) -> None:
            self.storage_error = error

        return write_waiting(write, self.staging, self._backoff, halt, lambda: None, report)
