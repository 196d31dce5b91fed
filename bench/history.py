"""History modes' apply rate beside the mirror's, measured in the same run (component level).

Staged files of mixed changes (60% update, 25% insert, 15% delete, transactions of ``--txn`` changes,
random keys of ``--keys``) are applied to a DuckLake table the way ``execute_batch`` does on the
driver lane (the default engine): the history tables first (``history.writer.apply_history``), then
the mirror (``read_driver_batch`` + ``apply_arrow_batch``). One lake per run, the same files for
each: the mirror alone (the reference, run first and last), each mode alone (the table in that one
mode under its own name, no mirror: ``history: mode: X``), and with ``--beside`` each mode beside the
mirror (``[mirror, X]``). Capture and PostgreSQL are not in it: this is the materializer's cost,
where the modes differ.

Then the scd2 growth check: the same bursts (``--repeat``, the median) applied into a table in mode scd2 after ``--history``
bursts and after ten times as many (so ~10x the versions); the ratio of the two times.

    .venv/bin/python bench/history.py                       # 100,000 changes, 20,000 keys (~1 min)
    .venv/bin/python bench/history.py --changes 20000 --keys 5000 --history 2
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind  # noqa: E402
from headrace.core.spark_types import ValueRules
from headrace.engines.driver.batch import read_driver_batch
from headrace.history.config import Mode  # noqa: E402
from headrace.history.writer import apply_history  # noqa: E402
from headrace.log.codec import StagingBuffer, encode_row, write_staging_file  # noqa: E402
from headrace.log.facts import FileFacts  # noqa: E402
from headrace.targets.ducklake.config import DuckLakeConfig  # noqa: E402
from headrace.targets.ducklake.target import DuckLakeTarget  # noqa: E402

TEXT = ColumnType(TypeKind.STRING, "text")
TABLE = TableSchema(oid=1, schema="public", name="acct",
                    columns=(Column("id", ColumnType(TypeKind.LONG, "bigint"), 20, nullable=False),
                             Column("name", TEXT, 25), Column("bal", ColumnType(TypeKind.LONG, "bigint"), 20)),
                    key=("id",))


class Workload:
    """Mixed changes staged into files, the source's keys followed so every change is valid."""

    def __init__(self, folder: Path, keys: int, txn: int, seed: int) -> None:
        self.folder, self.txn, self.rng = folder, txn, random.Random(seed)
        self.live: list[int] = list(range(keys))
        self.next_key, self.lsn, self.files = keys, 1000, 0
        self.facts: dict[str, FileFacts] = {}

    def seed_file(self) -> str:
        buf = StagingBuffer()
        self.lsn += 1
        for seq, key in enumerate(self.live, 1):
            buf.append("I", self.lsn, seq, 1_700_000_000_000_000 + self.lsn, self.lsn,
                       encode_row(("id", "name", "bal"), (str(key), f"n{key}", "0"))[0], None, None)
        return self._write(buf)

    def file(self, changes: int) -> str:
        buf = StagingBuffer()
        seq = 0
        for i in range(changes):
            if i % self.txn == 0:
                self.lsn, seq = self.lsn + 1, 0
            seq += 1
            roll = self.rng.random()
            ts = 1_700_000_000_000_000 + self.lsn * 1000
            if roll < 0.25 or not self.live:
                key, self.next_key = self.next_key, self.next_key + 1
                self.live.append(key)
                buf.append("I", self.lsn, seq, ts, self.lsn,
                           encode_row(("id", "name", "bal"), (str(key), f"n{key}", "0"))[0], None, None)
            elif roll < 0.85:
                key = self.rng.choice(self.live)
                buf.append("U", self.lsn, seq, ts, self.lsn,
                           encode_row(("id", "name", "bal"), (str(key), f"n{key}", str(i)))[0], None, None)
            else:
                key = self.live.pop(self.rng.randrange(len(self.live)))
                buf.append("D", self.lsn, seq, ts, self.lsn, json.dumps({"id": str(key)}), None, None)
        return self._write(buf)

    def _write(self, buf: StagingBuffer) -> str:
        path = str(self.folder / f"{self.files}.parquet")
        self.files += 1
        write_staging_file(path, buf)
        self.facts[path] = buf.facts
        return path


def apply(lake: DuckLakeTarget, modes: tuple[Mode, ...], files: list[str], first: int, facts: dict[str, FileFacts],
          per_batch: int, own: bool = False) -> float:
    """Apply ``files`` (offsets from ``first``) in batches of ``per_batch`` files; seconds taken. ``own``:
    the table is its one mode under its own name (no mirror)."""
    started = time.perf_counter()
    for at in range(0, len(files), per_batch):
        paths = files[at:at + per_batch]
        cursor = first + at - 1
        entries = [(cursor + 1 + i, p) for i, p in enumerate(paths)]
        if modes:
            apply_history(lake.history(), TABLE, modes, entries, None, ValueRules(), cursor, own)
        if own:
            continue
        built = read_driver_batch(paths, TABLE, None, ValueRules(), [facts[p] for p in paths])
        lake.apply_arrow_batch(TABLE, built.changes, built.truncate_before, entries[-1][0])
    return time.perf_counter() - started


def open_lake(root: Path) -> DuckLakeTarget:
    return DuckLakeTarget(None, DuckLakeConfig(catalog=str(root / "meta.ducklake"),  # type: ignore[arg-type]
                                               data_path=str(root / "data")), "bench")


def rates(args: argparse.Namespace, root: Path) -> None:
    work = Workload(root / "staged", args.keys, args.txn, seed=1)
    (root / "staged").mkdir()
    seed = work.seed_file()
    files = [work.file(args.file_changes) for _ in range(args.changes // args.file_changes)]
    results: dict[str, float] = {}
    runs: list[tuple[str, tuple[Mode, ...], bool]] = [("mirror", (), False)]
    for mode in ("changelog", "scd2", "soft_delete"):
        runs.append((f"{mode} alone", (mode,), True))  # type: ignore[arg-type]
    if args.beside:
        runs += [(f"mirror + {m}", (m,), False) for m in ("changelog", "scd2", "soft_delete")]  # type: ignore[misc]
    runs.append(("mirror (again)", (), False))
    for label, modes, own in runs:
        lake = open_lake(root / label.replace(" ", "_").replace("+", "and").strip("()"))
        lake.ensure_table(TABLE)
        apply(lake, (), [seed], 1, work.facts, 1)  # the copy: not timed
        if own:  # the table becomes the mode's table at its first batch: not timed either
            lake.history().start(TABLE, modes[0], 1, own=True)
        seconds = apply(lake, modes, files, 2, work.facts, args.batch_files, own)
        results[label] = len(files) * args.file_changes / seconds
        lake.close()
    reference = (results["mirror"] + results["mirror (again)"]) / 2
    print(f"{args.changes} changes, {args.keys} keys, {args.file_changes} changes a file, {args.batch_files} files a batch")
    for label, rate in results.items():
        print(f"  {label:16} {rate:10,.0f} changes/s  {rate / reference:5.2f}x the mirror's mean")


def _grown(args: argparse.Namespace, folder: Path, modes: tuple[Mode, ...], bursts: int) -> tuple[DuckLakeTarget, Workload, int]:
    """A lake whose table took ``bursts`` bursts (and, with ``--maintain``, a maintenance pass); the lake,
    its workload and the next staged-log offset."""
    from headrace.core.maintenance import MaintenancePolicy

    folder.mkdir()
    work = Workload(folder, args.keys, args.txn, seed=2)
    lake = open_lake(folder)
    lake.ensure_table(TABLE)
    files = [work.seed_file()] + [work.file(args.file_changes) for _ in range(bursts * args.burst_files)]
    apply(lake, (), files[:1], 1, work.facts, 1)  # the copy
    if modes:
        lake.history().start(TABLE, "scd2", 1, own=True)
    apply(lake, modes, files[1:], 2, work.facts, args.burst_files, own=bool(modes))
    if args.maintain:
        lake.maintain(TABLE, MaintenancePolicy(retention_seconds=0, keep_last=1, orphan_age_seconds=0))
    return lake, work, len(files) + 1


def scd2_growth(args: argparse.Namespace, root: Path) -> None:
    """The same bursts into a table of few and of many versions, scd2 and (the reference) the mirror; with
    ``--maintain``, each table compacted first, as the pipeline's ``maintenance:`` passes keep it. The
    two tables take their bursts in turn (small, large, small, ...), so the machine's load falls on both
    alike; each side's median counts."""
    for label, modes in (("scd2", ("scd2",)), ("mirror", ())):
        sides = [_grown(args, root / f"growth_{label}_{n}", modes, bursts)  # type: ignore[arg-type]
                 for n, bursts in (("small", args.history), ("large", args.history * args.factor))]
        rows = []  # the versions each table holds before its timed bursts (each burst adds ~4,000 to both)
        for lake, _, _ in sides:
            found = lake._con.execute("SELECT count(*) FROM hr_lake.public.acct").fetchone()
            rows.append(found[0] if found else 0)
        taken: list[list[float]] = [[], []]
        cpu: list[list[float]] = [[], []]
        for i in range(args.repeat):
            for side, (lake, work, first) in enumerate(sides):
                burst = [work.file(args.file_changes) for _ in range(args.burst_files)]
                started = time.process_time()
                taken[side].append(apply(lake, modes, burst, first + i * args.burst_files,  # type: ignore[arg-type]
                                         work.facts, args.burst_files, own=bool(modes)))
                cpu[side].append(time.process_time() - started)
        for lake, _, _ in sides:
            lake.close()
        (small, large), (c_small, c_large) = map(statistics.median, taken), map(statistics.median, cpu)
        print(f"{label} burst of {args.burst_files * args.file_changes} changes (median of {args.repeat}, taken in"
              f" turn{', after maintenance' if args.maintain else ''}): {small:.3f} s ({c_small:.3f} s CPU) into"
              f" {rows[0]} rows, {large:.3f} s ({c_large:.3f} s CPU) into {rows[1]} rows ({rows[1] / rows[0]:.1f}x):"
              f" {large / small:.2f}x ({c_large / c_small:.2f}x CPU)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--txn", type=int, default=10, help="changes per transaction")
    parser.add_argument("--file-changes", type=int, default=5_000, help="changes per staged file")
    parser.add_argument("--batch-files", type=int, default=4, help="staged files per batch")
    parser.add_argument("--history", type=int, default=3, help="bursts before the timed ones (times --factor for the large run)")
    parser.add_argument("--burst-files", type=int, default=1)
    parser.add_argument("--factor", type=int, default=25, help="the large table's bursts: --history times this")
    parser.add_argument("--maintain", action="store_true", help="compact each table before its timed bursts")
    parser.add_argument("--repeat", type=int, default=5, help="timed bursts (their median counts)")
    parser.add_argument("--beside", action="store_true", help="also each mode beside the mirror ([mirror, mode])")
    parser.add_argument("--only", choices=("rates", "growth"), help="one of the two measurements")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.only != "growth":
            rates(args, Path(tmp))
        if args.only != "rates":
            scd2_growth(args, Path(tmp))


if __name__ == "__main__":
    main()
