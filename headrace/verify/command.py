"""The ``verify`` command line: options, the progress bar, the report, the exit code."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import duckdb
import psycopg
from tqdm import tqdm

from headrace.config import load_config
from headrace.core.errors import HeadraceError
from headrace.verify.compare import Progress

EQUAL, DIFFERENT, FAILED = 0, 1, 2
SHOWN_PER_TABLE = 20  # differences printed per table without --json


def add_command(sub: Any) -> None:
    """``headrace verify`` on the CLI's subcommands."""
    p = sub.add_parser("verify", help="compare source and target at one consistent point (exit 0 equal, 1 not,"
                                      " 2 could not run)")
    p.add_argument("-c", "--config", required=True, help="pipeline YAML file")
    p.add_argument("--tables", nargs="+", metavar="TABLE", help="schema.table ... (default: every table)")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("--full", action="store_true", help="compare every row (the default)")
    amount.add_argument("--sample", type=float, metavar="FRACTION",
                        help="compare this share of the keys (0 < FRACTION <= 1), the same keys on both sides")
    p.add_argument("--wait", type=float, default=120.0, metavar="SECONDS",
                   help="how long to wait for the target to reach the source's point (default 120)")
    p.add_argument("--settle", type=float, default=60.0, metavar="SECONDS",
                   help="how long to keep comparing rows that change while compared (default 60)")
    p.add_argument("--repair", action="store_true",
                   help="ask the running pipeline to copy each table that differs again (a resync, through its API)")
    p.add_argument("--json", action="store_true", help="print one JSON object per table")
    p.set_defaults(func=cmd_verify)


class TerminalProgress(Progress):
    """A bar of the tables compared, with what verify does now, on stderr (a terminal only)."""

    def __init__(self) -> None:
        self._bar: tqdm | None = None

    def table(self, done: int, total: int, name: str) -> None:
        if self._bar is None:
            self._bar = tqdm(total=total, desc="verify", unit="table", file=sys.stderr, dynamic_ncols=True,
                             leave=False)
        self._bar.update(done - self._bar.n)
        self._bar.set_postfix_str(name)

    def note(self, text: str) -> None:
        if self._bar is None:
            sys.stderr.write(f"\r{text[:100]:100}")
            sys.stderr.flush()
        else:
            self._bar.set_postfix_str(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\r" + " " * 100 + "\r")


def cmd_verify(args: argparse.Namespace) -> int:
    """Run verify; print the result; exit 0 equal, 1 different, 2 could not run."""
    from headrace.verify.run import VerifyOptions, record, report, verify

    sample = 1.0 if args.sample is None else args.sample
    if not 0 < sample <= 1:
        print(f"error: --sample {args.sample}: give a fraction above 0 and at most 1", file=sys.stderr)
        return FAILED
    progress = TerminalProgress() if sys.stderr.isatty() else Progress()
    try:
        config = load_config(args.config)
        options = VerifyOptions(tuple(args.tables) if args.tables else None, sample, args.wait, args.settle)
        checks = verify(config, options, progress)
        reports = [report(c, sample) for c in checks]
        record(config, reports)
    except (HeadraceError, psycopg.Error, duckdb.Error) as exc:
        progress.close()
        print(f"error: {exc}", file=sys.stderr)
        return FAILED
    progress.close()
    if args.repair:
        _repair(config, reports)
    for r in reports:
        if args.json:
            print(json.dumps({k: v for k, v in r.items() if k != "position_int"}))
        else:
            print(describe(r))
    if any(r["status"] == "error" for r in reports):
        return FAILED
    if any(r["status"] == "different" for r in reports):
        return DIFFERENT
    return FAILED if any(r["unsettled"] for r in reports) else EQUAL


def _repair(config: Any, reports: list[dict[str, Any]]) -> None:
    """Resync every table with differences: the running pipeline copies it again (the copy replaces
    the target's rows), then streams on. ``repair`` in each report says what was asked."""
    from headrace.control.client import ApiClient

    client = ApiClient(config)
    for r in reports:
        if r["status"] != "different":
            continue
        try:
            client.request("POST", client.table_path(r["table"], "resync"))
            r["repair"] = "resync requested: the table is copied again"
        except HeadraceError as exc:
            r["repair"] = f"resync failed: {exc}"


def describe(r: dict[str, Any]) -> str:
    """One table's result for people."""
    share = "" if r["sample"] >= 1 else f" ({r['sample']:.0%} of keys)"
    head = f"{r['table']}: "
    if r["status"] == "error":
        return head + f"could not compare: {r['error']}"
    counts = f"{r['rows_source']} source rows, {r['rows_target']} target rows at {r['position']}{share}"
    if r["status"] == "equal":
        return head + f"equal ({counts})"
    if r["differing_rows_not_listed"]:
        return head + (f"different: about {r['differing_rows_not_listed']} rows in differing ranges, too many to"
                       f" list ({counts}): resync the table (--repair)")
    lines = [head + f"{len(r['differences'])} differences ({counts})"]
    for d in r["differences"][:SHOWN_PER_TABLE]:
        cols = f" columns {', '.join(d['columns'])}" if d["columns"] else ""
        lines.append(f"  key {d['key']}: {d['kind']}{cols} (source {d['source_rows']}, target {d['target_rows']})")
    if len(r["differences"]) > SHOWN_PER_TABLE:
        lines.append(f"  ... and {len(r['differences']) - SHOWN_PER_TABLE} more (--json lists all)")
    if r.get("repair"):
        lines.append(f"  repair: {r['repair']}")
    if r["unsettled"]:
        lines.append(f"  {r['unsettled']} rows kept changing while compared and were not settled: run again")
    return "\n".join(lines)
