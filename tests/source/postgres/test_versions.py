"""What depends on the server's version, on the server itself: the slot is a failover slot from 17 on
(here 18), never on 15; a publication that is already right is not written to (a standby cannot)."""

from __future__ import annotations

import psycopg
import pytest

from headrace.source.postgres.replication import ensure_publication, ensure_slot


@pytest.mark.pg_versions(15, 18)
def test_the_slot_is_a_failover_slot_from_17_on(source_dsn: str, pg_version: int) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        ensure_slot(conn, "hr_failover", failover=True)
        ensure_slot(conn, "hr_plain", failover=False)
        if pg_version < 17:
            assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'hr_%'"
                                ).fetchone() == (2,)
            return
        rows = dict(conn.execute("SELECT slot_name, failover FROM pg_replication_slots WHERE slot_name LIKE 'hr_%'"
                                 ).fetchall())
    assert rows == {"hr_failover": True, "hr_plain": False}


@pytest.mark.pg_versions(15, 18)
def test_a_publication_already_right_is_not_written_to(source_dsn: str) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY)")
        ensure_publication(conn, "hr_pub", ["public.items"])
        conn.execute("BEGIN READ ONLY")  # as on a hot standby: any write fails
        ensure_publication(conn, "hr_pub", ["public.items"])
        conn.execute("ROLLBACK")
