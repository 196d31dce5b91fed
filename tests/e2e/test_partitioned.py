"""A range-partitioned table replicates as one target table, including partitions added later.

The same run checks the table events of an explicit table list: a drop, and a drop + re-create
under the ``refuse`` policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.control.status import pipeline_status
from headrace.pipeline import Pipeline
from headrace.source.postgres.catalog import read_table_schema
from headrace.source.postgres.copy import plan_chunks
from tests.e2e.helpers import assert_same, make_config, target_rows
from tests.e2e.test_discovery import caught_up, running, tracked, wait_for


@pytest.mark.parametrize("target", ["iceberg", "ducklake"])
def test_range_partitioned_table(source_dsn: str, tmp_path: Path, spark: Any, target: str) -> None:
    def sql(statement: str) -> None:
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute(statement)

    sql("""
        CREATE TABLE events (id int, day date, payload text, PRIMARY KEY (id, day)) PARTITION BY RANGE (day);
        CREATE TABLE events_jan PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
        CREATE TABLE events_feb PARTITION OF events FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');
        INSERT INTO events SELECT g, '2026-01-01'::date + (g % 59), repeat('x', 100) FROM generate_series(1, 3000) g;
        CREATE TABLE gone (id int PRIMARY KEY); INSERT INTO gone VALUES (1), (2);
        CREATE TABLE again (id int PRIMARY KEY); INSERT INTO again VALUES (1);
    """)
    with psycopg.connect(source_dsn) as conn:
        schema = read_table_schema(conn, "public.events")
        chunks = plan_chunks(conn, schema, 8)
        gone = read_table_schema(conn, "public.gone")
    assert schema.key == ("id", "day")
    assert len(chunks) > 2  # page ranges over the largest partition, not the (empty) parent

    config = make_config(source_dsn, tmp_path, ["public.events", "public.gone", "public.again"], target,
                         snapshot={"chunk_pages": 8}, api={"listen": "127.0.0.1:0"},
                         source={"discovery_seconds": 0.5}, schema_changes={"recreated_table": "refuse"})
    pipeline = Pipeline(config, spark=spark)
    with running(pipeline) as check:
        wait_for("the initial copy", caught_up(config, source_dsn), check)
        sql("""
            INSERT INTO events VALUES (5001, '2026-01-15', 'jan'), (5002, '2026-02-15', 'feb');
            UPDATE events SET payload = 'moved', day = '2026-02-20' WHERE id = 1;  -- crosses partitions
            UPDATE events SET payload = 'edited' WHERE id BETWEEN 10 AND 20;
            DELETE FROM events WHERE id BETWEEN 100 AND 150;
            CREATE TABLE events_mar PARTITION OF events FOR VALUES FROM ('2026-03-01') TO ('2026-04-01');
            INSERT INTO events SELECT g, '2026-03-01'::date + (g % 31), 'march' FROM generate_series(6001, 6100) g;
            UPDATE events SET payload = 'march edited' WHERE id = 6001;
            INSERT INTO gone VALUES (3); DROP TABLE gone;
            DROP TABLE again; CREATE TABLE again (id int PRIMARY KEY);
        """)

        def again() -> dict[str, Any]:
            return next(t for t in pipeline_status(config)["tables"] if t["table"] == "public.again")

        wait_for("the refusal of the recreated table", lambda: again()["state"] == "ERRORED", check)
        assert "recreated_table is refuse" in again()["error"]
        # The remedy the message names: remove the table and add it again.
        ops = pipeline.operations
        ops.call(ops.remove_table("public.again"))  # may answer "queued" on a busy loop: runs in order
        ops.call(ops.add_table("public.again"))
        sql("INSERT INTO again VALUES (7)")
        wait_for("the changes of every partition", caught_up(config, source_dsn), check)
        # Partitions are not tables of their own; the dropped table left after its last insert.
        assert set(tracked(config, source_dsn)) == {"public.events", "public.again"}
        assert pipeline_status(config)["ddl"]["counts"] == {"drop_table": 1}
        # Rows that come and go with no change in the stream: a partition attached with rows, one
        # detached. The table is copied again.
        sql("CREATE TABLE events_apr (id int NOT NULL, day date NOT NULL, payload text);"
            "INSERT INTO events_apr SELECT g, '2026-04-01'::date + (g % 30), 'april' FROM generate_series(7001, 7040) g")
        sql("ALTER TABLE events ATTACH PARTITION events_apr FOR VALUES FROM ('2026-04-01') TO ('2026-05-01')")
        wait_for("the resync", lambda: pipeline_status(config)["ddl"]["counts"].get("resync_partitions") == 1, check)
        sql("ALTER TABLE events DETACH PARTITION events_jan")
        wait_for("the second resync", lambda: pipeline_status(config)["ddl"]["counts"]["resync_partitions"] == 2,
                 check)
        sql("INSERT INTO events VALUES (8001, '2026-04-02', 'after')")
        wait_for("the copies", caught_up(config, source_dsn), check)
    assert target_rows(pipeline, gone) == [(1,), (2,), (3,)]  # drop_table: keep
    assert assert_same(pipeline, source_dsn, "public.again") == 1
    with psycopg.connect(source_dsn) as conn:
        expected = conn.execute("SELECT count(*) FROM events").fetchone()[0]  # type: ignore[index]
    assert expected > 1000 and assert_same(pipeline, source_dsn, "public.events") == expected
    pipeline.target.close()


def test_a_partition_attached_while_headrace_was_stopped_is_copied_at_the_next_start(
        source_dsn: str, tmp_path: Path, spark: Any) -> None:
    """The catalog watch compares a run's first look at the leaves with those the state store kept
    from the run before: rows attached (or detached) in between reach the target, copied again."""
    def sql(statement: str) -> None:
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute(statement)

    sql("""
        CREATE TABLE "Events" (id int, day date, payload text, PRIMARY KEY (id, day)) PARTITION BY RANGE (day);
        CREATE TABLE events_jan PARTITION OF "Events" FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
        INSERT INTO "Events" SELECT g, '2026-01-01'::date + (g % 31), 'jan' FROM generate_series(1, 200) g;
    """)
    config = make_config(source_dsn, tmp_path, ['public."Events"'], "ducklake")
    assert Pipeline(config, spark=spark).run(until_caught_up=True) == 0
    sql("CREATE TABLE events_apr (id int NOT NULL, day date NOT NULL, payload text);"
        "INSERT INTO events_apr SELECT g, '2026-04-01'::date + (g % 30), 'april' FROM generate_series(1001, 1040) g")
    sql("""ALTER TABLE "Events" ATTACH PARTITION events_apr FOR VALUES FROM ('2026-04-01') TO ('2026-05-01')""")
    pipeline = Pipeline(config, spark=spark)
    assert pipeline.run(until_caught_up=True) == 0
    assert pipeline_status(config)["ddl"]["counts"] == {"resync_partitions": 1}
    assert assert_same(pipeline, source_dsn, 'public."Events"') == 240
    pipeline.target.close()  # one DuckLake attach per process: the next run's
    sql('ALTER TABLE "Events" DETACH PARTITION events_jan')
    pipeline = Pipeline(config, spark=spark)
    assert pipeline.run(until_caught_up=True) == 0
    assert pipeline_status(config)["ddl"]["counts"] == {"resync_partitions": 2}
    assert assert_same(pipeline, source_dsn, 'public."Events"') == 40
    pipeline.target.close()
