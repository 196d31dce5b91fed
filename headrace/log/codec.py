"""The fixed staging schema and its codec: one Parquet file per table per flush.

The schema never changes; a table's column list lives in the log entry that registers the file,
so schema evolution only ever touches target tables.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from headrace.core.changes import UNCHANGED, Value
from headrace.core.rows import unchanged_token
from headrace.log.facts import FactsRecorder, FileFacts

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


def encode_row(names: Sequence[str], values: Sequence[Value]) -> tuple[str, str | None]:
    """JSON of a tuple's values, and the comma-joined tokens (``unchanged_token``) of its unchanged TOAST columns."""
    data: dict[str, str | None] = {}
    unchanged = []
    for name, value in zip(names, values, strict=True):
        if value is UNCHANGED:
            unchanged.append(unchanged_token(name))
        else:
            data[name] = value  # type: ignore[assignment]
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")), (",".join(unchanged) or None)


@dataclass
class StagingBuffer:
    """Changes of one table waiting for the next flush, column by column, and their facts (``facts``)."""

    op: list[str] = field(default_factory=list)
    lsn: list[int] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)
    ts: list[int] = field(default_factory=list)
    xid: list[int] = field(default_factory=list)
    unchanged: list[str | None] = field(default_factory=list)
    data: list[str | None] = field(default_factory=list)
    old_key: list[str | None] = field(default_factory=list)
    nbytes: int = 0
    _facts: FactsRecorder = field(default_factory=FactsRecorder, repr=False, compare=False)

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
    ) -> None:
        self.op.append(op)
        self.lsn.append(lsn)
        self.seq.append(seq)
        self.ts.append(ts_us)
        self.xid.append(xid)
        self.unchanged.append(unchanged)
        self.data.append(data)
        self.old_key.append(old_key)
        self.nbytes += 48 + len(data or "") + len(old_key or "")
        self._facts.add(op, lsn, seq, unchanged, old_key)

    @property
    def facts(self) -> FileFacts:
        """Counts per op, the latest TRUNCATE and the TOAST/old-row flags of the rows so far."""
        return self._facts.facts()

    def __len__(self) -> int:
        return len(self.op)

    @property
    def min_lsn(self) -> int:
        return min(self.lsn)

    @property
    def max_lsn(self) -> int:
        return max(self.lsn)

    def to_table(self) -> pa.Table:
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


def write_staging_file(sink: str | Path | pa.NativeFile, buffer: StagingBuffer) -> None:
    """Encode ``buffer`` as Parquet into ``sink``: a local path (its folder is created) or an open stream.

    Not durable by itself: the staging store (``headrace.log.store``) writes through here to a
    temporary name, syncs and renames.
    """
    if isinstance(sink, (str, Path)):
        Path(sink).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(buffer.to_table(), sink, compression="zstd")


def read_staging_file(path: str | Path) -> pa.Table:
    """Read one staged file back (tests, tools); Spark reads them in bulk in the materializer."""
    return pq.read_table(path, schema=STAGING_SCHEMA)
