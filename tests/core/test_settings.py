"""The config primitives both config files are built from (headrace/core/settings.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.core.errors import ConfigError
from headrace.core.settings import (
    Frozen,
    check_listen,
    from_env,
    is_loopback,
    listen_host,
    listen_port,
    read_yaml,
    redacted_dsn,
    validate,
)


class _Model(Frozen):
    name: str
    count: int = 1


def test_validate_reports_every_problem_with_its_path() -> None:
    assert validate(_Model, {"name": "a"}, "f.yaml") == _Model(name="a")
    with pytest.raises(ConfigError) as caught:
        validate(_Model, {"count": "x", "typo": 1}, "f.yaml")
    text = str(caught.value)
    assert text.startswith("f.yaml is invalid:") and "  name:" in text and "  count:" in text and "  typo:" in text
    with pytest.raises(ConfigError, match="expected a mapping"):
        validate(_Model, ["a"], "f.yaml")
    with pytest.raises(ValueError, match="frozen"):
        _Model(name="a").name = "b"  # type: ignore[misc]


def test_env_indirection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HR_TEST_DSN", "host=x")
    assert from_env(None, "HR_TEST_DSN", "source.dsn") == "host=x"
    assert from_env("host=y", None, "source.dsn") == "host=y"
    with pytest.raises(ConfigError, match="not both"):
        from_env("host=y", "HR_TEST_DSN", "source.dsn")
    monkeypatch.delenv("HR_TEST_DSN")
    with pytest.raises(ConfigError, match="source.dsn: environment variable HR_TEST_DSN is not set"):
        from_env(None, "HR_TEST_DSN", "source.dsn")


def test_yaml_listen_and_redaction(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        read_yaml(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("a: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        read_yaml(tmp_path / "bad.yaml")
    assert check_listen("[::1]:0") == "[::1]:0" and listen_host("[::1]:0") == "::1" and listen_port("[::1]:0") == 0
    with pytest.raises(ValueError, match="host:port"):
        check_listen("localhost")
    assert is_loopback("localhost") and is_loopback("::1") and not is_loopback("0.0.0.0") and not is_loopback("db")
    assert redacted_dsn("postgresql://u:secret@h/db") == "postgresql://u:***@h/db"
    assert redacted_dsn("host=h password=secret user=u") == "host=h password=*** user=u"
