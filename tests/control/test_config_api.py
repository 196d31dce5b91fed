"""The api section of the config: loopback by default, a token required anywhere else."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.core.errors import ConfigError
from tests.e2e.helpers import make_config


def test_defaults_to_loopback_without_a_required_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEADRACE_API_TOKEN", raising=False)
    api = make_config("dbname=x", tmp_path, ["public.t"]).api
    assert (api.host, api.port, api.loopback, api.token_env) == ("127.0.0.1", 8765, True, "HEADRACE_API_TOKEN")
    assert api.resolved_token() is None


def test_non_loopback_needs_a_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="token_env"):
        make_config("dbname=x", tmp_path, ["public.t"], api={"listen": "0.0.0.0:8765", "token_env": None})
    with pytest.raises(ConfigError, match="host:port"):
        make_config("dbname=x", tmp_path, ["public.t"], api={"listen": "8765"})
    api = make_config("dbname=x", tmp_path, ["public.t"], api={"listen": "0.0.0.0:9000", "token_env": "HR_T"}).api
    monkeypatch.delenv("HR_T", raising=False)
    with pytest.raises(ConfigError, match="HR_T is not set"):
        api.resolved_token()
    monkeypatch.setenv("HR_T", "abc")
    assert api.resolved_token() == "abc" and not api.loopback
