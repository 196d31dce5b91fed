"""The run's domain errors become the API's status codes in one place (``control.api.STATUS_OF``)."""

from __future__ import annotations

from headrace.control.api import STATUS_OF
from headrace.core.errors import CommandConflict, RequestError, RunUnavailable, TableNotFound, TableRefused


def _status(exc: RequestError) -> int:
    return next(code for kind, code in STATUS_OF if isinstance(exc, kind))


def test_each_domain_error_has_its_status() -> None:
    assert _status(TableNotFound("table public.x is not replicated by this pipeline")) == 404
    assert _status(CommandConflict("table public.a is replicated already")) == 409
    assert _status(TableRefused("table public.k has no primary key")) == 422
    assert _status(RunUnavailable("the pipeline is not running")) == 503
    assert _status(RequestError("the request body must be a JSON object")) == 400
