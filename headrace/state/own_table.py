"""A store of one ``_headrace`` table of its own (maintenance figures, verify results), created at its
first use rather than by ``StateStore.install``."""

from __future__ import annotations

from typing import ClassVar, Self

import psycopg
from psycopg.rows import dict_row


class OwnTableStore:
    """Opens a connection for ``pipeline`` and creates the table (``DDL``) if missing.

    The creation takes the install lock ``StateStore.install`` takes: two first uses at the same
    moment (two status reads at start-up) both ran CREATE TABLE IF NOT EXISTS, and one failed with a
    unique violation on the catalog."""

    DDL: ClassVar[str]

    def __init__(self, dsn: str, pipeline: str) -> None:
        self.pipeline = pipeline
        self.conn = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
        with self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(hashtext('_headrace.install'))")
            self.conn.execute("CREATE SCHEMA IF NOT EXISTS _headrace")
            self.conn.execute(self.DDL)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
