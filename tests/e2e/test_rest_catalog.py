"""An Iceberg REST catalog (the test server of ``tests/restcatalog``, its files on the moto server):
the pipeline end to end through it, read back by pyiceberg's RestCatalog and DuckDB; and ``headrace
check`` proving it. A file of its own so the test workers share the load (the server is a JVM)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.pipeline import Pipeline
from headrace.targets.iceberg.catalog import java_table
from tests.e2e.helpers import make_config
from tests.e2e.test_object_storage import _dbs, change_orders, make_orders, pyiceberg_s3, read_back_equals
from tests.e2e.test_pipeline import run_caught_up
from tests.objectstore import SECRET, MotoServer, free_port

RESOLVING_FILE_IO = "org.apache.iceberg.io.ResolvingFileIO"


def test_iceberg_rest_catalog_on_s3_with_oauth2_client_credentials(
        source_dsn: str, s3_server: MotoServer, s3_bucket: str, rest_catalog: Any, tmp_path: Path, spark: Any,
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """Spark registers the catalog with client credentials (exchanged for a token), the driver commits
    its batches through it; pyiceberg's RestCatalog with the bearer token and DuckDB read the table.
    The session names the catalog's FileIO, as a user with S3FileIO's bundle would in ``spark.conf``:
    the catalog keeps it (Iceberg's ResolvingFileIO here, which reaches s3:// through Hadoop when
    S3FileIO's classes are missing, as they are on this machine)."""
    from pyiceberg.catalog.rest import RestCatalog

    from tests.restcatalog import CLIENT_ID, CLIENT_SECRET, TOKEN

    make_orders(source_dsn, 1000)
    monkeypatch.setenv("LAKE_CLIENT", f"{CLIENT_ID}:{CLIENT_SECRET}")
    name = f"hrrest{next(_dbs)}"
    namespace = f"ns{os.getpid()}_{next(_dbs)}"
    target = {"iceberg": {"warehouse": rest_catalog.warehouse, "catalog_name": name, "namespace": namespace,
                          "catalog": {"type": "rest", "uri": rest_catalog.uri, "credential_env": "LAKE_CLIENT"}}}
    config = make_config(source_dsn, tmp_path, ["public.orders"], target,
                         staging={"path": f"s3://{s3_bucket}/staging"})
    spark.conf.set(f"spark.sql.catalog.{name}.io-impl", RESOLVING_FILE_IO)
    pipeline = Pipeline(config, spark=spark)
    catalog = RestCatalog("reader", uri=rest_catalog.uri, token=TOKEN, **pyiceberg_s3(s3_server))

    def table_equals_source() -> bool:
        return read_back_equals(s3_server, source_dsn, catalog.load_table((namespace, "orders")))

    run_caught_up(pipeline)
    assert table_equals_source()
    change_orders(source_dsn, alter=False)
    run_caught_up(pipeline)
    assert table_equals_source()
    summaries = [s.summary for s in catalog.load_table((namespace, "orders")).snapshots()]
    assert any(s is not None and s.get("headrace.apply") == "driver" for s in summaries), summaries
    assert java_table(spark, f"{name}.{namespace}.orders").io().getClass().getName() == RESOLVING_FILE_IO
    shown = [caplog.text, *capfd.readouterr()]  # the JVM's output included
    assert not [secret for secret in (CLIENT_SECRET, TOKEN, SECRET) if any(secret in text for text in shown)]


def test_check_proves_the_rest_catalog_and_names_the_credentials_it_refuses(
        source_dsn: str, rest_catalog: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from headrace.control.assess import catalog_problems
    from tests.restcatalog import CLIENT_ID, CLIENT_SECRET, TOKEN

    def problems(**auth: str) -> list[str]:
        catalog = {"type": "rest", "uri": rest_catalog.uri, **auth}
        target = {"iceberg": {"warehouse": rest_catalog.warehouse, "catalog_name": "hrcheck", "catalog": catalog}}
        return catalog_problems(make_config(source_dsn, tmp_path, ["public.t"], target))

    monkeypatch.setenv("LAKE_TOKEN", TOKEN)
    monkeypatch.setenv("LAKE_CLIENT", f"{CLIENT_ID}:{CLIENT_SECRET}")
    assert problems(token_env="LAKE_TOKEN") == [] and problems(credential_env="LAKE_CLIENT") == []
    monkeypatch.setenv("OLD_TOKEN", "expired-token")
    monkeypatch.setenv("BAD_CLIENT", f"{CLIENT_ID}:wrong")
    assert problems(token_env="OLD_TOKEN") == [
        f"target.iceberg.catalog: the REST catalog at {rest_catalog.uri} refused the request (401, not authorized):"
        " set OLD_TOKEN to a valid, unexpired token"]
    assert problems(credential_env="BAD_CLIENT") == [
        f"target.iceberg.catalog: the OAuth2 server at {rest_catalog.uri}/v1/oauth/tokens refused the client"
        " credentials (401): set BAD_CLIENT to a valid client_id:client_secret"]
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("DEAD_URI", dead)
    catalog = {"type": "rest", "uri_env": "DEAD_URI", "token_env": "LAKE_TOKEN"}
    target = {"iceberg": {"warehouse": "w", "catalog_name": "hrcheck2", "catalog": catalog}}
    assert catalog_problems(make_config(source_dsn, tmp_path, ["public.t"], target)) == [
        f"target.iceberg.catalog: cannot reach the REST catalog at {dead}: fix target.iceberg.catalog.uri_env"]


@pytest.mark.slow  # ~50 s on a loaded machine; its lighter relative: tests/targets/test_iceberg_rest_cut.py
def test_a_cut_lands_in_one_multi_table_commit_through_the_rest_catalog(
        source_dsn: str, s3_server: MotoServer, s3_bucket: str, rest_catalog: Any, tmp_path: Path, spark: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``apply.consistency: transaction`` through a REST catalog: each cut's batches (on the driver) go to
    the catalog as one ``transactions/commit``, so a reader of the tables' current snapshots, pyiceberg's
    RestCatalog (not ours), sees the bank's total in every sample, with no cut table to look up. The
    reader loads both tables twice and keeps a sample only when the second loads found the same
    metadata: two loads are two requests, and a commit may fall between them."""
    import pyarrow.compute as pc

    from tests.e2e.test_consistency import _bank_run, cuts_counted

    config, pipeline, reader, names = _bank_through_rest(source_dsn, rest_catalog, s3_server, tmp_path, spark,
                                                         monkeypatch, "bank")

    def both() -> int | None:
        tables = [reader.load_table(name) for name in names]
        if [reader.load_table(name).metadata_location for name in names] != [t.metadata_location for t in tables]:
            return None  # a commit between the loads: sample again
        return sum(int(pc.sum(t.scan().to_arrow()["balance"]).as_py() or 0) for t in tables)

    _bank_run(pipeline, config, source_dsn, both, 8, 5)
    with psycopg.connect(source_dsn) as conn:
        whole, cuts = conn.execute("SELECT count(*) FILTER (WHERE whole), count(*) FROM _headrace.cuts"
                                   " WHERE pipeline = %s", (config.name,)).fetchone() or (0, 0)
    assert whole == cuts > 1, (whole, cuts)  # every cut in one commit: its batches all on the driver
    assert cuts_counted(pipeline, "one commit") == cuts


@pytest.mark.slow  # ~60 s; its lighter relatives: tests/targets/test_iceberg_rest_cut.py, tests/run/test_cuts.py
def test_a_refused_multi_table_commit_is_applied_again_whole(
        source_dsn: str, s3_server: MotoServer, s3_bucket: str, rest_catalog: Any, tmp_path: Path, spark: Any,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The catalog fails multi-table commits while money moves (twice 409, a refused requirement as a
    conflicting commit gives; once 500, state unknown): each failed cut is applied again whole by the
    run itself, so no table of it is ever visible alone (every sample sums to the total), nothing is
    lost or applied twice (the tables equal the source), no table goes to ERRORED, and each failure
    is one warning sentence (``apply.cut_retry``)."""
    import logging

    import pyarrow.compute as pc

    from headrace.state.store import StateStore
    from tests.e2e.test_consistency import _bank_run

    config, pipeline, reader, names = _bank_through_rest(source_dsn, rest_catalog, s3_server, tmp_path, spark,
                                                         monkeypatch, "bankx")
    armed: list[bool] = []

    def both() -> int | None:
        tables = [reader.load_table(name) for name in names]
        if [reader.load_table(name).metadata_location for name in names] != [t.metadata_location for t in tables]:
            return None  # a commit between the loads: sample again
        if not armed:
            rest_catalog.fail_transactions(409, 409, 500)
            armed.append(True)
        return sum(int(pc.sum(t.scan().to_arrow()["balance"]).as_py() or 0) for t in tables)

    with caplog.at_level(logging.WARNING, logger="headrace"):
        _bank_run(pipeline, config, source_dsn, both, 8, 5)
    retries = [r for r in caplog.records if r.getMessage() == "apply.cut_retry"]
    assert len(retries) == 3, [r.__dict__.get("error") for r in retries]
    errors = [str(r.__dict__["error"]) for r in retries]
    assert all("\n" not in e and e.startswith("the cut's commit of ") for e in errors), errors
    assert "CommitFailedException" in errors[0] and "ServiceFailureException: Service failed: 500" in errors[2], errors
    state = StateStore(source_dsn, config.name)
    try:
        assert [(r.state.value, r.error_count) for r in state.tables()] == [("STREAMING", 0)] * 2
    finally:
        state.close()


def _bank_through_rest(source_dsn: str, rest_catalog: Any, s3_server: MotoServer, tmp_path: Path, spark: Any,
                       monkeypatch: pytest.MonkeyPatch, prefix: str) -> tuple[Any, Pipeline, Any, list[tuple[str, str]]]:
    """The bank's two tables (``tests/e2e/test_consistency.py``) replicated with ``consistency:
    transaction`` into a namespace of their own through the REST catalog: the config, its pipeline, a
    pyiceberg RestCatalog reader (not ours) and the two tables' names."""
    from pyiceberg.catalog.rest import RestCatalog

    from tests.e2e.test_consistency import CONSISTENCY, _open_accounts
    from tests.restcatalog import TOKEN

    _open_accounts(source_dsn)
    monkeypatch.setenv("LAKE_TOKEN", TOKEN)
    namespace = f"{prefix}{os.getpid()}_{next(_dbs)}"
    target = {"iceberg": {"warehouse": rest_catalog.warehouse, "catalog_name": f"hr{prefix}{next(_dbs)}",
                          "namespace": namespace,
                          "catalog": {"type": "rest", "uri": rest_catalog.uri, "token_env": "LAKE_TOKEN"}}}
    config = make_config(source_dsn, tmp_path, ['public."Checking"', 'public."Savings accounts"'], target,
                         apply={"consistency": CONSISTENCY}, staging={"flush_seconds": 0.1})
    reader = RestCatalog("reader", uri=rest_catalog.uri, token=TOKEN, **pyiceberg_s3(s3_server))
    return config, Pipeline(config, spark=spark), reader, [(namespace, "Checking"), (namespace, "Savings accounts")]
