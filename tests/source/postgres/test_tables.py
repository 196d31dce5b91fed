"""The catalog reads of the table watch, on a real server."""

from __future__ import annotations

import psycopg

from headrace.source.postgres.tables import leaf_partitions


def test_leaves_say_which_partitions_were_attached_also_below_an_attached_partitioned_table(source_dsn: str) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("""
            CREATE TABLE ev (id int, day date, region text) PARTITION BY RANGE (day);
            CREATE TABLE ev_jan PARTITION OF ev FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
            CREATE TABLE ev_empty (id int, day date, region text) PARTITION BY LIST (region);
        """)
        conn.execute("CREATE TABLE ev_feb (id int, day date, region text)")
        conn.execute("CREATE TABLE ev_mar (id int, day date, region text) PARTITION BY LIST (region)")
        conn.execute("CREATE TABLE ev_mar_eu PARTITION OF ev_mar FOR VALUES IN ('eu')")
        conn.execute("ALTER TABLE ev ATTACH PARTITION ev_feb FOR VALUES FROM ('2026-02-01') TO ('2026-03-01')")
        conn.execute("ALTER TABLE ev ATTACH PARTITION ev_mar FOR VALUES FROM ('2026-03-01') TO ('2026-04-01')")
        oid = {name: conn.execute("SELECT %s::regclass::oid::int8", (name,)).fetchone()[0]  # type: ignore[index]
               for name in ("ev", "ev_jan", "ev_feb", "ev_mar_eu", "ev_empty")}
        # ev_mar_eu was linked to ev_mar when made, but ev_mar came with its rows: so may it.
        assert leaf_partitions(conn, [oid["ev"], oid["ev_empty"]]) == {
            oid["ev"]: {oid["ev_jan"]: False, oid["ev_feb"]: True, oid["ev_mar_eu"]: True}}


def test_a_partition_attached_after_the_polls_snapshot_is_not_listed_as_created(source_dsn: str) -> None:
    """The catalog poll reads in one REPEATABLE READ snapshot: an attach committed after it is seen at
    the next poll, attached (listing it now as created would record it, and its rows would be missed)."""
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ev (id int, day date) PARTITION BY RANGE (day);"
                     " CREATE TABLE ev_jan PARTITION OF ev FOR VALUES FROM ('2026-01-01') TO ('2026-02-01')")
        conn.execute("CREATE TABLE ev_apr (id int, day date)")
        root, jan, apr = (conn.execute("SELECT %s::regclass::oid::int8", (name,)).fetchone()[0]  # type: ignore[index]
                          for name in ("ev", "ev_jan", "ev_apr"))
    with psycopg.connect(source_dsn, autocommit=True) as poll, poll.transaction():
        poll.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        poll.execute("SELECT count(*) FROM pg_class")  # takes the snapshot
        with psycopg.connect(source_dsn, autocommit=True) as other:
            other.execute("ALTER TABLE ev ATTACH PARTITION ev_apr FOR VALUES FROM ('2026-04-01') TO ('2026-05-01')")
        assert leaf_partitions(poll, [root]) == {root: {jan: False}}
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        assert leaf_partitions(conn, [root]) == {root: {jan: False, apr: True}}
