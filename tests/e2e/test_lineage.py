"""OpenLineage events written to a JSON-lines file: valid, and naming the right tables and columns,
also after a column rename and a dropped column the target keeps.

No JSON schema of the OpenLineage spec ships in any package we can install offline, so each event
is validated by rebuilding it with the ``openlineage-python`` client's typed model (attrs classes
with the spec's required fields and validators) and requiring the rebuilt event to serialise back
to exactly the line that was written, every facet carrying its own schema URL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.generated import column_lineage_dataset as cl
from openlineage.client.generated import input_statistics_input_dataset as ins
from openlineage.client.generated import job_type_job as jt
from openlineage.client.generated import output_statistics_output_dataset as outs
from openlineage.client.generated import schema_dataset as sd
from openlineage.client.generated import tags_run
from openlineage.client.serde import Serde

from headrace.lineage.emitter import HeadracePositionsRunFacet
from headrace.pipeline import Pipeline
from tests.e2e.helpers import assert_same, make_config, running, wait_until


def _facet(cls: Any, data: dict[str, Any], **nested: Any) -> Any:
    body = {k: v for k, v in data.items() if not k.startswith("_")}
    assert data["_schemaURL"] == cls._get_schema(), data
    return cls(**{**body, **nested}, producer=data["_producer"])


def _schema(data: dict[str, Any]) -> sd.SchemaDatasetFacet:
    return _facet(sd.SchemaDatasetFacet, data, fields=[sd.SchemaDatasetFacetFields(**f) for f in data["fields"]])


def _lineage(data: dict[str, Any]) -> cl.ColumnLineageDatasetFacet:
    fields = {name: cl.Fields(inputFields=[
        cl.InputField(**{**i, "transformations": [cl.Transformation(**t) for t in i["transformations"]]})
        for i in f["inputFields"]]) for name, f in data["fields"].items()}
    return _facet(cl.ColumnLineageDatasetFacet, data, fields=fields)


def typed(line: str) -> RunEvent:
    """The event rebuilt with the client's typed model; fails on a missing, unknown or malformed field."""
    d = json.loads(line)
    (source,), (target,) = d["inputs"], d["outputs"]
    event = RunEvent(
        eventType=RunState(d["eventType"]), eventTime=d["eventTime"], producer=d["producer"],
        run=Run(runId=d["run"]["runId"], facets={
            "headrace_positions": _facet(HeadracePositionsRunFacet, d["run"]["facets"]["headrace_positions"]),
            "tags": _facet(tags_run.TagsRunFacet, d["run"]["facets"]["tags"], tags=[  # the client's own version tag
                tags_run.TagsRunFacetFields(**t) for t in d["run"]["facets"]["tags"]["tags"]])}),
        job=Job(namespace=d["job"]["namespace"], name=d["job"]["name"],
                facets={"jobType": _facet(jt.JobTypeJobFacet, d["job"]["facets"]["jobType"])}),
        inputs=[InputDataset(source["namespace"], source["name"], facets={"schema": _schema(source["facets"]["schema"])},
                             inputFacets={"inputStatistics": _facet(ins.InputStatisticsInputDatasetFacet,
                                                                    source["inputFacets"]["inputStatistics"])})],
        outputs=[OutputDataset(target["namespace"], target["name"], facets={
            "schema": _schema(target["facets"]["schema"]), "columnLineage": _lineage(target["facets"]["columnLineage"])},
            outputFacets={"outputStatistics": _facet(outs.OutputStatisticsOutputDatasetFacet,
                                                     target["outputFacets"]["outputStatistics"])})],
    )
    assert event.schemaURL == d["schemaURL"]
    assert Serde.to_dict(event) == d  # nothing written that the model does not hold
    return event


def _raw(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _events(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        typed(line)
    return [json.loads(line) for line in lines]


def _column_sources(event: dict[str, Any]) -> dict[str, tuple[str, str]]:
    fields = event["outputs"][0]["facets"]["columnLineage"]["fields"]
    return {name: (f["inputFields"][0]["name"], f["inputFields"][0]["field"]) for name, f in fields.items()}


def test_lineage_events_name_tables_and_columns_across_a_rename(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text, note text);"
                     "INSERT INTO items SELECT g, 'n' || g, 'x' FROM generate_series(1, 3) g")
    path = tmp_path / "lineage.jsonl"
    config = make_config(source_dsn, tmp_path, ["public.items"], "ducklake",
                         lineage={"transport": "file", "file": str(path)})
    database = source_dsn.rsplit("/", 1)[1]
    pipeline = Pipeline(config, spark)
    with running(pipeline):
        wait_until(lambda: any(e["job"]["facets"]["jobType"]["jobType"] == "COPY" for e in _raw(path)), 120,
                   "a copy event")
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET name = 'changed' WHERE id = 1")
        wait_until(lambda: any(e["run"]["facets"]["headrace_positions"]["kind"] == "apply" for e in _raw(path)),
                   60, "an apply event")
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE items RENAME COLUMN name TO title; ALTER TABLE items DROP COLUMN note;"
                         "INSERT INTO items VALUES (4, 'four')")
        wait_until(lambda: "title" in _column_sources(_raw(path)[-1]), 60, "an event after the rename")
        assert_same(pipeline, source_dsn, "public.items")

    events = _events(path)
    copy, first_apply, after = events[0], events[1], events[-1]
    source_name = f"{database}.public.items"
    for e in events:
        assert e["eventType"] == "COMPLETE" and e["producer"] == "https://pypi.org/project/headrace/"
        assert e["job"] == {**e["job"], "namespace": "headrace", "name": "t.public.items"}
        assert e["inputs"][0]["namespace"].startswith("postgres://127.0.0.1:")
        assert e["inputs"][0]["name"] == source_name
        assert e["outputs"][0]["namespace"] == f"ducklake://{tmp_path / 'lake' / 'data'}"
        assert e["outputs"][0]["name"] == "public.items"

    assert copy["job"]["facets"]["jobType"]["jobType"] == "COPY"
    assert copy["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 3
    assert "fromLsn" not in copy["run"]["facets"]["headrace_positions"]
    assert _column_sources(copy) == {c: (source_name, c) for c in ("id", "name", "note")}
    assert [f["name"] for f in copy["outputs"][0]["facets"]["schema"]["fields"]] == ["id", "name", "note"]

    positions = first_apply["run"]["facets"]["headrace_positions"]
    assert positions["fromLsn"] == copy["run"]["facets"]["headrace_positions"]["toLsn"]  # from the copy on
    assert first_apply["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 1

    assert _column_sources(after) == {"id": (source_name, "id"), "title": (source_name, "title"),
                                      "note": (source_name, "note")}
    fields = after["outputs"][0]["facets"]["columnLineage"]["fields"]
    assert "renamed from name" in fields["title"]["inputFields"][0]["transformations"][0]["description"]
    assert "dropped in the source" in fields["note"]["inputFields"][0]["transformations"][0]["description"]
    assert [f["name"] for f in after["inputs"][0]["facets"]["schema"]["fields"]] == ["id", "title"]
    assert [f["name"] for f in after["outputs"][0]["facets"]["schema"]["fields"]] == ["id", "title", "note"]
