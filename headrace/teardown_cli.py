"""``headrace drop`` and ``headrace reset``: the command-line side of ``headrace.teardown``."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import Any

import psycopg

from headrace.config import load_config
from headrace.core.errors import SourceError
from headrace.core.interfaces import Target


def _reachable(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A source or state server that cannot be reached is an error that names it, not a traceback."""
    @functools.wraps(func)
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except psycopg.OperationalError as exc:
            raise SourceError(f"cannot connect to the source or state database: {str(exc).strip()}. Run "
                              f"`headrace {args.command}` again once it is reachable: it removes what is left") from None
    return wrapped


@_reachable
def cmd_drop(args: argparse.Namespace) -> int:
    """Remove everything the pipeline created (target tables too with --targets)."""
    from headrace.teardown import confirm, drop_pipeline, refuse_if_running, survey

    config = load_config(args.config)
    found = survey(config)
    refuse_if_running(config, found, "drop")
    todo = found.lines(args.targets)
    if not todo:
        print(f"pipeline {config.name}: nothing left to drop")
        return 0
    print(f"pipeline {config.name}: dropping\n" + "\n".join(f"  - {line}" for line in todo))
    if not args.targets and found.tables:
        print(f"  (its {len(found.tables)} target tables stay; --targets drops them too)")
    if not confirm(f"drop pipeline {config.name}?", args.yes, sys.stdin, sys.stdout):
        print("nothing dropped")
        return 1
    done = drop_pipeline(config, args.targets, _opener(config) if args.targets else None)
    print("dropped\n" + "\n".join(f"  - {line}" for line in done))
    return 0


@_reachable
def cmd_reset(args: argparse.Namespace) -> int:
    """Forget the pipeline's position so the next run copies every table again (PostgreSQL: under a new
    slot; MySQL: from the binlog's position then)."""
    from headrace.teardown import confirm, drop_pipeline, refuse_if_running, survey

    config = load_config(args.config)
    found = survey(config)
    refuse_if_running(config, found, "reset")
    if found.source_kind == "mysql":
        print(f"pipeline {config.name}: resetting. The binlog position, state rows and staged files go; the "
              f"{len(found.tables)} target tables stay, and the next `headrace run` reads the binlog from the "
              "server's position then and copies every table again (each copy replaces its target table's rows)")
    else:
        print(f"pipeline {config.name}: resetting. The slot, publication, state rows and staged files go; the "
              f"{len(found.tables)} target tables stay, and the next `headrace run` copies every table again "
              "under a new slot (each copy replaces its target table's rows)")
    if not confirm(f"reset pipeline {config.name}?", args.yes, sys.stdin, sys.stdout):
        print("nothing reset")
        return 1
    done = drop_pipeline(config, targets=False, keep_schema=True)
    print("removed\n" + "\n".join(f"  - {line}" for line in done))
    print(f"now start the pipeline: headrace run -c {args.config}")
    return 0


def _opener(config: Any) -> Any:
    def open_target() -> Target:
        from headrace.run import Run

        return Run(config).target

    return open_target


def add_commands(sub: Any) -> None:
    """Register ``drop`` and ``reset`` on the CLI's subparsers."""
    drop = sub.add_parser("drop", help="remove the pipeline: slot and publication (PostgreSQL), state rows,"
                          " staged files (--targets: its target tables too)")
    drop.add_argument("-c", "--config", required=True, help="pipeline YAML file")
    drop.add_argument("--targets", action="store_true", help="drop the target tables too")
    drop.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    drop.set_defaults(func=cmd_drop)
    reset = sub.add_parser("reset", help="recover from a lost slot or purged binlog: forget the position; the"
                           " next run copies every table again from the source's position then")
    reset.add_argument("-c", "--config", required=True, help="pipeline YAML file")
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    reset.set_defaults(func=cmd_reset)
