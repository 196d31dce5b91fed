"""The fixed staging schema and its codec: one Parquet file per table per flush.

The schema never changes; a table's column list lives in the log entry that registers the file,
so schema evolution only ever touches target tables.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from headrace.core.changes import UNCHANGED, Value
from headrace.core.rows import unchanged_token
from headrace.log.facts import FileFacts, facts_of

STAGING_SCHEMA = pa.schema(
    [
        pa.field("_op", pa.string(), nullable=False),  # I, U, D, T
        pa.field("_lsn", pa.int64(), nullable=False),  # commit LSN of the source transaction
        pa.field("_seq", pa.int64(), nullable=False),  # ordinal of the change inside its transaction
        pa.field("_ts", pa.timestamp("us", tz="UTC"), nullable=False),  # source commit time
        pa.field("_xid", pa.int64(), nullable=False),
        pa.field("_unchanged_cols", pa.string()),  # comma-separated unchanged TOAST columns
        pa.field("_data", pa.string()),  # JSON: column name -> PostgreSQL text value (null = NULL)
        pa.field("_old_key", pa.string()),  # JSON of the old key when an update changed the key
    ]
)

# The same schema as Spark DDL, so Spark reads staged files without inferring anything.
STAGING_SPARK_DDL = (
    "_op STRING, _lsn BIGINT, _seq BIGINT, _ts TIMESTAMP, _xid BIGINT, "
    "_unchanged_cols STRING, _data STRING, _old_key STRING"
)


# The native row encoder (headrace/_speedups.c, built by setup.py when a C compiler is there): the
# same JSON, byte for byte, as the Python join below; without it, the join.
try:
    from headrace._speedups import encode_object as _native_encode
except ImportError:
    _native_encode = None
_native_object: Callable[[tuple[str, ...], Sequence[Value]], str | None] | None = _native_encode


class RowEncoder:
    """Encodes rows of one column list as ``_data`` JSON: the object keys are escaped once, here.

    Capture's hot path: a row is one string join instead of a dict and ``json.dumps``. The text is
    escaped by ``encode_basestring``, the function ``json.dumps(..., ensure_ascii=False)`` itself
    uses, so the JSON is byte for byte what ``json.dumps`` of the row's dict gives.
    """

    __slots__ = ("keys", "names")

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.keys = tuple(encode_basestring(name) + ":" for name in names)

    def encode(self, values: Sequence[Value]) -> tuple[str, str | None]:
        """JSON object of the columns' values, and the comma-joined tokens (``unchanged_token``) of
        the columns whose value is ``UNCHANGED`` (left out of the object)."""
        keys = self.keys
        if _native_object is not None:
            data = _native_object(keys, values)
            if data is not None:
                return data, None
            # None: an UNCHANGED marker (or a value that is not text) is in the row: below.
        if len(keys) != len(values):
            raise ValueError(f"a row of {len(values)} values for the {len(keys)} columns {', '.join(self.names)}")
        try:
            return "{" + ",".join([k + ("null" if v is None else encode_basestring(v))  # type: ignore[arg-type]
                                   for k, v in zip(keys, values, strict=False)]) + "}", None  # lengths checked
        except TypeError:  # encode_basestring takes only str: an UNCHANGED marker is in the row
            pass
        parts, unchanged = [], []
        for name, key, value in zip(self.names, keys, values, strict=True):
            if value is UNCHANGED:
                unchanged.append(unchanged_token(name))
            else:
                parts.append(key + json.dumps(value, ensure_ascii=False, separators=(",", ":")))
        return "{" + ",".join(parts) + "}", (",".join(unchanged) or None)


@lru_cache(maxsize=1024)
def row_encoder(names: tuple[str, ...]) -> RowEncoder:
    """The (shared) encoder of rows with columns ``names``."""
    return RowEncoder(names)


def encode_row(names: Sequence[str], values: Sequence[Value]) -> tuple[str, str | None]:
    """JSON of a tuple's values, and the comma-joined tokens (``unchanged_token``) of its unchanged TOAST columns."""
    return row_encoder(tuple(names)).encode(values)


@dataclass
class StagingBuffer:
    """Changes of one table waiting for the next flush, column by column, and their facts (``facts``).

    The facts are found over the columns when asked for (at the flush), not row by row.
    """

    op: list[str] = field(default_factory=list)
    lsn: list[int] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)
    ts: list[int] = field(default_factory=list)
    xid: list[int] = field(default_factory=list)
    unchanged: list[str | None] = field(default_factory=list)
    data: list[str | None] = field(default_factory=list)
    old_key: list[str | None] = field(default_factory=list)
    nbytes: int = 0
    # The eight lists in the staging schema's order, for a stager that appends to them itself
    # (``core.undecoded``): one C call a change instead of ``append``'s eight list appends.
    columns: tuple[list[Any], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.columns = (self.op, self.lsn, self.seq, self.ts, self.xid, self.unchanged, self.data, self.old_key)

    def append(
        self,
        op: str,
        lsn: int,
        seq: int,
        ts_us: int,
        xid: int,
        data: str | None,
        unchanged: str | None = None,
        old_key: str | None = None,
    ) -> int:
        """Add one staged row; the bytes it adds to ``nbytes``."""
        self.op.append(op)
        self.lsn.append(lsn)
        self.seq.append(seq)
        self.ts.append(ts_us)
        self.xid.append(xid)
        self.unchanged.append(unchanged)
        self.data.append(data)
        self.old_key.append(old_key)
        added = 48 + len(data or "") + len(old_key or "")
        self.nbytes += added
        return added

    @property
    def facts(self) -> FileFacts:
        """Counts per op, the latest TRUNCATE and the TOAST/old-row flags of the rows so far."""
        return facts_of(self.op, self.lsn, self.seq, self.unchanged, self.old_key, self.ts)

    def __len__(self) -> int:
        return len(self.op)

    @property
    def min_lsn(self) -> int:
        return min(self.lsn)

    @property
    def max_lsn(self) -> int:
        return max(self.lsn)

    def to_table(self) -> pa.Table:
        """The rows as an Arrow table of ``STAGING_SCHEMA``."""
        return pa.Table.from_arrays(
            [
                pa.array(self.op, pa.string()),
                pa.array(self.lsn, pa.int64()),
                pa.array(self.seq, pa.int64()),
                pa.array(self.ts, pa.timestamp("us", tz="UTC")),
                pa.array(self.xid, pa.int64()),
                pa.array(self.unchanged, pa.string()),
                pa.array(self.data, pa.string()),
                pa.array(self.old_key, pa.string()),
            ],
            schema=STAGING_SCHEMA,
        )


def write_staging_file(sink: str | Path | pa.NativeFile, buffer: StagingBuffer | pa.Table) -> None:
    """Encode ``buffer`` (or a table of ``STAGING_SCHEMA``) as Parquet into ``sink``: a local path (its
    folder is created) or an open stream.

    Not durable by itself: the staging store (``headrace.log.store``) writes through here to a
    temporary name, syncs and renames.
    """
    if isinstance(sink, (str, Path)):
        Path(sink).parent.mkdir(parents=True, exist_ok=True)
    table = buffer if isinstance(buffer, pa.Table) else buffer.to_table()
    pq.write_table(table, sink, compression="zstd")


def read_staging_file(path: str | Path) -> pa.Table:
    """Read one staged file back (the driver's batches, tests, tools); Spark reads them in bulk in the
    materializer. An ``s3://`` location is read from the configured object store (``headrace.storage``)."""
    if isinstance(path, str) and "://" in path:
        from headrace import storage
        from headrace.log import recent

        kept = recent.read(path)
        if kept is not None:  # written by this process a moment ago: no round trips to the store
            return pq.read_table(pa.BufferReader(kept), schema=STAGING_SCHEMA)

        filesystem, fs_path = storage.filesystem(path)
        return pq.read_table(fs_path, schema=STAGING_SCHEMA, filesystem=filesystem)
    return pq.read_table(path, schema=STAGING_SCHEMA)
