"""The ``lineage:`` section of a pipeline file."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class LineageConfig(BaseModel):
    """Where OpenLineage events go, and how often; off unless ``transport`` says otherwise."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    transport: Literal["off", "file", "http"] = Field(
        "off", description="off (default), file (JSON lines appended to `file`) or http (a Marquez-compatible"
        " endpoint at `url`)"
    )
    file: str | None = Field(None, description="with transport: file, the JSON-lines file events are appended to")
    url: str | None = Field(None, description="with transport: http, the server's base URL, e.g. http://marquez:5000")
    endpoint: str = Field("api/v1/lineage", description="with transport: http, the path events are POSTed to")
    api_key_env: str | None = Field(None, description="environment variable holding a bearer token for the server")
    namespace: str = Field("headrace", description="OpenLineage job namespace of the pipeline's jobs")
    every: Literal["batch", "interval"] = Field(
        "batch", description="batch: one event per initial copy and per apply batch; interval: per table, one"
        " event summing the batches of each `interval_seconds` (copies still get one each)"
    )
    interval_seconds: float = Field(60.0, gt=0, description="with every: interval, the length of a summary")

    @model_validator(mode="after")
    def _destination(self) -> LineageConfig:
        if self.transport == "file" and not self.file:
            raise ValueError("lineage.transport: file needs lineage.file (a path to append JSON lines to)")
        if self.transport == "http" and not self.url:
            raise ValueError("lineage.transport: http needs lineage.url (e.g. http://marquez:5000)")
        return self

    def api_key(self) -> str | None:
        """The bearer token from ``api_key_env``, if set."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None
