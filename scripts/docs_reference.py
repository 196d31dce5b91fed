"""The documentation site's generated pages: the configuration reference from the pydantic config
models, the CLI reference from the argument parser. An MkDocs hook (``mkdocs.yml`` ``hooks:``) adds
them to the site at every build, so they cannot drift from the code; nothing generated is committed.

Run alone, it prints a page: ``python scripts/docs_reference.py config|fanout|cli``.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The generated pages, by their path in the site.
CONFIG_PAGE = "reference/config.md"
FANOUT_PAGE = "reference/fanout-config.md"
CLI_PAGE = "reference/cli.md"


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def type_text(tp: Any) -> str:
    """A field's type as a reader writes it in YAML: ``int``, ``keep | drop``, ``list of string``."""
    if tp is type(None):
        return "null"
    origin = get_origin(tp)
    if origin is Literal:
        return " \\| ".join(f"`{v}`" for v in get_args(tp))
    if origin in (Union, types.UnionType):
        parts = [type_text(a) for a in get_args(tp) if a is not type(None)]
        return " or ".join(parts)
    if origin in (list, tuple, set):
        args = get_args(tp)
        return f"list of {type_text(args[0])}" if args else "list"
    if origin is dict:
        key, value = get_args(tp) or (str, Any)
        return f"mapping of {type_text(key)} to {type_text(value)}"
    if _is_model(tp):
        return "section" if _below(tp) else "target section (one registered target by name)"
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if tp in names:
        return names[tp]
    return "any" if tp is Any else getattr(tp, "__name__", str(tp))


def default_text(field: FieldInfo) -> str:
    """The default as YAML spells it, or *required*."""
    if field.is_required():
        return "*required*"
    factory = field.default_factory
    value = factory() if factory is not None else field.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "*required*"
    if isinstance(value, BaseModel):
        return "(section)"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list | dict) and not value:
        return "`[]`" if isinstance(value, list) else "`{}`"
    if isinstance(value, int) and value >= 10_000:
        return f"`{value}` ({value:,})"
    return f"`{value}`"


def _cell(text: str | None) -> str:
    text = " ".join((text or "").split()).replace("|", "\\|")
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # <name> is text, not a tag


def _model_of(tp: Any) -> type[BaseModel] | None:
    """The model a field holds (also through ``X | None`` and ``list[X]``), or None."""
    if _is_model(tp):
        return tp  # type: ignore[no-any-return]
    for arg in get_args(tp):
        if _is_model(arg):
            return arg  # type: ignore[no-any-return]
    return None


def _below(model: type[BaseModel]) -> bool:
    """Whether a section's own keys are listed: not for a ``target:``-like section (one registered
    target by name; each target's keys are listed under its own name)."""
    from headrace.targets.registry import TargetSection

    return not issubclass(model, TargetSection)


def model_rows(model: type[BaseModel], prefix: str) -> list[str]:
    """One table row per key of ``model`` and of every section below it, depth first."""
    rows: list[str] = []
    below: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        path = f"{prefix}{key}"
        nested = _model_of(field.annotation)
        description = field.description or (nested.__doc__ if nested else None)
        rows.append(f"| `{path}` | {type_text(field.annotation)} | {default_text(field)} | {_cell(description)} |")
        if nested is not None and _below(nested):
            below.append((f"{path}[]" if get_origin(field.annotation) is list else path, nested))
    for path, nested in below:
        rows += model_rows(nested, f"{path}.")
    return rows


_HEADER = ["| key | type | default | description |", "|---|---|---|---|"]


def _section(title: str, doc: str | None, rows: list[str]) -> list[str]:
    return [f"## {title}", "", _cell(doc), "", *_HEADER, *rows, ""]


def config_reference() -> str:
    """The reference page of a replication pipeline's file (``headrace.config.PipelineConfig``)."""
    from headrace.config import PipelineConfig
    from headrace.targets import registry

    lines = [
        "# Configuration reference",
        "",
        "Every key of a pipeline file, generated from the config models (`headrace/config.py`,",
        "`headrace/source/config.py`, `headrace/targets/*/config.py`, `headrace/lineage/config.py`) each",
        "time the site is built. A key not listed here is an error (`extra=forbid`); every key is checked",
        "at start-up and by `headrace check`. Secrets go through `*_env` keys naming an environment",
        "variable. A commented example: [Configuration](../configuration.md).",
        "",
    ]
    for name, field in PipelineConfig.model_fields.items():
        nested = _model_of(field.annotation)
        if name == "target":
            lines += ["## target", "",
                      "Exactly one registered target, as `target: {<name>: {...}}`: "
                      + ", ".join(f"`{n}`" for n in registry.names()) + ".", ""]
            for kind in registry.names():
                plugin = registry.get(kind)
                lines += [f"### target.{kind}", "", _cell(plugin.settings_model.__doc__), "", *_HEADER,
                          *model_rows(plugin.settings_model, f"target.{kind}."), ""]
            continue
        if nested is None:
            lines += [f"## {name}", "", *_HEADER,
                      f"| `{name}` | {type_text(field.annotation)} | {default_text(field)} | {_cell(field.description)} |",
                      ""]
            continue
        default = "required section" if field.is_required() else "optional section"
        lines += _section(name, f"{nested.__doc__} ({default})", model_rows(nested, f"{name}."))
    return "\n".join(lines)


def fanout_reference() -> str:
    """The reference page of a fan-out file (``headrace.fanout.config.FanoutConfig``)."""
    from headrace.fanout.config import FanoutConfig

    return "\n".join([
        "# Fan-out configuration reference",
        "",
        "Every key of a fan-out file (one DuckLake table routed to many tenant lakes, see",
        "[Fan-out](../fanout.md)), generated from `headrace/fanout/config.py` each time the site is built.",
        "",
        _cell(FanoutConfig.__doc__) + " One more top-level key is read before validation: `defaults`, a"
        " mapping merged under every destination, whose string values may use `{id}` and `{routing_value}`.",
        "",
        *_HEADER,
        *model_rows(FanoutConfig, ""),
        "",
    ])


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def _argument_row(action: argparse.Action) -> str | None:
    if isinstance(action, argparse._HelpAction):
        return None
    if action.option_strings:
        spelled = ", ".join(f"`{o}`" for o in action.option_strings)
        if action.nargs != 0:
            spelled += f" `{action.metavar or action.dest.upper()}`"
    else:
        spelled = f"`{action.metavar or action.dest}`"
    if action.choices:
        spelled += " (" + " \\| ".join(f"`{c}`" for c in action.choices) + ")"
    if action.required or (not action.option_strings and action.nargs not in ("?", "*")):
        need = "required"
    elif action.nargs == 0 or action.default in (None, False, argparse.SUPPRESS):
        need = ""
    else:
        need = f"default `{action.default}`"
    return f"| {spelled} | {need} | {_cell(action.help)} |"


def cli_reference() -> str:
    """The reference page of the ``headrace`` command, from ``headrace.cli.build_parser``."""
    from headrace.cli import build_parser

    parser = build_parser()
    lines = [
        "# CLI reference",
        "",
        "Generated from the argument parser (`headrace/cli.py`) each time the site is built.",
        "`headrace <command> --help` prints the same.",
        "",
        "```",
        parser.format_usage().strip(),
        "```",
        "",
        "| option | | what |",
        "|---|---|---|",
    ]
    lines += [row for a in parser._actions if (row := _argument_row(a)) and not isinstance(a, argparse._SubParsersAction)]
    lines.append("")
    for name, text, sub in _subcommands(parser):
        rows = [row for a in sub._actions if (row := _argument_row(a))]
        lines += [f"## headrace {name}", "", _cell(text[:1].upper() + text[1:]) + ".", "",
                  "```", sub.format_usage().strip().removeprefix("usage: "), "```", ""]
        if rows:
            lines += ["| argument | | what |", "|---|---|---|", *rows, ""]
    return "\n".join(lines)


PAGES = {CONFIG_PAGE: config_reference, FANOUT_PAGE: fanout_reference, CLI_PAGE: cli_reference}


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated pages to the site's files (they exist nowhere on disk)."""
    from mkdocs.structure.files import File

    for path, render in PAGES.items():
        files.append(File.generated(config, path, content=render()))
    return files


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "config"
    print({"config": config_reference, "fanout": fanout_reference, "cli": cli_reference}[which]())
