"""`headrace demo`: a throwaway Postgres with a small shop, replicated live into a local lakehouse;
``--storage s3``: its staging and table files on a throwaway S3-compatible store (``moto_server``)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import yaml

from headrace.config import parse_config
from headrace.control.status import pipeline_status
from headrace.source.postgres.throwaway import ThrowawayPostgres

SAMPLE_SCHEMA = """
CREATE SCHEMA shop;
CREATE TYPE shop.order_status AS ENUM ('new', 'paid', 'shipped', 'cancelled');
CREATE TABLE shop.customers (
    id         serial PRIMARY KEY,
    name       text NOT NULL,
    email      varchar(200),
    vip        boolean NOT NULL DEFAULT false,
    balance    numeric(12,2) NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE shop.orders (
    id          bigserial PRIMARY KEY,
    customer_id integer NOT NULL,
    amount      numeric(10,2) NOT NULL,
    status      shop.order_status NOT NULL DEFAULT 'new',
    tags        text[],
    placed_at   timestamp NOT NULL DEFAULT now(),
    details     jsonb
);
INSERT INTO shop.customers (name, email, vip, balance)
SELECT 'customer ' || g, 'c' || g || '@example.com', g % 10 = 0, (g * 7.31)::numeric(12,2)
FROM generate_series(1, 2000) g;
INSERT INTO shop.orders (customer_id, amount, status, tags, details)
SELECT 1 + g % 2000, (g % 500) + 0.99, (ARRAY['new','paid','shipped'])[1 + g % 3]::shop.order_status,
       ARRAY['tag' || g % 7, 'tag' || g % 11], jsonb_build_object('items', g % 5 + 1)
FROM generate_series(1, 10000) g;
"""

TABLES = ["shop.customers", "shop.orders"]


def make_changes(dsn: str, seconds: float, stop: threading.Event, seed: int = 7) -> int:
    """Insert, update and delete rows in the shop for ``seconds``; return the number of statements."""
    rng = random.Random(seed)
    count = 0
    deadline = time.monotonic() + seconds
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline and not stop.is_set():
            with conn.transaction():
                for _ in range(rng.randint(1, 20)):
                    roll = rng.random()
                    if roll < 0.5:
                        conn.execute(
                            "INSERT INTO shop.orders (customer_id, amount, status, tags, details) VALUES "
                            "(%s, %s, 'new', ARRAY['live'], '{\"live\": true}')",
                            (rng.randint(1, 2000), round(rng.uniform(1, 500), 2)),
                        )
                    elif roll < 0.8:
                        conn.execute("UPDATE shop.orders SET status = 'paid', amount = amount + 1 "
                                     "WHERE id = (SELECT max(id) - %s FROM shop.orders)", (rng.randint(0, 500),))
                    elif roll < 0.9:
                        conn.execute("UPDATE shop.customers SET balance = balance + 10, vip = NOT vip "
                                     "WHERE id = %s", (rng.randint(1, 2000),))
                    else:
                        conn.execute("DELETE FROM shop.orders WHERE id = %s", (rng.randint(1, 10000),))
                    count += 1
            time.sleep(0.05)
    return count


# ``--storage s3``: the demo's store accepts any key; the pipeline reads it from these variables
# (set in this process only), as a user's pipeline reads its own from AWS_ACCESS_KEY_ID and friends.
BUCKET = "headrace-demo"
DEMO_KEY_ENV, DEMO_SECRET_ENV = "HEADRACE_DEMO_S3_KEY_ID", "HEADRACE_DEMO_S3_SECRET"
DEMO_KEY, DEMO_SECRET = "demo", "demo-secret"


@dataclass(frozen=True)
class DemoLayout:
    """Where the demo's files go: ``root`` is the output folder, or ``s3://headrace-demo`` on the
    throwaway store (the DuckLake catalog file stays in the output folder either way)."""

    out: Path
    root: str
    endpoint: str | None = None

    @property
    def on_s3(self) -> bool:
        return self.endpoint is not None

    @property
    def warehouse(self) -> str:
        return f"{self.root}/warehouse"

    @property
    def lake_catalog(self) -> Path:
        return self.out / ("lake-s3" if self.on_s3 else "lake") / "meta.ducklake"

    @property
    def lake_data(self) -> str:
        return f"{self.root}/lake/" if self.on_s3 else str(self.out / "lake" / "data")

    def sections(self, target: str) -> dict[str, object]:
        """The target, staging and (on S3) storage sections of the demo's pipeline file."""
        if target == "ducklake":
            target_cfg: dict[str, object] = {"ducklake": {"catalog": str(self.lake_catalog), "data_path": self.lake_data}}
        else:
            target_cfg = {"iceberg": {"warehouse": self.warehouse}}
        raw: dict[str, object] = {"target": target_cfg, "staging": {"path": f"{self.root}/staging"}}
        if self.on_s3:
            raw["storage"] = {"endpoint": self.endpoint, "region": "us-east-1",
                              "access_key_id_env": DEMO_KEY_ENV, "secret_access_key_env": DEMO_SECRET_ENV}
        return raw


def run_demo(output: str = "demo-output", target: str = "iceberg", seconds: float = 20.0,
             storage: str = "local") -> int:
    """Start Postgres (and with ``storage="s3"`` an object store), load the shop, replicate it with live
    changes, and compare counts."""
    out = Path(output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        layout = DemoLayout(out, str(out))
        if storage == "s3":
            layout = _start_object_store(out, stack)
        print("starting a throwaway PostgreSQL (wal_level=logical) ...", flush=True)
        pg = stack.enter_context(ThrowawayPostgres())
        code = _replicate(pg, layout, target, seconds)
        if layout.on_s3:
            _hold_store(layout)
        return code


def _start_object_store(out: Path, stack: contextlib.ExitStack) -> DemoLayout:
    """A throwaway S3 store (in memory, stopped when the demo ends) with the demo's bucket."""
    from headrace.storage.throwaway import ThrowawayObjectStore

    print("starting a throwaway S3-compatible object store (moto_server, in memory) ...", flush=True)
    store = stack.enter_context(ThrowawayObjectStore(out / "objectstore"))
    os.environ[DEMO_KEY_ENV], os.environ[DEMO_SECRET_ENV] = DEMO_KEY, DEMO_SECRET
    store.create_bucket(BUCKET, DEMO_KEY, DEMO_SECRET)
    shutil.rmtree(out / "lake-s3", ignore_errors=True)  # a catalog of an earlier run's (gone) bucket
    print(f"object store: {store.endpoint}, bucket {BUCKET} (log {store.log_path})", flush=True)
    return DemoLayout(out, f"s3://{BUCKET}", store.endpoint)


def _hold_store(layout: DemoLayout) -> None:
    """On a terminal, keep the in-memory store up until Enter, for the queries printed above."""
    if not sys.stdin.isatty():
        print("the object store is in memory: it stops now, with the demo", flush=True)
        return
    with contextlib.suppress(EOFError, KeyboardInterrupt):
        input(f"\nthe object store at {layout.endpoint} is in memory and stops with the demo: query it from"
              " another terminal, then press Enter to stop it ")


def _replicate(pg: ThrowawayPostgres, layout: DemoLayout, target: str, seconds: float) -> int:
    """Load the shop into ``pg``, run the pipeline with live changes until caught up, report."""
    from headrace.pipeline import Pipeline

    out = layout.out
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(SAMPLE_SCHEMA)
    raw = {
        "name": "demo",
        "source": {"dsn": pg.dsn, "tables": TABLES},
        **layout.sections(target),
        "spark": {"master": "local[2]"},
    }
    (out / "pipeline.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    config = parse_config(raw)
    pipeline = Pipeline(config)
    stop = threading.Event()
    runner = threading.Thread(target=pipeline.run, kwargs={"stop": stop}, name="pipeline")
    print(f"pipeline config: {out / 'pipeline.yaml'}; starting Spark and the initial copy ...", flush=True)
    runner.start()
    writer_stop = threading.Event()
    writes: list[int] = []
    writer = threading.Thread(target=lambda: writes.append(make_changes(pg.dsn, seconds, writer_stop)))
    writer.start()
    shown_api = False
    try:
        while writer.is_alive():
            if not shown_api and pipeline.api_address:
                print(f"status page: http://{pipeline.api_address}/  (metrics at /metrics)", flush=True)
                shown_api = True
            _progress(config)
            writer.join(timeout=3)
        with psycopg.connect(pg.dsn) as conn:
            end = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0]  # type: ignore[index]
        print(f"live changes done ({writes[0] if writes else 0} statements); waiting to catch up ...", flush=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and runner.is_alive():
            status = pipeline_status(config)
            from headrace.core.position import parse_lsn

            caught = "captured_lsn" in status and parse_lsn(status["captured_lsn"]) >= end and all(
                t["state"] == "STREAMING" and t["pending_changes"] == 0 for t in status["tables"])
            if caught:
                break
            _progress(config)
            time.sleep(1)
    finally:
        writer_stop.set()
        stop.set()
        runner.join()
    return _report(pipeline, pg.dsn, layout, target)


_last_progress: list[str] = [""]


def _progress(config: object) -> None:
    """Print one line per table state change (not the same line again and again)."""
    status = pipeline_status(config)  # type: ignore[arg-type]
    parts = [f"{t['table']}: {t['state']} copied={t['rows_copied']} applied={t['rows_applied']} "
             f"pending={t['pending_changes']}" for t in status["tables"]]
    line = "  " + " | ".join(parts) if parts else "  setting up ..."
    if line != _last_progress[0]:
        print(line, flush=True)
        _last_progress[0] = line


def _report(pipeline: object, dsn: str, layout: DemoLayout, target: str) -> int:
    from headrace.pipeline import Pipeline
    from headrace.source.postgres.catalog import read_table_schema

    assert isinstance(pipeline, Pipeline)
    print("\ntable              source rows   target rows")
    ok = True
    with psycopg.connect(dsn) as conn:
        for name in TABLES:
            source_rows = conn.execute(f"SELECT count(*) FROM {name}").fetchone()[0]  # type: ignore[index]
            schema = read_table_schema(conn, name)
            target_rows = pipeline.target.read_table(schema).count()
            ok &= source_rows == target_rows
            print(f"{name:18} {source_rows:>11} {target_rows:>13}")
    pipeline.target.close()
    print(_how_to_read_s3(layout, target) if layout.on_s3 else _how_to_read(layout.out, target))
    print("\nsource and target match" if ok else "\nsource and target DIFFER")
    return 0 if ok else 1


def _how_to_read(out: Path, target: str) -> str:
    """Queries, ready to paste, that read what the demo just wrote without headrace's pipeline
    (docs/reading.md). ``duckdb_with`` loads DuckDB's extensions from their wheels (offline)."""
    if target == "ducklake":
        attach = f"ATTACH 'ducklake:{out / 'lake' / 'meta.ducklake'}' AS lake (DATA_PATH '{out / 'lake' / 'data'}', READ_ONLY)"
        return (
            f"\nDuckLake catalog: {out / 'lake' / 'meta.ducklake'} (tables shop.customers, shop.orders)\n"
            "Query it with DuckDB (SQL, after INSTALL ducklake; LOAD ducklake;):\n"
            f"  {attach};\n"
            "  SELECT status, count(*) FROM lake.shop.orders GROUP BY status;\n"
            "or in Python, extensions loaded from their wheels:\n"
            "  from headrace.readers import duckdb_with\n"
            "  con = duckdb_with('ducklake')\n"
            f"  con.sql(\"{attach}\")\n"
            "  con.sql('SELECT status, count(*) FROM lake.shop.orders GROUP BY status').show()"
        )
    table = out / "warehouse" / "shop" / "orders"
    return (
        f"\nIceberg warehouse: {out / 'warehouse'}  (Hadoop catalog; tables shop.customers, shop.orders)\n"
        "Query it with DuckDB (iceberg extension; SQL: INSTALL iceberg; LOAD iceberg;):\n"
        "  from headrace.readers import duckdb_with\n"
        "  con = duckdb_with('avro', 'iceberg')\n"
        f"  con.sql(\"SELECT status, count(*) FROM iceberg_scan('{table}') GROUP BY status\").show()\n"
        "with pyiceberg:\n"
        "  from pyiceberg.table import StaticTable\n"
        f"  orders = StaticTable.from_metadata('{table}')\n"
        "  print(orders.scan().to_arrow().group_by('status').aggregate([('id', 'count')]))\n"
        "with PySpark (Iceberg runtime on the classpath):\n"
        "  from headrace.readers import iceberg_spark\n"
        f"  spark = iceberg_spark(warehouse='{out / 'warehouse'}')\n"
        "  spark.sql('SELECT status, count(*) FROM headrace.shop.orders GROUP BY status').show()"
    )


def _how_to_read_s3(layout: DemoLayout, target: str) -> str:
    """Where the files are in the bucket, and a DuckDB (httpfs) query that reads them, run once here
    with a plain DuckDB to show its answer."""
    from headrace.readers import duckdb_with

    host = (layout.endpoint or "").split("://", 1)[1]
    secret = (f"CREATE SECRET (TYPE s3, KEY_ID '{DEMO_KEY}', SECRET '{DEMO_SECRET}', REGION 'us-east-1',"
              f" ENDPOINT '{host}', URL_STYLE 'path', USE_SSL false)")
    if target == "ducklake":
        where = f"DuckLake catalog: {layout.lake_catalog}, data files in {layout.lake_data}"
        extensions: tuple[str, ...] = ("httpfs", "ducklake")
        setup = [secret, f"ATTACH 'ducklake:{layout.lake_catalog}' AS lake (READ_ONLY)"]
        query = "SELECT status, count(*) AS orders FROM lake.shop.orders GROUP BY status ORDER BY status"
    else:
        where = f"Iceberg warehouse: {layout.warehouse} (Hadoop catalog)"
        extensions = ("httpfs", "avro", "iceberg")
        setup = [secret]
        query = (f"SELECT status, count(*) AS orders FROM iceberg_scan('{layout.warehouse}/shop/orders')"
                 " GROUP BY status ORDER BY status")
    con = duckdb_with(*extensions)
    try:
        for statement in setup:
            con.execute(statement)
        answer = con.execute(query).fetchall()
    finally:
        con.close()
    statements = "".join(f"  {s};\n" for s in (*setup, query))
    python = "".join(f"  con.sql(\"{s}\")\n" for s in setup)
    return (
        f"\n{where}; tables shop.customers, shop.orders; staging: {layout.root}/staging (removed once applied)\n"
        f"object store: {layout.endpoint} (S3 API, path-style), bucket {BUCKET}: {_bucket_summary(layout)}\n"
        f"Query it with DuckDB (SQL, after INSTALL and LOAD of {', '.join(extensions)}):\n"
        f"{statements}"
        "or in Python, extensions loaded from their wheels:\n"
        "  from headrace.readers import duckdb_with\n"
        f"  con = duckdb_with({', '.join(repr(e) for e in extensions)})\n"
        f"{python}"
        f"  con.sql(\"{query}\").show()\n"
        f"DuckDB read from the bucket just now: {', '.join(f'{status} {n}' for status, n in answer)}"
    )


def _bucket_summary(layout: DemoLayout) -> str:
    """Objects and bytes under each top-level prefix of the demo's bucket."""
    import pyarrow.fs as pafs

    from headrace import storage

    fs, path = storage.filesystem(layout.root)
    sizes: dict[str, list[int]] = {}
    for info in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
        if info.type == pafs.FileType.File:
            prefix = info.path.removeprefix(f"{path}/").split("/", 1)[0]
            sizes.setdefault(prefix, []).append(info.size or 0)
    return ", ".join(f"{prefix}/ {len(s)} objects, {sum(s) / 1e6:.1f} MB" for prefix, s in sorted(sizes.items()))
