"""The documentation site's generated references (scripts/docs_reference.py) list every key of the
config models and every command and option of the CLI: they come from the code, so they cannot
drift from it; this checks the generator misses nothing."""

from __future__ import annotations

import argparse

from pydantic import BaseModel

from headrace.cli import build_parser
from headrace.config import PipelineConfig
from headrace.fanout.config import FanoutConfig
from headrace.targets import registry
from scripts.docs_reference import cli_reference, config_reference, fanout_reference


def _keys(model: type[BaseModel]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


def test_every_pipeline_key_is_in_the_config_reference() -> None:
    page = config_reference()
    for section, field in PipelineConfig.model_fields.items():
        assert f"`{section}" in page
        model = field.annotation
        if section != "target" and isinstance(model, type) and issubclass(model, BaseModel):
            for key in _keys(model):
                assert f"| `{section}.{key}` |" in page, f"{section}.{key} missing"
    for kind in registry.names():
        for key in _keys(registry.get(kind).settings_model):
            assert f"| `target.{kind}.{key}` |" in page, f"target.{kind}.{key} missing"
    assert "| `target.iceberg.catalog.uri_env` | string | unset |" in page  # nested sections too
    assert "| `source.tables` | list of string | `[]` |" in page
    assert "| `schema_changes.drop_column` | `keep` \\| `drop` | `keep` |" in page


def test_every_fanout_key_is_in_its_reference() -> None:
    page = fanout_reference()
    for key in _keys(FanoutConfig):
        assert f"| `{key}` |" in page
    assert "| `destinations[].routing_value` |" in page


def test_every_command_and_option_is_in_the_cli_reference() -> None:
    page = cli_reference()
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in sub.choices.items():
        assert f"## headrace {name}\n" in page
        for action in command._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}`" in page, f"headrace {name} {option} missing"
