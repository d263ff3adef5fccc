"""Settings declared once, as dataclass fields, and the command line generated from them.

A field declared with `setting(default, env=..., help=...)` gets one flag (`--field-name`, or the
`flag` given), one environment variable, and its help text; `add_options` adds them to a parser
and `from_namespace` builds the dataclass from what it parsed. The type comes from the field's
annotation: `int`, `float`, `str` or `Path` (optionally `| None`) take a value; `bool` is a switch
(`--flag`, or the variable set to 1/true/yes); `tuple[str, ...]` is a repeatable flag, or a
comma-separated variable.

Precedence: the flag, then the environment variable, then the field's default. The variable's value
becomes the flag's default, converted by argparse only when the flag is absent, so an invalid one
ends the command with the usual `PROG: error: ...` and exit status 2, naming the variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")

_KEY = "raygate.option"
_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no")
_SCALARS: dict[type, Callable[[str], object]] = {int: int, float: float, str: str, Path: Path}


@dataclasses.dataclass(frozen=True, slots=True)
class Group:
    """A titled section of `--help`; options without one are listed under the parser's own options."""

    title: str
    description: str


@dataclasses.dataclass(frozen=True, slots=True)
class Option:
    """How one settings field is set from outside the process."""

    env: str
    help: str
    flag: str | None = None  # None: `--` and the field's name, with dashes
    group: Group | None = None
    choices: tuple[str, ...] | None = None
    # Shown in the help as the default instead of the value itself (e.g. "all cores" for None).
    shown_default: str | None = None


def setting(
    default: T,
    *,
    env: str,
    help: str,
    flag: str | None = None,
    group: Group | None = None,
    choices: tuple[str, ...] | None = None,
    shown_default: str | None = None,
) -> T:
    """A dataclass field with its default, environment variable, flag and help text."""
    option = Option(env, help, flag, group, choices, shown_default)
    return dataclasses.field(default=default, metadata={_KEY: option})


@dataclasses.dataclass(frozen=True, slots=True)
class Declared:
    """One field of a settings class with its option, the flag resolved, and its default and type."""

    name: str
    flag: str
    option: Option
    default: object
    kind: type  # int, float, str, Path, bool, or tuple (of str)


def declared_options(cls: type[DataclassInstance]) -> Iterator[Declared]:
    """The fields of a settings dataclass, in order; each must be declared with `setting()`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        option = f.metadata.get(_KEY)
        if not isinstance(option, Option):
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with setting()")
        flag = option.flag or "--" + f.name.replace("_", "-")
        yield Declared(f.name, flag, option, f.default, _kind(cls, f.name, hints[f.name]))


def add_options(
    parser: argparse.ArgumentParser, cls: type[DataclassInstance], environ: Mapping[str, str]
) -> None:
    """One argument per field of `cls`, its default read from `environ` where the variable is set
    (an empty variable counts as unset)."""
    groups: dict[Group, argparse._ArgumentGroup] = {}
    for d in declared_options(cls):
        target: argparse.ArgumentParser | argparse._ArgumentGroup = parser
        if d.option.group is not None:
            group = d.option.group
            if group not in groups:
                groups[group] = parser.add_argument_group(group.title, _escape(group.description))
            target = groups[group]
        _add(target, d, environ.get(d.option.env, ""))


def from_namespace(cls: type[D], args: argparse.Namespace) -> D:
    """The settings that `add_options`' arguments parsed into."""
    return cls(**{d.name: getattr(args, d.name) for d in declared_options(cls)})


class _EnvValue(str):
    """A default read from an environment variable: argparse converts it as it would the flag's
    value, and an error then names the variable."""

    env: str

    def __new__(cls, value: str, env: str) -> _EnvValue:
        self = super().__new__(cls, value)
        self.env = env
        return self


def _add(target: argparse.ArgumentParser | argparse._ArgumentGroup, d: Declared, raw: str) -> None:
    option = d.option
    metavar = d.flag.removeprefix("--").replace("-", "_").upper()
    if d.kind is tuple:
        items = tuple(item.strip() for item in raw.split(",") if item.strip())
        declared = ", ".join(typing.cast(tuple[str, ...], d.default))
        target.add_argument(
            d.flag,
            dest=d.name,
            action=_Repeat,
            default=items or d.default,
            metavar=metavar,
            help=_help(d, "{env}, comma-separated", _escape(declared)),
        )
        return
    default = _EnvValue(raw, option.env) if raw else d.default
    if d.kind is bool:
        target.add_argument(
            d.flag,
            dest=d.name,
            action=_Switch,
            default=default,
            type=_converter(d, "boolean", _boolean),
            help=_help(d, "{env}=1", ""),
        )
        return
    target.add_argument(
        d.flag,
        dest=d.name,
        default=default,
        type=_converter(d, d.kind.__name__, _SCALARS[d.kind]),
        choices=option.choices,
        metavar=metavar if option.choices is None else None,
        help=_help(d, "{env}", "" if d.default is None else "%(default)s"),
    )


def _help(d: Declared, env: str, default: str) -> str:
    """The help text, then the variable and the default: the declared text if any, else `default`
    (escaped, or `%(default)s`: argparse shows the value, the variable's when set); none if empty."""
    shown = _escape(d.option.shown_default) if d.option.shown_default is not None else default
    suffix = env.format(env=d.option.env) + (f"; default: {shown}" if shown else "")
    return f"{_escape(d.option.help)} (env {suffix})"


def _escape(text: str) -> str:
    return text.replace("%", "%%")


def _converter(d: Declared, name: str, parse: Callable[[str], object]) -> Callable[[str], object]:
    def convert(text: str) -> object:
        source = f" in {text.env}" if isinstance(text, _EnvValue) else ""
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {name} value{source}: {text!r}") from None
        choices = d.option.choices
        if source and choices is not None and value not in choices:
            listed = ", ".join(map(repr, choices))
            raise argparse.ArgumentTypeError(f"invalid choice{source}: {text!r} (choose from {listed})")
        return value

    convert.__name__ = name
    return convert


def _boolean(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(text)


class _Switch(argparse.Action):
    """`--flag`: true. Unlike store_true it keeps a `type`, which converts a default read from the
    environment (1/true/yes or 0/false/no)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, True)


class _Repeat(argparse.Action):
    """`--flag A --flag B`: (A, B). The values given replace the default (the variable's list or the
    declared one) rather than adding to it, as argparse's `append` would."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        given = getattr(namespace, self.dest)
        before = () if given is self.default else given
        setattr(namespace, self.dest, (*before, values))


def _kind(cls: type, name: str, annotation: object) -> type:
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) and len(args) == 2 and type(None) in args:
        annotation = next(a for a in args if a is not type(None))
    if isinstance(annotation, type) and (annotation is bool or annotation in _SCALARS):
        return annotation
    if typing.get_origin(annotation) is tuple and typing.get_args(annotation) == (str, ...):
        return tuple
    raise TypeError(f"{cls.__name__}.{name}: no command-line form for {annotation}")
