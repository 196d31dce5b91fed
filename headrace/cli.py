"""The `headrace` command: a thin layer over config, Pipeline and status."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence

from headrace.config import load_config
from headrace.core.errors import HeadraceError
from headrace.logs import event, setup_logging

log = logging.getLogger("headrace.cli")


STOP_TIMEOUT_SECONDS = 30.0  # a graceful stop that takes longer than this is cut short


def _stop_on_signals(timeout: float = STOP_TIMEOUT_SECONDS) -> threading.Event:
    """An event the first SIGINT/SIGTERM sets: the run finishes its step, flushes what capture has
    buffered, acknowledges it, and returns (exit 0).

    The stop is bounded: a second signal, or ``timeout`` seconds after the first, ends the process
    at once with exit code 128 + the signal number. Ending abruptly is safe (a crash at any moment
    loses nothing, docs/guarantees.md) and beats waiting on a long copy chunk or a stuck commit;
    the next run resumes from the last acknowledged position.
    """
    stop = threading.Event()

    def hard_exit(signum: int, reason: str) -> None:
        event(log, "run.stop_forced", logging.WARNING, reason=reason, exit_code=128 + signum)
        sys.stderr.flush()
        os._exit(128 + signum)

    def handler(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            hard_exit(signum, f"second {name}")
        stop.set()
        event(log, "run.stopping", signal=name, timeout_s=timeout)
        watchdog = threading.Timer(timeout, hard_exit, (signum, f"still stopping {timeout:g} s after {name}"))
        watchdog.daemon = True  # a stop that finishes in time exits without waiting for it
        watchdog.start()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def _fanout_command(args: argparse.Namespace) -> int | None:
    """check|run|status of a fan-out file (one with routing/destinations); None for other files."""
    from headrace.fanout.config import is_fanout_file

    if args.command not in ("check", "run", "status") or not is_fanout_file(args.config):
        return None
    from headrace.fanout import commands

    if args.command == "check":
        return commands.check(args.config)
    if args.command == "run":
        return commands.run(args.config, _stop_on_signals(), args.until_caught_up)
    return commands.status(args.config, args.json)


def cmd_check(args: argparse.Namespace) -> int:
    from headrace.control.assess import assess_config, format_assessment

    config = load_config(args.config)
    assessment = assess_config(config)  # the same assessment as the API's /api/check
    print(json.dumps(assessment, indent=2) if args.json else format_assessment(config.name, assessment))
    return 1 if assessment["problems"] else 0


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


def cmd_control(args: argparse.Namespace) -> int:
    """pause|resume|resync|add-table|remove-table|tables, sent to the running pipeline's API."""
    from headrace.control.client import ApiClient

    client = ApiClient(load_config(args.config))
    table: str = getattr(args, "table", None) or ""
    match args.command:
        case "pause" | "resume":
            path = client.table_path(table, args.command) if table else f"/api/{args.command}"
            result = client.request("POST", path)
        case "resync":
            result = client.request("POST", client.table_path(table, "resync"))
        case "add-table":
            result = client.request("POST", "/api/tables", {"table": table})
        case "remove-table":
            suffix = "?drop_target=true" if args.drop_target else ""
            result = client.request("DELETE", client.table_path(table) + suffix)
        case _:  # tables
            result = client.request("GET", "/api/source/tables" if args.source else "/api/tables")
            if not args.json:
                print(_format_tables(result["tables"], source=args.source))
                return 0
    print(json.dumps(result, indent=2))
    return 0


def _format_tables(tables: list[dict[str, object]], source: bool) -> str:
    if source:
        lines = [f"{'table':36} {'tracked':8} {'ready':6} problems"]
        for t in tables:
            problems = "; ".join(str(p) for p in t["problems"]) if isinstance(t["problems"], list) else ""
            lines.append(f"{t['table']!s:36} {'yes' if t.get('tracked') else 'no':8} "
                         f"{'yes' if t['ready'] else 'no':6} {problems}")
        return "\n".join(lines)
    lines = [f"{'table':36} {'state':10} {'lag_bytes':>10} {'lag_s':>7} {'pending':>8} {'per_s':>7}  error"]
    for t in tables:
        lag_s = "-" if t["lag_seconds"] is None else f"{t['lag_seconds']:.1f}"
        rate = "-" if t["changes_per_s"] is None else f"{t['changes_per_s']:.1f}"
        lag_b = "-" if t["lag_bytes"] is None else str(t["lag_bytes"])
        lines.append(f"{t['table']!s:36} {t['state']!s:10} {lag_b:>10} {lag_s:>7} {t['pending_changes']!s:>8} "
                     f"{rate:>7}  {t['error'] or ''}{_changed_values(t)}")
    return "\n".join(lines)


def _changed_values(table: dict[str, object]) -> str:
    """`` values changed: col reason=n`` when the values policy changed some (values.infinity: clamp)."""
    changed = table.get("values_changed")
    if not isinstance(changed, dict) or not changed:
        return ""
    return "  values changed: " + ", ".join(f"{k}={n}" for k, n in sorted(changed.items()))


def cmd_maintain(args: argparse.Namespace) -> int:
    """One maintenance pass over every table, or one; beside a running pipeline or while it is stopped."""
    from headrace.engines.spark.session import build_session
    from headrace.run.maintenance import maintain_tables
    from headrace.targets.registry import open_target

    config = load_config(args.config)
    spark = build_session(config.spark.master, config.spark.conf, app_name=f"headrace-maintain-{config.name}",
                          target_conf=config.target.spark_conf(config.spark.conf))
    target = open_target(config.target.kind, spark, config.target.settings, config.name)
    try:
        results = maintain_tables(config, target, args.table)
    finally:
        target.close()
    failed = 0
    for table, files in results.items():
        failed += files is None
        counts = " ".join(f"{k}={v}" for k, v in files.as_dict().items()) if files else "failed (see the log)"
        print(f"{table}: {counts}")
    return 1 if failed else 0


def cmd_init(args: argparse.Namespace) -> int:
    """Write a commented pipeline file for the database the DSN names (stdout without --output)."""
    from pathlib import Path

    from headrace.control.pipeline_file import write_pipeline_file
    from headrace.core.errors import ConfigError

    dsn = args.dsn or (os.environ.get(args.dsn_env) if args.dsn_env else None)
    if not dsn:
        raise ConfigError("give the database as --dsn DSN, or --dsn-env NAME of an environment variable holding it")
    output = Path(args.output) if args.output else None
    if output and output.exists() and not args.force:
        raise ConfigError(f"{output} exists: choose another --output, or pass --force to overwrite it")
    written = write_pipeline_file(dsn, args.target, args.schemas, args.dsn_env, args.name,
                                  str(output.parent) if output else None, args.sample_rows)
    if output is None:
        print(written.text, end="")
    else:
        output.write_text(written.text)
    tables = written.survey.tables
    ready = sum(1 for t in tables if not t.refused)
    print(f"{output or 'stdout'}: {ready} table(s) to replicate, {len(tables) - ready} that cannot be yet (listed"
          f" in the file with why). Export {written.dsn_env} with the DSN, then run: headrace check -c"
          f" {output or '<file>'}", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from headrace.demo import run_demo

    return run_demo(output=args.output, target=args.target, seconds=args.seconds, storage=args.storage)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headrace", description="Replicate PostgreSQL into Iceberg and DuckLake")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR: the log lines written to stderr")
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
        if name in ("status", "check"):
            p.add_argument("--json", action="store_true", help="print one JSON object")
    for name, text, table in [
        ("pause", "pause the running pipeline, or one table (copy and apply stop; capture goes on)", "?"),
        ("resume", "resume the running pipeline, or one paused table (or retry an ERRORED one, once fixed)", "?"),
        ("resync", "copy a table again (the copy replaces the target's rows), then stream", "1"),
        ("add-table", "check a source table, publish it, copy it and stream it (no restart)", "1"),
        ("remove-table", "stop replicating a table (also remove it from the config file)", "1"),
        ("tables", "list replicated tables with state and lag (--source: assess every source table)", "0"),
    ]:
        p = sub.add_parser(name, help=text)
        p.add_argument("-c", "--config", required=True, help="pipeline YAML file (api.listen, api.token_env)")
        if table != "0":
            p.add_argument("table", nargs=None if table == "1" else "?", help="schema.table")
        if name == "remove-table":
            p.add_argument("--drop-target", action="store_true", help="drop the target table too")
        if name == "tables":
            p.add_argument("--source", action="store_true", help="every source table, assessed for adding")
            p.add_argument("--json", action="store_true", help="print one JSON object")
        p.set_defaults(func=cmd_control)
    maintain = sub.add_parser("maintain", help="compact files, expire snapshots, remove orphans (now, once)")
    maintain.add_argument("-c", "--config", required=True, help="pipeline YAML file")
    maintain.add_argument("table", nargs="?", help="schema.table (default: every table)")
    maintain.set_defaults(func=cmd_maintain)
    init = sub.add_parser("init", help="write a commented pipeline file for a PostgreSQL database: the tables"
                          " found, those that cannot be replicated and why, the settings to decide")
    init.add_argument("--dsn", help="the database (libpq URL or key=value string); default: the --dsn-env variable")
    init.add_argument("--dsn-env", help="environment variable the file reads the DSN from (the password stays out"
                      " of the file); default: <NAME>_DSN")
    init.add_argument("--target", choices=["iceberg", "ducklake"], default="iceberg", help="the target the file"
                      " writes to (a DuckLake cannot hold names that differ only in case)")
    init.add_argument("--schemas", nargs="+", metavar="SCHEMA", help="only these schemas (exact names);"
                      " default: every schema but the system ones")
    init.add_argument("--output", help="file to write (refused if it exists, unless --force); default: stdout")
    init.add_argument("--force", action="store_true", help="overwrite --output")
    init.add_argument("--name", help="pipeline name (slot and publication headrace_<name>); default: from the"
                      " database name")
    init.add_argument("--sample-rows", type=int, default=100_000, help="rows of each table whose values are"
                      " checked for ones the target cannot hold (0: none)")
    init.set_defaults(func=cmd_init)
    demo = sub.add_parser("demo", help="throwaway Postgres → local lakehouse, with live changes")
    demo.add_argument("--target", choices=["iceberg", "ducklake"], default="iceberg", help="the target to replicate into")
    demo.add_argument("--output", default="demo-output", help="folder for the warehouse and staging files")
    demo.add_argument("--seconds", type=float, default=20.0, help="how long to make live changes")
    demo.add_argument("--storage", choices=["local", "s3"], default="local", help="where staging and the table"
                      " files go: the --output folder, or a bucket on a throwaway S3-compatible store (moto_server,"
                      " in memory) the demo starts itself")
    demo.set_defaults(func=cmd_demo)
    from headrace.teardown_cli import add_commands as add_teardown_commands

    add_teardown_commands(sub)  # drop, reset
    from headrace.verify.command import add_command as add_verify_command

    add_verify_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    try:
        fanout = _fanout_command(args)
        code: int = fanout if fanout is not None else args.func(args)
        return code
    except HeadraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
