"""The error boundary on real driver errors: Spark (JVM and Python workers), PostgreSQL, DuckDB.

Each error is raised by the real driver (the session's Spark, the shared PostgreSQL server, an
in-memory DuckDB), then classified: the right headrace class and kind, the root-cause sentence
rather than a wrapper's boilerplate, and the fix an operator needs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from headrace.core.errors import (
    TERMINAL_MARKER,
    PrivilegeError,
    SchemaChangeError,
    SourceError,
    TransientError,
    ValueNotStorableError,
)
from headrace.materialize.error_boundary import Failure, UnclassifiedError, classify

BOILERPLATE = "An error occurred while calling"


def _failure(action: Callable[[], object], table: str = "public.t") -> tuple[BaseException, Failure]:
    try:
        action()
    except Exception as exc:
        return exc, classify(exc, table, "replicator")
    raise AssertionError("the action did not fail")


def _marked_udf(value: object) -> str:
    raise ValueError(f"{TERMINAL_MARKER}column v of public.t holds {value!r}: DuckLake cannot store it")


def _plain_udf(value: object) -> str:
    raise ValueError(f"no luck with {value}")


# -- Spark -----------------------------------------------------------------------------------------
def test_a_missing_path_is_the_analysis_error_sentence(spark: Any, tmp_path: Path) -> None:
    missing = tmp_path / "gone.parquet"
    _, failure = _failure(lambda: spark.read.parquet(str(missing)).collect())
    assert failure.kind == "terminal" and isinstance(failure.error, SchemaChangeError)
    assert str(failure.error) == f"[PATH_NOT_FOUND] Path does not exist: file:{missing}."
    assert failure.fix is not None and "headrace resync public.t" in failure.fix


def test_a_raw_py4j_error_is_unwrapped_to_its_java_cause(spark: Any, tmp_path: Path) -> None:
    # A task failing in a write reaches Python as a Py4JJavaError ("... calling o123.parquet"),
    # the cause three exceptions down the Java chain.
    df = spark.range(3).select(F.raise_error(F.lit("the disk said no")).cast("string").alias("x"))
    exc, failure = _failure(lambda: df.write.mode("overwrite").parquet(str(tmp_path / "out")))
    assert isinstance(exc, Py4JJavaError) and BOILERPLATE in str(exc)
    assert failure.kind == "unknown" and isinstance(failure.error, UnclassifiedError)
    assert failure.message == "UnclassifiedError: java.lang.RuntimeException: the disk said no"
    assert failure.fix is not None and "headrace resume public.t" in failure.fix


def test_a_marked_message_from_a_spark_expression_stops_the_table(spark: Any) -> None:
    df = spark.range(2).select(F.raise_error(F.lit(f"{TERMINAL_MARKER}column d of public.t: 0001-01-01 BC")))
    exc, failure = _failure(df.collect)
    assert isinstance(exc, Py4JJavaError)
    assert failure.kind == "terminal" and isinstance(failure.error, ValueNotStorableError)
    assert str(failure.error) == "column d of public.t: 0001-01-01 BC"
    assert failure.fix is not None and "resync" in failure.fix


def test_a_python_udf_raising_the_marker_is_a_value_error(spark: Any) -> None:
    udf = F.udf(_marked_udf, StringType())
    _, failure = _failure(lambda: spark.range(1).select(udf(F.col("id"))).collect())
    assert isinstance(failure.error, ValueNotStorableError), failure
    assert str(failure.error) == "column v of public.t holds 0: DuckLake cannot store it"


def test_a_python_udf_error_is_the_python_exception_not_the_worker_banner(spark: Any) -> None:
    udf = F.udf(_plain_udf, StringType())
    _, failure = _failure(lambda: spark.range(1).select(udf(F.col("id"))).collect())
    assert failure.kind == "unknown"
    assert failure.message == "UnclassifiedError: ValueError: no luck with 0"


def _raise_in_task(error: Callable[[], BaseException]) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def task(batches: Iterator[Any]) -> Iterator[Any]:
        for _ in batches:
            raise error()
        yield from ()
    return task


def test_a_headrace_error_raised_in_a_task_keeps_its_class(spark: Any) -> None:
    task = _raise_in_task(lambda: TransientError("copy of public.t pages 0..8 failed: server closed the connection"))
    _, failure = _failure(lambda: spark.range(1).mapInArrow(task, "id long").collect())
    assert failure.kind == "transient" and type(failure.error) is TransientError
    assert str(failure.error) == "copy of public.t pages 0..8 failed: server closed the connection"


@pytest.fixture
def no_access_role(source_dsn: str) -> Iterator[str]:
    """A role without privileges on the test database's tables (roles are server-wide: one per process)."""
    role = f"hr_noaccess_{os.getpid()}"
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
            conn.execute(f"CREATE ROLE {role} NOLOGIN")
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    yield role
    with psycopg.connect(source_dsn, autocommit=True) as conn, contextlib.suppress(psycopg.Error):
        conn.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


def test_a_missing_privilege_in_a_copy_task_says_which_grant(spark: Any, source_dsn: str,
                                                            no_access_role: str) -> None:
    def copy(batches: Iterator[Any]) -> Iterator[Any]:
        import psycopg2

        for _ in batches:
            conn = psycopg2.connect(source_dsn)
            try:
                with conn.cursor() as cur:
                    cur.execute(f"SET ROLE {no_access_role}")
                    cur.execute("SELECT * FROM t")
            finally:
                conn.close()
        yield from ()

    _, failure = _failure(lambda: spark.range(1).mapInArrow(copy, "id long").collect())
    assert failure.kind == "terminal" and isinstance(failure.error, PrivilegeError), failure
    assert str(failure.error) == "PostgreSQL InsufficientPrivilege: permission denied for table t"
    assert failure.fix == "GRANT SELECT ON public.t TO replicator; then `headrace resume public.t`"


def test_an_ansi_cast_failure_is_a_value_the_target_cannot_hold(spark: Any) -> None:
    spark.conf.set("spark.sql.ansi.enabled", "true")
    try:
        _, failure = _failure(lambda: spark.sql("SELECT CAST('abc' AS INT)").collect())
    finally:
        spark.conf.unset("spark.sql.ansi.enabled")
    assert isinstance(failure.error, ValueNotStorableError)
    assert str(failure.error).startswith("[CAST_INVALID_INPUT] The value 'abc' of the type")
    assert "== SQL" not in str(failure.error)  # the query context stays in the log


# -- PostgreSQL ------------------------------------------------------------------------------------
def test_postgres_errors_by_sqlstate(source_dsn: str) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        _, gone = _failure(lambda: conn.execute("SELECT * FROM nowhere"))
        conn.execute("CREATE TABLE counter (id int PRIMARY KEY, n int); INSERT INTO counter VALUES (1, 0)")
    assert isinstance(gone.error, SchemaChangeError) and gone.kind == "terminal"
    assert str(gone.error).startswith('PostgreSQL UndefinedTable: relation "nowhere" does not exist')

    # Two repeatable-read transactions updating the same row: the second fails to serialize.
    with psycopg.connect(source_dsn) as first, psycopg.connect(source_dsn) as second:
        for conn in (first, second):
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            conn.execute("SELECT n FROM counter").fetchall()
        first.execute("UPDATE counter SET n = n + 1")
        first.commit()
        _, conflict = _failure(lambda: second.execute("UPDATE counter SET n = n + 1"))
    assert conflict.kind == "transient" and conflict.fix is None
    assert "SerializationFailure" in conflict.message

    # The server ends the connection (as a restart or pg_terminate_backend does).
    with psycopg.connect(source_dsn, autocommit=True) as victim, psycopg.connect(source_dsn, autocommit=True) as admin:
        pid = victim.info.backend_pid
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        _, shutdown = _failure(lambda: victim.execute("SELECT 1"))
    assert shutdown.kind == "transient", shutdown


def test_a_headrace_error_raised_from_a_driver_error_is_kept() -> None:
    def wrapped() -> None:
        try:
            duckdb.connect().execute("SELECT * FROM nowhere")
        except duckdb.Error as exc:
            raise SourceError("table public.t is gone: remove it") from exc

    _, failure = _failure(wrapped)
    assert failure.message == "SourceError: table public.t is gone: remove it"


# -- DuckDB ----------------------------------------------------------------------------------------
def test_duckdb_errors_by_kind() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0)")
    other = con.cursor()
    con.execute("BEGIN")
    other.execute("BEGIN")
    con.execute("UPDATE t SET v = 1")
    _, conflict = _failure(lambda: other.execute("UPDATE t SET v = 2"))
    assert conflict.kind == "transient" and "conflict" in conflict.message.lower(), conflict
    assert "public.t" in conflict.message
    con.execute("ROLLBACK")
    _, missing = _failure(lambda: con.execute("SELECT * FROM nowhere"))
    assert isinstance(missing.error, SchemaChangeError)
    _, value = _failure(lambda: con.execute("SELECT CAST(300 AS TINYINT)"))
    assert isinstance(value.error, ValueNotStorableError), value


def test_a_busy_sqlite_catalog_is_transient_whatever_class_duckdb_raises() -> None:
    # The messages a DuckLake on SQLite gave while another process wrote the catalog (seen in the e2e
    # run of test_a_target_commit_conflict_is_retried on a SQLite catalog): a lock, and the aborted
    # transaction it leaves, which DuckDB raised as a generic Error and as an InvalidInputException.
    locked = duckdb.Error("Failed to query most recent snapshot for DuckLake: Failed to prepare query"
                          " \"SELECT type FROM sqlite_master\": database is locked")
    aborted = duckdb.InvalidInputException("Attempting to fetch from an unsuccessful query result Error:"
                                           " TransactionContext Error: Current transaction is aborted"
                                           " (please ROLLBACK)")
    for exc in (locked, aborted):
        failure = classify(exc, "public.items", "replicator")
        assert failure.kind == "transient", failure
        assert "public.items" in failure.message
