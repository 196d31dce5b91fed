"""The one backoff: first wait, doubling, capped; and which errors count as an outage."""

from __future__ import annotations

import errno

import duckdb
import psycopg

from headrace.core.backoff import Backoff
from headrace.core.errors import SourceError, TransientError
from headrace.outage_signs import lost_connection, storage_unavailable


def test_delays_double_from_the_first_wait_up_to_the_cap() -> None:
    assert [Backoff(1.0, 30.0).delay(n) for n in range(8)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert Backoff(0.2, 1.0).delay(100) == 1.0


def test_a_broken_connection_is_an_outage_wherever_it_was_wrapped() -> None:
    try:
        try:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        except psycopg.OperationalError as exc:
            raise TransientError("copy of public.t failed") from exc
    except TransientError as wrapped:
        assert lost_connection(wrapped)
    assert not lost_connection(SourceError("table public.t has no primary key"))


def test_a_ducklake_catalog_that_cannot_be_reached_is_an_outage_other_duckdb_errors_are_not() -> None:
    refused = duckdb.IOException(
        'IO Error: Failed to query most recent snapshot for DuckLake: Unable to connect to Postgres at "host=127.0.0.1'
        ' port=49629 user=postgres dbname=postgres": connection to server at "127.0.0.1", port 49629 failed:'
        " Connection refused")
    assert lost_connection(refused)
    assert not lost_connection(duckdb.IOException('IO Error: No files found that match the pattern "x.parquet"'))
    assert not lost_connection(duckdb.ConversionException("Conversion Error: Could not convert string 'x' to INT32"))


def test_a_full_or_read_only_directory_is_a_storage_outage() -> None:
    assert storage_unavailable(OSError(errno.ENOSPC, "No space left on device"))
    assert storage_unavailable(OSError(errno.EROFS, "Read-only file system"))
    assert not storage_unavailable(OSError(errno.ENOENT, "No such file or directory"))
