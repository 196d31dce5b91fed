"""Iceberg table maintenance with Iceberg's own Spark procedures (the SQL extensions spark.py loads).

Merge-on-read (see ``target.py``) leaves a position-delete file and a few small data files per
batch, and a snapshot per commit. One pass: ``rewrite_data_files`` rewrites small files, and every
file with a delete, into few large ones sorted by the table's key (deletes applied, dangling delete
files dropped);
``rewrite_position_delete_files`` compacts what deletes remain; ``expire_snapshots`` drops
snapshots past the retention (keeping the newest few, and any a consistent cut still names) and the
files only they referenced;
``remove_orphan_files`` deletes files no snapshot references (crashed writes), once old enough
that no running write can still be about to commit them; it lists every file of the table, so a
target runs it at most once a day a table (``orphans``: a crash is rare, and an orphan must be
``orphan_age_hours`` old, at least a day, before it may go).

``expire_by_count`` caps the snapshots (``maintenance.max_snapshots``) through Iceberg's Java API,
no Spark job: the run loop calls it between a table's batches, far more often than the full pass.

Iceberg commits optimistically: a rewrite whose files an apply changed meanwhile fails its
validation and is not committed (apply wins). ``partial-progress`` commits file groups one by one,
so a conflict loses one group's work, and the pass is retried a few times.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from pyspark.sql import SparkSession

from headrace.core.maintenance import MaintenancePolicy, TableFiles
from headrace.logs import event
from headrace.targets.iceberg.catalog import java_table

log = logging.getLogger("headrace.targets.iceberg.maintenance")

ATTEMPTS = 3  # a pass that lost every attempt to concurrent applies runs again at the next schedule
ORPHANS_EVERY_S = 86_400.0  # a target lists a table's files for orphans at most this often
REWRITE_OPTIONS = {
    "min-input-files": "2",  # two small files are worth one
    "delete-file-threshold": "1",  # any data file with a delete is rewritten, deletes applied
    "partial-progress.enabled": "true",  # commit groups one by one: a conflict loses one group
    "partial-progress.max-commits": "10",
    "remove-dangling-deletes": "true",  # delete files whose data files were rewritten away
}


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _timestamp(moment: datetime) -> str:
    return f"TIMESTAMP '{moment.astimezone(timezone.utc).strftime('%Y-%m-%d %H:%M:%S.%f')}'"


def table_files(spark: SparkSession, name: str) -> TableFiles:
    """Counts from the ``data_files``, ``delete_files`` and ``snapshots`` metadata tables
    (manifests only; no data file is read)."""
    data = spark.sql(f"SELECT count(*), coalesce(sum(file_size_in_bytes), 0) FROM {name}.data_files").first()
    deletes = spark.sql(f"SELECT count(*), coalesce(sum(file_size_in_bytes), 0) FROM {name}.delete_files").first()
    snapshots = spark.sql(f"SELECT count(*) FROM {name}.snapshots").first()
    assert data is not None and deletes is not None and snapshots is not None
    return TableFiles(data_files=int(data[0]), delete_files=int(deletes[0]), snapshots=int(snapshots[0]),
                      bytes=int(data[1]) + int(deletes[1]))


def maintain(spark: SparkSession, catalog: str, identifier: str, policy: MaintenancePolicy,
             key: tuple[str, ...] = (), orphans: bool = True) -> None:
    """One maintenance pass over ``catalog``.``identifier`` (``identifier``: quoted namespace.table);
    ``orphans``: with ``remove_orphan_files``.

    Retried up to ``ATTEMPTS`` times on a commit conflict; the rows never change.
    """
    for attempt in range(1, ATTEMPTS + 1):
        try:
            _pass(spark, catalog, identifier, policy, key, orphans)
            return
        except Exception as exc:
            if attempt == ATTEMPTS or not _conflict(exc):
                raise
            event(log, "maintenance.conflict", logging.INFO, table=identifier, attempt=attempt,
                  error=_cause(exc))
            time.sleep(0.5 * attempt)


def _cause(exc: Exception) -> str:
    """The Java exception's line, not Py4J's "An error occurred while calling o65.sql"."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return next((line for line in lines if "Exception:" in line), lines[0] if lines else type(exc).__name__)[:300]


def _conflict(exc: Exception) -> bool:
    """A concurrent commit won: worth another attempt on the refreshed table."""
    text = str(exc)
    return any(marker in text for marker in ("CommitFailedException", "ValidationException",
                                             "Cannot commit", "conflicting files", "Found conflicting"))


def _sort_order(key: tuple[str, ...]) -> str:
    """The ``sort_order`` argument of ``rewrite_data_files``: the key's columns, ascending."""
    return ", ".join("`" + k.replace("`", "``") + "` ASC NULLS LAST" for k in key)


def _expire_before(spark: SparkSession, name: str, policy: MaintenancePolicy, now: datetime) -> datetime:
    """Snapshots committed before this moment are expired (all but the newest ``keep_last``): the
    retention's start, or, when a consistent cut names a snapshot (``keep_from_snapshot``) older than
    that, that snapshot's commit (Iceberg expires only what is strictly older)."""
    moment = now - timedelta(seconds=policy.retention_seconds)
    named = _named_commit_ms(java_table(spark, name), policy)
    return moment if named is None else min(moment, datetime.fromtimestamp(named / 1000, timezone.utc))


def _named_commit_ms(iceberg: Any, policy: MaintenancePolicy) -> int | None:
    """When the snapshot the newest consistent cut names (``keep_from_snapshot``) was committed, in
    epoch milliseconds; None when no cut names one, or it is expired already (by a pass before cuts
    named it): nothing left to keep."""
    if policy.keep_from_snapshot is None:
        return None
    named = iceberg.snapshot(int(policy.keep_from_snapshot))
    return None if named is None else int(named.timestampMillis())


def expire_by_count(spark: SparkSession, name: str, policy: MaintenancePolicy) -> int:
    """Expire the oldest snapshots of table ``name`` (Spark's name for it) beyond half of
    ``policy.max_snapshots`` (at least ``keep_last``), whatever their age; never the one
    ``keep_from_snapshot`` names, nor a later one. Through Iceberg's Java API on the table Spark's
    catalog caches: one metadata commit, and the files only the expired snapshots referenced
    deleted; no Spark job. Returns the number expired (0: none beyond half the cap)."""
    if policy.max_snapshots is None:
        return 0
    iceberg = java_table(spark, name)
    iceberg.refresh()
    jvm: Any = spark.sparkContext._jvm
    iterables = jvm.org.apache.iceberg.relocated.com.google.common.collect.Iterables
    count = int(iterables.size(iceberg.snapshots()))
    keep = max(policy.max_snapshots // 2, policy.keep_last)
    if count <= keep:  # the run loop calls it every max_snapshots / 2 batches: never more than the cap
        return 0
    before = int(time.time() * 1000)  # every snapshot but the newest ``keep`` ...
    named = _named_commit_ms(iceberg, policy)  # ... and those from the one a consistent cut names
    if named is not None:
        before = min(before, named)
    iceberg.expireSnapshots().expireOlderThan(before).retainLast(keep).commit()
    iceberg.refresh()
    return count - int(iterables.size(iceberg.snapshots()))


def _pass(spark: SparkSession, catalog: str, identifier: str, policy: MaintenancePolicy, key: tuple[str, ...],
          orphans: bool) -> None:
    call = f"CALL `{catalog.replace('`', '``')}`.system"
    table = f"table => {_literal(identifier)}"
    options = ", ".join(f"{_literal(k)}, {_literal(v)}" for k, v in REWRITE_OPTIONS.items())
    # Sorted by the key, the rewritten files cover disjoint key ranges: a batch's key bounds
    # (``merge.py``) then skip every file outside them. Merges leave files spanning their batch's
    # keys (a random-key batch: nearly all of them), so compaction is what restores the layout.
    strategy = f", strategy => 'sort', sort_order => {_literal(_sort_order(key))}" if key else ""
    rewritten = spark.sql(f"{call}.rewrite_data_files({table}{strategy}, options => map({options}))").first()
    name = f"`{catalog.replace('`', '``')}`.{identifier}"
    deletes_left = table_files(spark, name).delete_files
    if deletes_left:
        spark.sql(f"{call}.rewrite_position_delete_files({table}, "
                  "options => map('rewrite-all', 'true'))").collect()
    now = datetime.now(timezone.utc)
    expired = spark.sql(
        f"{call}.expire_snapshots({table}, "
        f"older_than => {_timestamp(_expire_before(spark, name, policy, now))}, "
        f"retain_last => {policy.keep_last})"
    ).first()
    capped = expire_by_count(spark, name, policy)
    removed = spark.sql(
        f"{call}.remove_orphan_files({table}, "
        f"older_than => {_timestamp(now - timedelta(seconds=policy.orphan_age_seconds))})"
    ).count() if orphans else None
    event(log, "maintenance.iceberg", table=identifier,
          rewritten_files=int(rewritten[0]) if rewritten else 0, added_files=int(rewritten[1]) if rewritten else 0,
          deletes_left=deletes_left, expired_data_files=int(expired[0]) if expired else 0,
          snapshots_over_cap=capped, orphans_removed=removed)
