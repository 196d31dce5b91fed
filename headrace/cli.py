"""The `headrace` command: a thin layer over config, Pipeline and status."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence

from headrace.config import load_config
from headrace.core.errors import HeadraceError
from headrace.logs import setup_logging


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        if stop.is_set():  # a second signal: stop now
            raise SystemExit(130)
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def cmd_check(args: argparse.Namespace) -> int:
    from headrace.pipeline import Pipeline

    config = load_config(args.config)
    problems = Pipeline(config).check()
    if problems:
        print(f"{len(problems)} problem(s) with pipeline {config.name}:")
        for p in problems:
            print(f"  - {p}")
        return 1
    print(f"pipeline {config.name}: config and source OK ({len(config.source.tables)} tables)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from headrace.pipeline import Pipeline

    config = load_config(args.config)
    stop = _stop_on_signals()
    return Pipeline(config).run(stop=stop, until_caught_up=args.until_caught_up)


def cmd_status(args: argparse.Namespace) -> int:
    from headrace.control.status import format_status, pipeline_status

    status = pipeline_status(load_config(args.config))
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from headrace.demo import run_demo

    return run_demo(output=args.output, target=args.target, seconds=args.seconds)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headrace", description="Replicate PostgreSQL into Iceberg and DuckLake")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, text in [
        ("check", cmd_check, "validate the config and the source; exit 1 listing every problem"),
        ("run", cmd_run, "initial copy, then stream changes until SIGINT/SIGTERM"),
        ("status", cmd_status, "show the pipeline, its slot and every table"),
    ]:
        p = sub.add_parser(name, help=text)
        p.add_argument("-c", "--config", required=True, help="pipeline YAML file")
        p.set_defaults(func=func)
        if name == "run":
            p.add_argument("--until-caught-up", action="store_true",
                           help="exit 0 once everything committed before the start is applied")
        if name == "status":
            p.add_argument("--json", action="store_true", help="print one JSON object")
    demo = sub.add_parser("demo", help="throwaway Postgres → local lakehouse, with live changes")
    demo.add_argument("--target", choices=["iceberg", "ducklake"], default="iceberg")
    demo.add_argument("--output", default="demo-output", help="folder for the warehouse and staging files")
    demo.add_argument("--seconds", type=float, default=20.0, help="how long to make live changes")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    try:
        code: int = args.func(args)
        return code
    except HeadraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
