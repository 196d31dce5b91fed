"""Config primitives every config model shares: the frozen model base, ``*_env`` indirection, reading
YAML, turning validation errors into one ``ConfigError``, ``host:port`` addresses and redacted DSNs.

The replication config (``headrace.config``) and the fan-out config (``headrace.fanout.config``)
are both built from these, so a file is read, checked and reported the same way whichever it is.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from headrace.core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class Frozen(BaseModel):
    """Base of every config model: immutable once resolved, and an unknown key is an error (a typo
    in a file must not silently fall back to a default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def from_env(value: str | None, env: str | None, what: str) -> str | None:
    """``value``, or the environment variable ``env`` names (a ``*_env`` key); ``what`` names the
    setting in errors. Giving both, or naming a variable that is not set, is a ``ConfigError``."""
    if value is not None and env is not None:
        raise ConfigError(f"{what}: give either the value or its *_env variable, not both")
    if env is not None:
        resolved = os.environ.get(env)
        if not resolved:
            raise ConfigError(f"{what}: environment variable {env} is not set; export it before running")
        return resolved
    return value


def read_yaml(path: str | Path) -> Any:
    """A config file's parsed YAML; a missing file or bad YAML is a ConfigError naming the file."""
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None


def validate(model: type[M], raw: Any, origin: str) -> M:
    """``raw`` (as from YAML) validated as ``model``; every problem, one per line with its dotted
    path, in a single ConfigError naming ``origin`` (the file)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: expected a mapping at the top level")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()]
        raise ConfigError(f"{origin} is invalid:\n" + "\n".join(lines)) from None


def check_listen(listen: str) -> str:
    """``listen`` when it is ``host:port`` (port 0: any free port); ValueError otherwise (a validator)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"listen must be host:port, got {listen!r}")
    return listen


def listen_host(listen: str) -> str:
    """The host of a ``host:port`` address (an IPv6 address without its brackets)."""
    return listen.rpartition(":")[0].strip("[]")


def listen_port(listen: str) -> int:
    """The port of a ``host:port`` address."""
    return int(listen.rpartition(":")[2])


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses; a host name may resolve anywhere, so False."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ListenAddress(Frozen):
    """A config section with ``listen: host:port`` (port 0: any free port), checked, with its parts."""

    listen: str = Field(description="host:port to serve on; port 0 picks a free port (tests)")

    @field_validator("listen")
    @classmethod
    def _host_port(cls, listen: str) -> str:
        return check_listen(listen)

    @property
    def host(self) -> str:
        return listen_host(self.listen)

    @property
    def port(self) -> int:
        return listen_port(self.listen)


def redacted_dsn(dsn: str) -> str:
    """The DSN with any password removed, fit for logs."""
    dsn = re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", dsn)
    return re.sub(r"(password\s*=\s*)\S+", r"\1***", dsn)
