"""MkDocs hook: the generated reference pages, rendered at build time from their one source.

`<!-- raygate:config-reference -->` becomes the `models.yaml` schema, read from the pydantic models
in `raygate.protocol.config` (`GatewayConfig`, `ModelConfig` and every model nested in them, which
live in its sibling modules: `policies`, `model_source`, `capabilities`, `lora`, ...): field, type,
default, constraints and the field's `description`.

`<!-- raygate:cli-reference -->` becomes the `raygate` command line, read from the argparse parser
of `raygate.server.cli` (`build_parser()`, or `_parser()` where it still has that name): every
sub-command, its options, their defaults and help.

Nothing generated is committed; `make docs` builds with `--strict`, so a failing import fails it.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import importlib
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import annotated_types
from mkdocs.exceptions import PluginError

REPO = Path(__file__).resolve().parents[2]
CONFIG_MARKER = "<!-- raygate:config-reference -->"
CLI_MARKER = "<!-- raygate:cli-reference -->"

# Environment variables the parser reads for its defaults: cleared while it is built, so the page
# shows the defaults a fresh shell gets, not the ones of whoever runs `make docs`.
_ENV_PREFIXES = ("RAYGATE_", "RAY_ADDRESS")


def _import(name: str) -> types.ModuleType:
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))  # an installed (editable) raygate comes first
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise PluginError(
            f"docs/hooks/reference.py cannot import {name} ({exc}): build the docs with the "
            "project's venv (`make docs`)"
        ) from exc


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    return markdown


# --------------------------------------------------------------------------------------------
# Configuration


def _cell(text: str) -> str:
    """One Markdown table cell: a single line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _anchor(model: type) -> str:
    return "config-" + re.sub(r"(?<!^)(?=[A-Z])", "-", model.__name__).lower()


def _is_model(tp: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _constraint_text(metadata: list[Any]) -> list[str]:
    out: list[str] = []
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            out.append(f"≥ {_number(item.ge)}")
        elif isinstance(item, annotated_types.Gt):
            out.append(f"> {_number(item.gt)}")
        elif isinstance(item, annotated_types.Le):
            out.append(f"≤ {_number(item.le)}")
        elif isinstance(item, annotated_types.Lt):
            out.append(f"< {_number(item.lt)}")
        elif isinstance(item, annotated_types.MinLen):
            out.append(f"length ≥ {item.min_length}")
        elif isinstance(item, annotated_types.MaxLen):
            out.append(f"length ≤ {item.max_length}")
        else:
            pattern = getattr(item, "pattern", None)
            if pattern:
                out.append(f"pattern `{pattern}`")
            if getattr(item, "allow_inf_nan", None) is False:
                out.append("finite")
    return out


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return f"{value:,}".replace(",", " ") if isinstance(value, int) and abs(value) >= 10_000 else str(value)


def _type_text(tp: Any, link: Callable[[type], str]) -> str:
    """A field's annotation as a reader writes it in YAML terms; nested models link to their table."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        inner = _type_text(args[0], link)
        metadata: list[Any] = []
        for extra in args[1:]:
            metadata.extend(getattr(extra, "metadata", [extra]))
        limits = _constraint_text(metadata)
        return f"{inner} ({', '.join(limits)})" if limits else inner
    if origin is typing.Literal:
        return " | ".join(f'`"{a}"`' if isinstance(a, str) else f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a, link) for a in args)
    if origin in (list, tuple, set, frozenset):
        return f"list of {_type_text(args[0], link)}" if args else "list"
    if origin is dict:
        return f"map of {_type_text(args[0], link)} → {_type_text(args[1], link)}" if args else "map"
    if tp is type(None):
        return "`null`"
    if tp is Any:
        return "any"
    if _is_model(tp):
        return link(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " | ".join(f"`{m.value}`" for m in tp)
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _default_text(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        value = field.default_factory()
        if _is_model(type(value)):
            return "(its defaults)"
    else:
        value = field.default
    if value is PydanticUndefined:
        return "**required**"
    if value is None:
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, (list, dict)) and not value:
        return f"`{'[]' if isinstance(value, list) else '{}'}`"
    return f"`{_number(value)}`"


def _walk_models(root: type) -> list[tuple[type, str]]:
    """`root` and every model nested in its fields, first seen first, with its YAML path."""
    seen: dict[type, str] = {}

    def visit(model: type, path: str) -> None:
        if model in seen:
            return
        seen[model] = path
        for name, field in model.model_fields.items():
            for inner in _models_in(field.annotation):
                suffix = "[]" if _is_list_of_models(field.annotation) else ""
                visit(inner, f"{path}.{name}{suffix}" if path else f"{name}{suffix}")

    visit(root, "")
    return list(seen.items())


def _is_list_of_models(tp: Any) -> bool:
    return typing.get_origin(tp) in (list, tuple) and any(_is_model(a) for a in typing.get_args(tp))


def _models_in(tp: Any) -> Iterator[type]:
    if _is_model(tp):
        yield tp
    for arg in typing.get_args(tp):
        yield from _models_in(arg)


def _doc(model: type) -> str:
    text = (model.__doc__ or "").strip()
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "\n\n".join(paragraphs)


def config_reference() -> str:
    config = _import("raygate.protocol.config")
    models = _walk_models(config.GatewayConfig)
    anchors = {model: _anchor(model) for model, _ in models}

    def link(model: type) -> str:
        return f"[{model.__name__}](#{anchors[model]})" if model in anchors else model.__name__

    parts: list[str] = []
    for model, path in models:
        where = f"`{path}`" if path else "the whole file"
        parts.append(f"### {model.__name__} {{ #{anchors[model]} }}\n")
        parts.append(f"Where: {where} · Python: `{model.__module__}.{model.__qualname__}`\n")
        if doc := _doc(model):
            parts.append(doc + "\n")
        parts.append("| field | type | default | constraints | description |")
        parts.append("| --- | --- | --- | --- | --- |")
        for name, field in model.model_fields.items():
            parts.append(
                "| "
                + " | ".join(
                    [
                        f"`{name}`",
                        _cell(_type_text(field.annotation, link)),
                        _cell(_default_text(field)),
                        _cell(", ".join(_constraint_text(field.metadata)) or ""),
                        _cell(field.description or ""),
                    ]
                )
                + " |"
            )
        parts.append("")
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------
# Command line


@contextlib.contextmanager
def _clean_environment() -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}
    for key in saved:
        del os.environ[key]
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps usage lines to the terminal's width
    try:
        yield
    finally:
        os.environ.update(saved)
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns


def _build_parser() -> argparse.ArgumentParser:
    cli = _import("raygate.server.cli")
    factory = getattr(cli, "build_parser", None) or getattr(cli, "_parser", None)
    if factory is None:
        raise PluginError("raygate.server.cli has neither build_parser() nor _parser()")
    with _clean_environment():
        parser: argparse.ArgumentParser = factory()
    return parser


def _shown_default(value: Any) -> Any:
    """A default as a reader of the page should see it: paths inside the repository relative to it."""
    if isinstance(value, Path):
        with contextlib.suppress(ValueError):
            return value.resolve().relative_to(REPO)
    return value


def _help_text(action: argparse.Action, prog: str) -> str:
    if not action.help:
        return ""
    params: dict[str, Any] = dict(vars(action), prog=prog)
    params["default"] = _shown_default(action.default)
    for key, value in list(params.items()):
        if isinstance(value, (list, tuple)) and key == "choices":
            params[key] = ", ".join(map(str, value))
    return action.help % params


def _option_text(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    takes_value = action.nargs != 0
    metavar = action.metavar or action.dest.upper()
    return ", ".join(
        f"`{opt} {metavar}`" if takes_value and not action.choices else f"`{opt}`"
        for opt in action.option_strings
    )


def _value_text(action: argparse.Action) -> str:
    if action.nargs == 0:  # a flag
        return "flag, off" if not action.default else "flag, **on**"
    default = _shown_default(action.default)
    if default is None or default == []:
        text = "—"
    elif isinstance(default, (list, tuple)):
        text = ", ".join(f"`{d}`" for d in default)
    else:
        text = f"`{default}`"
    if action.choices:
        text += " (one of " + ", ".join(f"`{c}`" for c in action.choices) + ")"
    if isinstance(action, argparse._AppendAction):
        text += "; repeatable"
    if action.required or (not action.option_strings and action.nargs not in ("?", "*")):
        text = "**required**"
    return text


def _actions_table(actions: list[argparse.Action], prog: str) -> list[str]:
    rows = [
        a
        for a in actions
        if a.help is not argparse.SUPPRESS
        and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
    ]
    if not rows:
        return []
    lines = ["| option | default | help |", "| --- | --- | --- |"]
    for action in rows:
        lines.append(
            f"| {_cell(_option_text(action))} | {_cell(_value_text(action))} | "
            f"{_cell(_help_text(action, prog))} |"
        )
    return [*lines, ""]


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, helps.get(name, ""), sub))
    return out


def _render_parser(parser: argparse.ArgumentParser, level: int) -> list[str]:
    lines: list[str] = []
    usage = parser.format_usage().strip().removeprefix("usage: ")
    # argparse indents continuation lines under the text after "usage: "
    usage = "\n".join(line.removeprefix(" " * len("usage: ")) for line in usage.splitlines())
    lines += ["```text", usage, "```", ""]
    if parser.description:
        lines += [parser.description, ""]
    for group in parser._action_groups:
        table = _actions_table(group._group_actions, parser.prog)
        if not table:
            continue
        if group.title not in ("positional arguments", "options", "optional arguments"):
            lines.append(f"**{group.title}**" + (f": {group.description}" if group.description else ""))
            lines.append("")
        elif group.title == "positional arguments":
            lines += ["Arguments:", ""]
        lines += table
    for _name, help_text, sub in _subcommands(parser):
        slug = "cli-" + sub.prog.replace(" ", "-")
        lines += [f"{'#' * level} `{sub.prog}` {{ #{slug} }}", ""]
        if help_text:
            lines += [help_text[0].upper() + help_text[1:] + ".", ""]
        lines += _render_parser(sub, level + 1)
    return lines


def cli_reference() -> str:
    parser = _build_parser()
    commands = _subcommands(parser)
    index = ["| command | what it does |", "| --- | --- |"]
    for _, help_text, sub in commands:
        index.append(f"| [`{sub.prog}`](#cli-{sub.prog.replace(' ', '-')}) | {_cell(help_text)} |")
    return "\n".join([*index, "", *_render_parser(parser, 3)])
