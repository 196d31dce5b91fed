"""A fresh database on the shared MariaDB server for each test of the MySQL source."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from headrace.source.mysql.throwaway import ThrowawayMariaDB

_counter = itertools.count()


@pytest.fixture
def mysql_db(mariadb_server: ThrowawayMariaDB) -> Iterator[tuple[str, str]]:
    """(database name, replication DSN for it); the database is dropped afterwards."""
    name = f"t{os.getpid()}_{next(_counter)}"
    dsn = mariadb_server.create_database(name)
    yield name, dsn
    mariadb_server.drop_database(name)
