"""`headrace check|run|status` for fan-out files (the CLI dispatches here when a file has ``routing``)."""

from __future__ import annotations

import json
import threading
from typing import Any

from headrace.core.errors import HeadraceError
from headrace.fanout.config import FanoutConfig, load_fanout_config
from headrace.fanout.cursors import CursorStore
from headrace.fanout.pool import LakePool
from headrace.fanout.runner import FanoutRunner, routing_values
from headrace.fanout.server import MetricsServer
from headrace.source.ducklake.reader import DuckLakeTableSource


def check(path: str) -> int:
    """Validate the file, the source table and routing column, and reach every destination."""
    config = load_fanout_config(path)
    problems: list[str] = []
    pool = LakePool(max_open=1)
    try:
        lake = config.source.ducklake
        alias = pool.attach_source(lake)
        source = DuckLakeTableSource(pool.con, alias, lake.schema_name, lake.table_name)
        columns = {c.name: c.type for c in source.columns()}
        routing_values(config, columns, source.shown)
    except HeadraceError as exc:
        problems.append(str(exc))
    mine = config.owned_destinations()
    if not problems:
        for d in mine:
            try:
                pool.acquire(d.ducklake, f"destination {d.id}")
            except HeadraceError as exc:
                problems.append(str(exc))
    pool.close()
    if problems:
        print(f"{len(problems)} problem(s) with fan-out pipeline {config.name}:")
        for p in problems:
            print(f"  - {p}")
        return 1
    print(f"fan-out pipeline {config.name}: source and {len(mine)} destination(s) OK "
          f"(instance {config.instance.id}, {len(config.destinations)} configured)")
    return 0


def run(path: str, stop: threading.Event, until_caught_up: bool) -> int:
    """Run this instance until stopped (or caught up), serving /metrics when ``api`` asks for it."""
    config = load_fanout_config(path)
    runner = FanoutRunner(config)
    server = None
    try:
        if config.api is not None:
            server = MetricsServer(config.api, runner.metrics, config.name, config.instance.id)
        return runner.run(stop=stop, until_caught_up=until_caught_up)
    finally:
        if server is not None:
            server.stop()
        runner.close()


def fanout_status(config: FanoutConfig) -> dict[str, Any]:
    """Cursors, lag and counters of every destination, read from the source catalog."""
    pool = LakePool(max_open=1)
    try:
        lake = config.source.ducklake
        alias = pool.attach_source(lake)
        source = DuckLakeTableSource(pool.con, alias, lake.schema_name, lake.table_name)
        latest = source.latest_snapshot()
        store = CursorStore(pool.con, alias, config.name)
        cursors = store.load() if store.installed() else {}
        instances = store.load_instances() if store.installed() else []
    finally:
        pool.close()
    destinations = []
    metrics: dict[str, Any] = {}
    for d in config.destinations:
        row = cursors.get(d.id)
        last = row.last_snapshot if row is not None and row.last_snapshot >= 0 else None
        counters = {
            "rows_read": row.rows_read if row else 0,
            "rows_written": row.rows_written if row else 0,
            "rows_upserted": row.rows_upserted if row else 0,
            "rows_deleted": row.rows_deleted if row else 0,
            "errors": row.errors if row else 0,
            "lag_snapshots": latest - (last if last is not None else 0),
        }
        metrics[d.id] = counters
        destinations.append({
            "id": d.id,
            "routing_value": d.routing_value,
            "table": d.ducklake.table,
            "owned_by_this_instance": config.instance.partition.owns(d.id),
            "instance_id": row.instance_id if row else None,
            "last_snapshot": last,
            "last_error": row.last_error if row else None,
            "updated_at": row.updated_at if row else None,
            **counters,
        })
    return {
        "pipeline": config.name,
        "kind": "fanout",
        "source": {"table": config.source.ducklake.table, "latest_snapshot": latest},
        "destinations": destinations,
        "instances": instances,
        "metrics": {
            "destinations": metrics,
            "unrouted_rows": sum(int(str(i["unrouted_rows"])) for i in instances),
            "pool_evictions": sum(int(str(i["pool_evictions"])) for i in instances),
            "errors": sum(m["errors"] for m in metrics.values()),
        },
    }


def status(path: str, as_json: bool) -> int:
    """Print the status (a table, or one JSON object)."""
    result = fanout_status(load_fanout_config(path))
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    print(f"fan-out pipeline {result['pipeline']}: source {result['source']['table']} "
          f"at snapshot {result['source']['latest_snapshot']}; unrouted rows "
          f"{result['metrics']['unrouted_rows']}, pool evictions {result['metrics']['pool_evictions']}")
    for d in result["destinations"]:
        state = "not seeded" if d["last_snapshot"] is None else f"snapshot {d['last_snapshot']}"
        line = (f"  {d['id']:<24} {state:<16} lag {d['lag_snapshots']:<6} written {d['rows_written']:<10} "
                f"errors {d['errors']}")
        if d["last_error"]:
            line += f"  last error: {d['last_error']}"
        print(line)
    return 0
