"""``headrace demo --storage s3``: the demo starts its own object store, puts staging and the table
files in a bucket there, and its summary says where they are and how DuckDB (httpfs) reads them."""

from __future__ import annotations

import contextlib
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from headrace import storage
from headrace.config import parse_config
from headrace.demo import (
    BUCKET,
    DEMO_KEY_ENV,
    DEMO_SECRET_ENV,
    _bucket_summary,
    _start_object_store,
    run_demo,
)


@pytest.fixture
def demo_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the demo sets in this process (its store's key variables, the storage section) is undone."""
    monkeypatch.setattr(storage, "_config", None)
    for name in (DEMO_KEY_ENV, DEMO_SECRET_ENV):
        monkeypatch.setenv(name, "")


def test_demo_store_holds_a_bucket_the_pipeline_file_points_at(tmp_path: Path, demo_env: None) -> None:
    """The lighter check: the store starts, the bucket is made, the demo's pipeline sections parse with
    every location on it, and the summary counts what is in the bucket; the store stops with the demo."""
    with contextlib.ExitStack() as stack:
        layout = _start_object_store(tmp_path, stack)
        config = parse_config({"name": "demo", "source": {"dsn": "postgresql://u@127.0.0.1/db", "tables": ["a.b"]},
                               **layout.sections("ducklake")})
        assert config.staging.path == f"s3://{BUCKET}/staging"
        assert config.target.kind == "ducklake" and config.target.settings.data_path == f"s3://{BUCKET}/lake/"
        fs, path = storage.filesystem(f"{layout.lake_data}one.parquet")
        with fs.open_output_stream(path) as out:
            out.write(b"x" * 1000)
        assert _bucket_summary(layout) == "lake/ 1 objects, 0.0 MB"
    with pytest.raises(OSError):  # the store stopped with the demo
        urllib.request.urlopen(f"{layout.endpoint}/moto-api/", timeout=2)


@pytest.mark.slow  # ~40 s: the demo's whole run (copy, 3 s of live changes, catch-up) on the store
def test_demo_on_s3_replicates_into_a_bucket_and_duckdb_reads_it(
        tmp_path: Path, spark: Any, demo_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_demo(output=str(tmp_path / "out"), target="ducklake", seconds=3, storage="s3") == 0
    shown = capsys.readouterr().out
    assert "source and target match" in shown
    assert f"data files in s3://{BUCKET}/lake/" in shown and "URL_STYLE 'path'" in shown
    answer = next(line for line in shown.splitlines() if line.startswith("DuckDB read from the bucket just now:"))
    assert all(status in answer for status in ("new", "paid", "shipped")), answer
