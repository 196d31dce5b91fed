"""Transactions streamed while in progress (PostgreSQL's protocol 2+): staged to spill files, not memory.

A transaction larger than the server's ``logical_decoding_work_mem`` arrives in blocks while it runs,
between other transactions' changes, and ends with a Stream Commit or a Stream Abort. Each change is
staged as it arrives, into the transaction's own buffers (``StreamedTransactions``), with the xid of
the subtransaction it belongs to beside it; once the buffers of every in-progress transaction
together pass ``staging.flush_bytes`` they are written to Arrow files (lz4) in a folder per
transaction, and the memory is free again.

At Stream Commit the transaction's parts (spill files and what is still buffered) go to the flusher
(``Committed.finish``, on its thread): the rows of subtransactions rolled back (Stream Abort of a
subxact) are left out, every row gets the commit's LSN and time, and each part becomes a staged
file, registered with the commit's end position in the same state transaction as the changes
buffered before it: exactly where a transaction sent whole at its commit (protocol 1) would be.
Nothing is confirmed to the slot before that registration, so a crash loses nothing: the server
streams every transaction still in progress again from its start, and the spill folder, whose
files no one else reads, is emptied when capture (re)connects. A Stream Abort deletes the folder.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections import ChainMap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from headrace.capture.buffer import TableBuffer, stage
from headrace.core.changes import (
    Begin,
    Delete,
    Insert,
    Relation,
    StreamAbort,
    StreamCommit,
    Streamed,
    StreamStart,
    StreamStop,
    Truncate,
    Update,
)
from headrace.core.position import Position
from headrace.core.schema import TableSchema
from headrace.core.undecoded import UndecodedCodec
from headrace.log.codec import STAGING_SCHEMA
from headrace.log.facts import FileFacts
from headrace.log.index import StagedFile
from headrace.log.store import StagingStore
from headrace.logs import event

log = logging.getLogger("headrace.capture")

# Parts finished side by side at a commit: reading, Parquet and fsync release the GIL (two: the
# machines measured have two cores; each holds one part in memory).
FINISH_THREADS = 2
SPILL_SCHEMA = STAGING_SCHEMA.append(pa.field("_subxid", pa.int64(), nullable=False))
_OPTIONS = ipc.IpcWriteOptions(compression="lz4")


@dataclass
class _Part:
    """Rows of one table under one schema: a spill file, or (at commit) what was still buffered."""

    oid: int
    schema: TableSchema
    path: Path | None = None
    table: pa.Table | None = None

    def read(self) -> pa.Table:
        if self.table is not None:
            return self.table
        assert self.path is not None
        with ipc.open_file(pa.memory_map(str(self.path))) as reader:
            return reader.read_all()


@dataclass
class _InProgress:
    """One streamed transaction not committed yet."""

    xid: int
    folder: Path
    relations: dict[int, TableSchema] = field(default_factory=dict)  # from RELATION messages in its blocks
    buffers: dict[int, TableBuffer] = field(default_factory=dict)
    # Per buffered table, the subtransaction of its rows as runs: (the run's first row, its xid). A
    # change is one row, and the xid mostly stays the same for millions of them.
    runs: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    last_subxid: dict[int, int] = field(default_factory=dict)  # per buffered table, its last run's
    parts: list[_Part] = field(default_factory=list)
    aborted: set[int] = field(default_factory=set)  # subtransactions rolled back
    seq: int = 0
    nbytes: int = 0
    # What staging a change of it takes besides the change, made once (not per change).
    begin: Begin = field(init=False)
    view: ChainMap[int, TableSchema] = field(init=False)  # its RELATIONs, then capture's


@dataclass
class Committed:
    """A committed streamed transaction on its way to the staged log (the flusher's thread)."""

    xid: int
    commit_lsn: int
    commit_ts_us: int
    parts: list[_Part]
    aborted: frozenset[int]
    folder: Path
    relations: dict[int, TableSchema]  # the schemas its blocks' RELATION messages gave

    def finish(self, store: StagingStore, max_rows: int) -> list[StagedFile]:
        """Its parts as staged files of at most ``max_rows`` rows each (an apply batch on the driver
        takes a few whole files): rolled-back subtransactions' rows out, the commit's LSN and time in."""
        with ThreadPoolExecutor(FINISH_THREADS, thread_name_prefix="capture-finish") as pool:
            per_part = list(pool.map(lambda part: self._finish(store, part, max_rows), self.parts))
        return [f for files in per_part for f in files]

    def _finish(self, store: StagingStore, part: _Part, max_rows: int) -> list[StagedFile]:
        table = part.read()
        if self.aborted:
            table = table.filter(pc.invert(pc.is_in(table["_subxid"], pa.array(sorted(self.aborted), pa.int64()))))
        n = table.num_rows
        table = table.drop_columns(["_subxid"])
        table = table.set_column(1, STAGING_SCHEMA.field("_lsn"), pa.array(np.full(n, self.commit_lsn, np.int64)))
        table = table.set_column(3, STAGING_SCHEMA.field("_ts"), pa.array(
            np.full(n, self.commit_ts_us, np.int64)).cast(pa.timestamp("us", tz="UTC")))
        return [self._staged(store, part, table.slice(start, max_rows)) for start in range(0, n, max_rows)]

    def _staged(self, store: StagingStore, part: _Part, table: pa.Table) -> StagedFile:
        location, size = store.write_table(part.oid, table, self.commit_lsn)
        return StagedFile(part.oid, location, table.num_rows, size, self.commit_lsn, self.commit_lsn, part.schema,
                          table_facts(table))

    def discard(self) -> None:
        """Delete its spill files (once its staged files are registered)."""
        shutil.rmtree(self.folder, ignore_errors=True)


class StreamedTransactions:
    """The streamed transactions in progress on one replication connection, and their spill folder.

    ``relations`` is capture's own map of the tables' schemas (outside blocks), which a block's
    changes fall back on; ``schema_of`` makes a RELATION message a schema (None: not this
    pipeline's table); ``codec`` stages changes left in their bytes. ``limit``: the bytes all of
    them may buffer before they are spilled.
    """

    def __init__(self, folder: Path, relations: dict[int, TableSchema],
                 schema_of: Callable[[Relation], TableSchema | None], codec: UndecodedCodec | None,
                 limit: int) -> None:
        self.folder = folder
        self.limit = limit
        self._relations = relations
        self._schema_of = schema_of
        self._codec = codec.streamed if codec is not None else None
        self._open: dict[int, _InProgress] = {}
        self._current: _InProgress | None = None
        self._files = 0
        shutil.rmtree(folder, ignore_errors=True)  # a crash's leftovers: the server streams them again

    @property
    def nbytes(self) -> int:
        """Bytes buffered in memory by every streamed transaction in progress."""
        return sum(tx.nbytes for tx in self._open.values())

    @property
    def in_progress(self) -> int:
        return len(self._open)

    def message(self, ev: object) -> bool:
        """A StreamStart, StreamStop, StreamAbort or a ``Streamed`` message of the open block;
        whether a block is open after it."""
        match ev:
            case StreamStart():
                self.start(ev.xid, ev.first)
            case StreamStop():
                self.stop()
            case StreamAbort():
                self.abort(ev.xid, ev.subxid)
            case Streamed() | bytes():
                self.take(ev)
        return self._current is not None  # anything else (no source sends it) is left alone

    def start(self, xid: int, first: bool) -> None:
        """A block of ``xid``'s changes begins."""
        tx = self._open.get(xid)
        if tx is None or first:
            if tx is not None:
                self._drop(tx)
            tx = self._open[xid] = _InProgress(xid, self.folder / str(xid))
            tx.begin, tx.view = Begin(0, 0, xid), ChainMap(tx.relations, self._relations)
        self._current = tx

    def stop(self) -> None:
        """The block ends: spill if the buffers are over the limit."""
        self._current = None
        if self.nbytes > self.limit:
            self.spill()

    def take(self, ev: object) -> None:
        """A message of the current block: a change (``Streamed`` or its bytes) or a RELATION."""
        tx = self._current
        if tx is None:
            raise RuntimeError("a streamed change outside a Stream Start ... Stop block")
        if type(ev) is bytes:  # the path of millions of changes a transaction: as little as it takes
            codec = self._codec
            assert codec is not None and codec.xid is not None
            oid, subxid = codec.relation_oid(ev), codec.xid(ev)
            if tx.last_subxid.get(oid) != subxid:
                _new_run(tx, oid, subxid)
            tx.seq += 1
            tx.nbytes += stage(ev, tx.begin, tx.seq, tx.view, tx.buffers, codec)
        else:
            assert isinstance(ev, Streamed)
            change = ev.event
            match change:
                case Insert() | Update() | Delete():
                    oids: tuple[int, ...] = (change.relation_oid,)
                case Truncate():
                    oids = change.relation_oids
                case Relation():
                    self._relation(tx, change)
                    return
                case _:
                    return  # TYPE, ORIGIN, a logical message: nothing to stage
            for oid in oids:
                if tx.last_subxid.get(oid) != ev.xid:
                    _new_run(tx, oid, ev.xid)
            tx.seq += 1
            tx.nbytes += stage(change, tx.begin, tx.seq, tx.view, tx.buffers, self._codec)
        if tx.nbytes > self.limit:
            self.spill()

    def abort(self, xid: int, subxid: int) -> None:
        """Stream Abort: the whole transaction (its spill deleted) or one subtransaction's changes."""
        tx = self._open.get(xid)
        if tx is None:
            return
        if subxid == xid:
            del self._open[xid]
            self._drop(tx)
            event(log, "capture.streamed_abort", xid=xid, spilled_files=len(tx.parts))
        else:
            tx.aborted.add(subxid)

    def commit(self, ev: StreamCommit) -> Committed | None:
        """Stream Commit: the transaction's parts for the flusher (None: nothing of it was streamed)."""
        tx = self._open.pop(ev.xid, None)
        if tx is None:
            return None
        spilled = len(tx.parts)
        for oid, tb in tx.buffers.items():
            if len(tb.buffer):
                tx.parts.append(_Part(oid, tb.schema, table=_with_subxids(tb, tx.runs[oid])))
        event(log, "capture.streamed_commit", xid=tx.xid, spilled_files=spilled, parts=len(tx.parts),
              subtransactions_rolled_back=len(tx.aborted))
        return Committed(tx.xid, ev.commit_lsn, ev.commit_ts_us, tx.parts, frozenset(tx.aborted), tx.folder,
                         tx.relations)

    def spill(self) -> None:
        """Write every in-progress transaction's buffers to its spill folder."""
        for tx in self._open.values():
            for oid in list(tx.buffers):
                self._spill_table(tx, oid)
            tx.nbytes = 0

    def close(self) -> None:
        """Forget every transaction in progress and empty the spill folder (the connection is gone)."""
        self._open.clear()
        self._current = None
        shutil.rmtree(self.folder, ignore_errors=True)

    def _relation(self, tx: _InProgress, ev: Relation) -> None:
        schema = self._schema_of(ev)
        if schema is None:
            return
        tb = tx.buffers.get(ev.oid)
        if tb is not None and tb.schema != schema and len(tb.buffer):
            self._spill_table(tx, ev.oid)  # one part holds one shape: cut at the schema change
        tx.relations[ev.oid] = schema

    def _spill_table(self, tx: _InProgress, oid: int) -> None:
        tb = tx.buffers.pop(oid)
        runs = tx.runs.pop(oid, [])
        tx.last_subxid.pop(oid, None)
        if not len(tb.buffer):
            return
        tx.folder.mkdir(parents=True, exist_ok=True)
        self._files += 1
        path = tx.folder / f"{self._files:08d}-{oid}.arrow"
        table = _with_subxids(tb, runs)
        with ipc.new_file(str(path), SPILL_SCHEMA, options=_OPTIONS) as writer:
            writer.write_table(table)
        tx.parts.append(_Part(oid, tb.schema, path=path))

    def _drop(self, tx: _InProgress) -> None:
        if self._current is tx:
            self._current = None
        with contextlib.suppress(OSError):
            shutil.rmtree(tx.folder)


def table_facts(table: pa.Table) -> FileFacts:
    """``facts_of`` over a table of the staging schema, counted by Arrow (no Python value per row)."""
    op, unchanged, old_key = table["_op"], table["_unchanged_cols"], table["_old_key"]
    counts = {str(c["values"]): int(c["counts"]) for c in pc.value_counts(op).to_pylist()}
    updates = pc.equal(op, "U")
    last_truncate = None
    if counts.get("T"):
        truncates = table.filter(pc.equal(op, "T"))
        last_truncate = Position(*max(zip(truncates["_lsn"].to_pylist(), truncates["_seq"].to_pylist(), strict=True)))
    any_unchanged = unchanged.null_count != len(unchanged)
    key_toast = any_unchanged and bool(pc.any(pc.and_(pc.and_(updates, pc.is_valid(old_key)), pc.is_valid(unchanged))).as_py())
    latest = pc.max(table["_ts"].cast(pa.int64())).as_py()
    return FileFacts(counts.get("I", 0), counts.get("U", 0), counts.get("D", 0), counts.get("T", 0), last_truncate,
                     any_unchanged, bool(pc.any(pc.and_(updates, pc.is_null(old_key))).as_py()), key_toast, latest)


def _new_run(tx: _InProgress, oid: int, subxid: int) -> None:
    """The next change of table ``oid`` in ``tx`` is of subtransaction ``subxid``, not its last one's."""
    tb = tx.buffers.get(oid)
    tx.runs.setdefault(oid, []).append((0 if tb is None else len(tb.buffer), subxid))
    tx.last_subxid[oid] = subxid


def _with_subxids(tb: TableBuffer, runs: list[tuple[int, int]]) -> pa.Table:
    """The buffer's rows with the ``_subxid`` column its ``runs`` (first row, xid) spell."""
    rows = len(tb.buffer)
    starts = np.array([start for start, _ in runs] + [rows], np.int64)
    subxids = np.repeat(np.array([xid for _, xid in runs], np.int64), np.diff(starts))
    return tb.buffer.to_table().append_column(SPILL_SCHEMA.field("_subxid"), pa.array(subxids, pa.int64()))
