"""Table maintenance vocabulary: the policy a target follows and the file counts it reports."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MaintenancePolicy:
    """What one maintenance pass of a table does (from the ``maintenance:`` config section)."""

    retention_seconds: float  # snapshots older than this are expired ...
    keep_last: int  # ... but the newest ``keep_last`` snapshots always stay
    orphan_age_seconds: float  # files no snapshot references are removed once this old
    # The snapshot the newest consistent cut names for the table (``apply.consistency: transaction`` on a
    # target that commits one table at a time): neither it nor a later one is expired, however old.
    keep_from_snapshot: int | None = None
    # At most this many snapshots a table (the newest; ``expire_snapshots``), whatever their age; None: no cap.
    max_snapshots: int | None = None


@dataclass(frozen=True)
class TableFiles:
    """A table's files, read from its metadata (no data file is opened).

    ``snapshots`` counts the table's snapshots (Iceberg) or the lake's (DuckLake: snapshots are
    lake-wide there).
    """

    data_files: int
    delete_files: int
    snapshots: int
    bytes: int  # data and delete files together

    def as_dict(self) -> dict[str, int]:
        """JSON-able counts (status, API)."""
        return {"data_files": self.data_files, "delete_files": self.delete_files,
                "snapshots": self.snapshots, "bytes": self.bytes}
