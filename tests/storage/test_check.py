"""``headrace check`` against a real object store (``moto_server``): a probe object written and deleted,
and one sentence naming the setting to fix for a missing bucket, refused credentials and an endpoint
that does not answer; ``headrace check`` itself says it without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from headrace.control.assess import storage_problems
from headrace.storage import S3Access, StorageConfig
from tests.e2e.helpers import make_config, raw_config
from tests.objectstore import SECRET, MotoServer, free_port, s3_environment


def s3_config(dsn: str, tmp: Path, bucket: str, **storage: object):  # type: ignore[no-untyped-def]
    lake = {"ducklake": {"catalog": str(tmp / "meta.ducklake"), "data_path": f"s3://{bucket}/lake"}}
    return make_config(dsn, tmp, ["public.t"], lake, staging={"path": f"s3://{bucket}/staging"}, storage=storage)


def test_a_reachable_writable_bucket_passes_and_keeps_no_probe(source_dsn: str, tmp_path: Path,
                                                             s3_server: MotoServer, s3_bucket: str) -> None:
    assert storage_problems(s3_config(source_dsn, tmp_path, s3_bucket)) == []
    assert not [k for k in s3_server.keys(s3_bucket) if "_headrace_check_" in k]


def test_a_missing_bucket_names_the_setting(source_dsn: str, tmp_path: Path, s3_bucket: str) -> None:
    problems = storage_problems(s3_config(source_dsn, tmp_path, "no-such-bucket"))
    assert problems[0] == ("staging.path s3://no-such-bucket/staging: bucket no-such-bucket does not exist at"
                           f" {S3Access.resolve().endpoint}: create it, or fix the bucket in staging.path")
    assert problems[1].startswith("target.ducklake.data_path s3://no-such-bucket/lake: bucket no-such-bucket")


def test_an_endpoint_that_does_not_answer_names_the_endpoint_setting(source_dsn: str, tmp_path: Path,
                                                                     s3_bucket: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    problems = storage_problems(s3_config(source_dsn, tmp_path, s3_bucket, endpoint=dead))
    assert problems == [f"staging.path s3://{s3_bucket}/staging: cannot reach the object store at {dead}:"
                        " fix storage.endpoint"]


@pytest.fixture
def strict_s3(tmp_path: Path) -> Iterator[MotoServer]:
    """A second server that checks credentials (it knows no key at all): every request is a 403."""
    server = MotoServer(tmp_path, env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    yield server
    server.stop()


def test_refused_credentials_name_the_key_variables(source_dsn: str, tmp_path: Path, s3_bucket: str,
                                                   strict_s3: MotoServer) -> None:
    problems = storage_problems(s3_config(source_dsn, tmp_path, s3_bucket, endpoint=strict_s3.endpoint,
                                          access_key_id_env="SHOP_S3_KEY", secret_access_key_env="SHOP_S3_SECRET"))
    assert problems == [f"staging.path s3://{s3_bucket}/staging: the object store at {strict_s3.endpoint} refused"
                        " the credentials (403): set SHOP_S3_KEY and SHOP_S3_SECRET to a key that may write to"
                        f" bucket {s3_bucket}"]


def test_headrace_check_says_it_in_one_sentence(source_dsn: str, tmp_path: Path, s3_server: MotoServer,
                                                s3_bucket: str) -> None:
    raw = raw_config(source_dsn, tmp_path, ["public.t"], {"ducklake": {"catalog": str(tmp_path / "m.ducklake"),
                                                               "data_path": f"s3://{s3_bucket}/lake"}},
                     staging={"path": "s3://missing-bucket/staging"})
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    done = subprocess.run([sys.executable, "-m", "headrace.cli", "check", "-c", str(path)], capture_output=True,
                          text=True, timeout=120, env={**s3_environment(s3_server.endpoint), **_base_env()})
    assert done.returncode == 1, done
    assert "staging.path s3://missing-bucket/staging: bucket missing-bucket does not exist" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr and SECRET not in done.stdout + done.stderr


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}


def test_storage_settings_fall_back_to_the_aws_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://localhost:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    access = S3Access.resolve(StorageConfig())
    assert (access.host_port, access.region, access.path_style, access.use_ssl) == ("localhost:9000", "eu-west-3",
                                                                                 True, False)
    access = S3Access.resolve(StorageConfig(endpoint="https://s3.example.com", region="x"))
    assert (access.path_style, access.use_ssl, access.region) == (False, True, "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    assert SECRET not in repr(S3Access.resolve(StorageConfig())) and "hadoop" not in repr(S3Access.resolve())
