"""Config primitives every config model shares: frozen models, ``*_env`` indirection, redacted DSNs.

They live in ``core`` so a target's or source's own settings model (``targets/<name>/config.py``)
is built from the same parts as ``headrace.config`` without importing it.
"""

from __future__ import annotations

import os
import re

from pydantic import BaseModel, ConfigDict

from headrace.core.errors import ConfigError


class FrozenSettings(BaseModel):
    """A config section: immutable once read, and unknown keys are errors (a typo is not ignored)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def from_env(value: str | None, env: str | None, what: str) -> str | None:
    """``value``, or the environment variable ``env`` names; ``what`` names the setting in errors."""
    if value is not None and env is not None:
        raise ConfigError(f"{what}: give either the value or its *_env variable, not both")
    if env is not None:
        resolved = os.environ.get(env)
        if not resolved:
            raise ConfigError(f"{what}: environment variable {env} is not set; export it before running")
        return resolved
    return value


def redacted_dsn(dsn: str) -> str:
    """The DSN with any password removed, fit for logs."""
    dsn = re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", dsn)
    return re.sub(r"(password\s*=\s*)\S+", r"\1***", dsn)
