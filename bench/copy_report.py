"""Results of bench/initial_copy.py: per-size records, markdown tables, JSON, the plot, the estimate.

Every method's figure is set beside raw binary COPY of the same table in the same run (the faster of
the reads before and after the others, so a load spike during one read does not flatter the rest).
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from copy_methods import Measurement
from harness import pyplot, save_figure

# Rates assumed before anything is measured (2-core machine, 2026-11; rows/s unless said), replaced by
# each size's measured figures for the sizes after it.
ASSUMED = {"load": 330_000, "raw_copy": 1_500_000, "read": 600_000, "headrace_per_core": 60_000,
           "headrace_start_s": 15.0, "dlt_pyarrow": 80_000, "dlt_connectorx": 250_000, "dlt_start_s": 3.0}


@dataclass
class SizeResult:
    """Everything measured on one table size."""

    rows: int
    table_bytes: int
    load_s: float
    measurements: list[Measurement] = field(default_factory=list)
    load_avg: list[list[float]] = field(default_factory=list)  # sampled before each method
    failures: list[dict[str, str]] = field(default_factory=list)  # {"what", "error"} of methods that failed

    @property
    def raw_s(self) -> float:
        """The reference: the faster raw COPY of this size."""
        return min(m.seconds for m in self.measurements if m.method == "raw_copy")

    def rows_of(self) -> list[dict[str, Any]]:
        """One record per method (raw COPY once, its faster read), with rates and the ratio to raw COPY."""
        out = []
        raws = [m for m in self.measurements if m.method == "raw_copy"]
        reference = min(raws, key=lambda r: r.seconds)
        for m in [reference] + [m for m in self.measurements if m.method != "raw_copy"]:
            record = {**asdict(m), "seconds": round(m.seconds, 3), "rows_per_s": round(self.rows / m.seconds),
                      "mb_per_s": round(self.table_bytes / 2**20 / m.seconds, 1),
                      "vs_raw_copy": round(self.raw_s / m.seconds, 3)}
            if m.method == "raw_copy":
                record["detail"] = {"reads_s": [round(r.seconds, 3) for r in raws]}
            if m.detail.get("copy_s"):  # headrace: the copy alone, from its snapshot.done event
                record["copy_rows_per_s"] = round(self.rows / m.detail["copy_s"])
            out.append(record)
        return out

    def to_json(self) -> dict[str, Any]:
        """The size's record as written by ``--json``."""
        return {"rows": self.rows, "table_mb": round(self.table_bytes / 2**20),
                "table_bytes": self.table_bytes, "load_s": round(self.load_s, 1),
                "bytes_per_row": round(self.table_bytes / self.rows), "load_avg": self.load_avg,
                "methods": self.rows_of(), "failures": self.failures}


def from_json(record: dict[str, Any]) -> SizeResult:
    """A size read back from ``--json`` output (for ``--replot``): the inverse of ``to_json``."""
    size = SizeResult(record["rows"], record["table_bytes"], record["load_s"], load_avg=record["load_avg"],
                      failures=record.get("failures", []))
    for r in record["methods"]:
        if r["method"] == "raw_copy":
            size.measurements += [Measurement("raw_copy", r["label"], s) for s in r["detail"]["reads_s"]]
            continue
        size.measurements.append(Measurement(**{k: r[k] for k in (
            "method", "label", "seconds", "master", "rows_read_back", "end_to_end", "detail")}))
    return size


def markdown(size: SizeResult) -> str:
    """The size's table: seconds, rows/s, MB/s (table heap MB over seconds) and the ratio to raw COPY."""
    lines = [f"#### {size.rows:,} rows ({size.table_bytes / 2**20:,.0f} MB heap, "
             f"{size.table_bytes / size.rows:.0f} B/row; loaded in {size.load_s:.0f} s; load average "
             f"{min(a[0] for a in size.load_avg):.1f}–{max(a[0] for a in size.load_avg):.1f})", "",
             "| what | Spark | seconds | rows/s | MB/s | vs raw COPY | notes |",
             "|---|---|---|---|---|---|---|"]
    for r in size.rows_of():
        lines.append(f"| {r['label']} | {r['master'] or ''} | {r['seconds']:.2f} | {r['rows_per_s']:,} | "
                     f"{r['mb_per_s']} | {r['vs_raw_copy']:.3f} | {note(r)} |")
    for failed in size.failures:
        lines.append(f"| {failed['what']} | | failed | | | | {failed['error'].splitlines()[0][:300]} |")
    return "\n".join(lines)


def note(record: dict[str, Any]) -> str:
    """What the notes column says of a method: the copy alone, dlt's stages, the reads' CPU."""
    d = record["detail"]
    if record["method"] == "raw_copy":
        return "faster of " + " / ".join(f"{s} s" for s in d["reads_s"])
    if record["method"].startswith("headrace"):
        parts = [d.get(k) or 0 for k in ("process_start_s", "startup_s", "copy_s")]
        t = d.get("timeline") or {}
        lanes = (f"; groups copied by the driver {t['driver_groups']}, by Spark {t['spark_groups']} (Spark up at "
                 f"{t.get('spark.started')} s, warm at {t.get('spark.warm')} s)" if "driver_groups" in t else "")
        return (f"process start {d.get('process_start_s')} s, to the copy's start {d.get('startup_s')} s, "
                f"copy {d.get('copy_s')} s (`snapshot.done`; {record.get('copy_rows_per_s', 0):,} rows/s), "
                f"then {record['seconds'] - sum(parts):.1f} s to streaming and exit; "
                f"wrote {d.get('output_mb')} MB{lanes}")
    if record["method"].startswith("dlt"):
        stages = d.get("stages", {})
        return (f"pipeline {d.get('pipeline_s')} s: extract {stages.get('extract')}, normalize "
                f"{stages.get('normalize')}, load {stages.get('load')} s; wrote {d.get('output_mb')} MB")
    if record["method"].startswith("read"):
        return f"component, not end to end; CPU {d.get('cpu_s')} s"
    return ""


def cores_of(master: str) -> int:
    """How many cores a ``local[N]`` master gives Spark (``local[*]``/others: this machine's)."""
    found = re.fullmatch(r"local\[(\d+)\]", master)
    return int(found.group(1)) if found else (os.cpu_count() or 1)


def estimate_s(rows: int, masters: list[str], targets: list[str], dlt: bool, reads: bool, csv: bool,
               rates: dict[str, float]) -> float:
    """Seconds one size is expected to take, from ``rates`` (assumed or measured)."""
    seconds = rows / rates["load"] + 2 * rows / rates["raw_copy"] + (2 * rows / rates["read"] if reads else 0)
    for master in masters:
        per_core = rates.get(f"headrace_per_core@{master}", rates["headrace_per_core"])
        one = rates["headrace_start_s"] + rows / (per_core * min(cores_of(master), os.cpu_count() or 1))
        seconds += one * len(targets) * (2 if csv else 1)
    if dlt:
        seconds += 2 * rates["dlt_start_s"] + rows / rates["dlt_pyarrow"] + rows / rates["dlt_connectorx"]
    return seconds


def learn_rates(size: SizeResult, rates: dict[str, float]) -> None:
    """Replace the assumed rates with what this size measured (for the estimate of the sizes after it)."""
    rates["load"] = size.rows / size.load_s
    rates["raw_copy"] = size.rows / size.raw_s
    for m in size.measurements:
        if m.method.startswith("read_"):
            rates["read"] = size.rows / m.seconds
        elif m.method.startswith("headrace") and m.master:
            copy_s = m.detail.get("copy_s") or m.seconds
            usable = min(cores_of(m.master), os.cpu_count() or 1)
            rates[f"headrace_per_core@{m.master}"] = size.rows / copy_s / usable
            rates["headrace_start_s"] = max(5.0, m.seconds - copy_s)
        elif m.method in ("dlt_pyarrow", "dlt_connectorx"):
            rates[m.method] = size.rows / m.seconds


SERIES = {"raw_copy": "raw binary COPY", "headrace_iceberg": "headrace → Iceberg",
          "headrace_ducklake": "headrace → DuckLake", "dlt_pyarrow": "dlt (pyarrow) → DuckDB",
          "dlt_connectorx": "dlt (connectorx) → DuckDB"}


def plot(sizes: list[SizeResult], masters: list[str], png: Path) -> None:
    """Left: rows/s per method per size (headrace at its fastest master); right: headrace's rows/s by
    the cores of its ``local[N]`` master, per target and size."""
    plt = pyplot()
    fig, (ax, scale) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / len(SERIES)
    for i, (method, label) in enumerate(SERIES.items()):
        xs, ys, raw = [], [], []
        for x, size in enumerate(sizes):
            rates = [r["rows_per_s"] for r in size.rows_of() if r["method"] == method]
            if rates:
                xs.append(x + (i - (len(SERIES) - 1) / 2) * width)
                ys.append(max(rates))
                raw.append(size.rows / size.raw_s)
        if xs:
            bars = ax.bar(xs, ys, width, label=label)
            labels = [f"{y / 1000:,.0f}K · {y / top:.2f}×" for y, top in zip(ys, raw, strict=True)]
            ax.bar_label(bars, labels=labels, fontsize=7, rotation=90, padding=2)
    ax.set_xticks(range(len(sizes)), [f"{s.rows:,} rows" for s in sizes])
    ax.set_yscale("log")
    ax.set_ylim(top=ax.get_ylim()[1] * 8)  # room for the labels above the tallest bar
    ax.set_ylabel("rows/s (log scale); labels: rows/s · × raw COPY")
    ax.set_title("Initial copy of one table, same run each (headrace: its fastest Spark master)")
    for target in ("iceberg", "ducklake"):
        for size in sizes:
            points = sorted((cores_of(r["master"]), r["rows_per_s"], r.get("copy_rows_per_s", 0))
                            for r in size.rows_of() if r["method"] == f"headrace_{target}")
            if points:
                name = "Iceberg" if target == "iceberg" else "DuckLake"
                line, = scale.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                                   label=f"{name}, {size.rows:,} rows")
                scale.plot([p[0] for p in points], [p[2] for p in points], marker="x", linestyle="--",
                           color=line.get_color())
    scale.set_xticks(sorted({cores_of(m) for m in masters}))
    scale.set_xlabel("Spark cores (local[N])")
    scale.set_ylabel("rows/s: end to end (solid), copy alone (dashed)")
    scale.set_title("headrace by Spark cores" + ("" if len(masters) > 1 else f" (one master: {masters[0]})"))
    scale.set_ylim(bottom=0)
    save_figure(fig, png, ax, scale)
