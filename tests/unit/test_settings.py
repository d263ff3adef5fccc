"""`raygate serve`'s options, generated from the Settings fields (server/options.py): one flag and one
environment variable per field, the flag over the variable over the default, and a clear error for
an invalid variable. No Ray, no gateway: only the parser."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pytest

from raygate.server.cli import build_parser
from raygate.server.options import Declared, add_options, declared_options, from_namespace, setting
from raygate.server.settings import ConfigError, Settings, resolve_settings

DECLARED = list(declared_options(Settings))
BY_NAME = {d.name: d for d in DECLARED}


def parse(argv: list[str], environ: Mapping[str, str] | None = None) -> Settings:
    return from_namespace(Settings, build_parser(environ or {}).parse_args(["serve", *argv]))


def serve_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser(environ or {})._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices["serve"]
    assert isinstance(parser, argparse.ArgumentParser)
    return parser


def sample(d: Declared) -> tuple[str, object]:
    """A value for the field, unlike its default: as the variable's text and as parsed."""
    if d.option.choices is not None:
        choice = next(c for c in d.option.choices if c != d.default)
        return choice, choice
    samples: dict[type, tuple[str, object]] = {
        int: ("7", 7),
        float: ("2.5", 2.5),
        str: ("from-env", "from-env"),
        Path: ("/tmp/from-env", Path("/tmp/from-env")),
        bool: ("yes", True),
        tuple: ("a, b,,c", ("a", "b", "c")),
    }
    return samples[d.kind]


def flag_argv(d: Declared) -> tuple[list[str], object]:
    """Command-line words that set the field to another value than `sample`'s, and that value."""
    if d.kind is bool:
        return [d.flag], True
    if d.kind is tuple:
        return [d.flag, "x", d.flag, "y"], ("x", "y")
    if d.option.choices is not None:
        return [d.flag, str(d.default)], d.default
    words = {int: "9", float: "0.5", str: "from-flag", Path: "/tmp/from-flag"}
    text = words[d.kind]
    return [d.flag, text], d.kind(text)


def test_every_field_has_one_flag_and_one_variable() -> None:
    assert [d.name for d in DECLARED] == [f.name for f in dataclasses.fields(Settings)]
    flags = [d.flag for d in DECLARED]
    envs = [d.option.env for d in DECLARED]
    assert len(set(flags)) == len(flags) and len(set(envs)) == len(envs)
    options = [a for a in serve_parser()._actions if not isinstance(a, argparse._HelpAction)]
    assert sorted((a.dest, tuple(a.option_strings)) for a in options) == sorted(
        (d.name, (d.flag,)) for d in DECLARED
    )


def test_existing_names_kept() -> None:
    """The flags and variables that differ from the field names (users and the image rely on them)."""
    renamed = {d.name: (d.flag, d.option.env) for d in DECLARED}
    assert renamed["config_path"] == ("--config", "RAYGATE_CONFIG")
    assert renamed["ray_address"] == ("--ray-address", "RAY_ADDRESS")
    assert renamed["sse_ping_s"] == ("--sse-ping-seconds", "RAYGATE_SSE_PING_SECONDS")
    assert renamed["ttft_timeout_s"] == ("--ttft-timeout", "RAYGATE_TTFT_TIMEOUT")
    assert renamed["responses_max_age_s"] == ("--responses-max-age", "RAYGATE_RESPONSES_MAX_AGE")
    assert renamed["api_keys"] == ("--api-key", "RAYGATE_API_KEYS")
    assert renamed["cors_origins"] == ("--cors-origin", "RAYGATE_CORS_ORIGINS")
    assert renamed["closed_admin"] == ("--closed-admin", "RAYGATE_CLOSED_ADMIN")


def test_defaults_are_the_dataclass_defaults() -> None:
    assert parse([]) == Settings()


@pytest.mark.parametrize("d", DECLARED, ids=lambda d: d.option.env)
def test_variable_sets_the_default(d: Declared) -> None:
    text, value = sample(d)
    assert getattr(parse([], {d.option.env: text}), d.name) == value


@pytest.mark.parametrize("d", DECLARED, ids=lambda d: d.flag)
def test_flag_overrides_variable(d: Declared) -> None:
    text, _ = sample(d)
    argv, value = flag_argv(d)
    assert getattr(parse(argv, {d.option.env: text}), d.name) == value


def test_empty_variable_counts_as_unset() -> None:
    assert parse([], {d.option.env: "" for d in DECLARED}) == Settings()


def test_switch_variable_false_values() -> None:
    for text in ("0", "false", "No"):
        assert parse([], {"RAYGATE_CLOSED_ADMIN": text}).closed_admin is False
    assert parse([], {"RAYGATE_ALLOW_OPEN_ADMIN": "TRUE"}).allow_open_admin is True


def test_lists_take_comma_separated_variables() -> None:
    settings = parse([], {"RAYGATE_CORS_HEADERS": " X-A ,X-B, ", "RAYGATE_API_KEYS": "k1,k2"})
    assert settings.cors_headers == ("X-A", "X-B") and settings.api_keys == ("k1", "k2")
    # Only separators: the declared default, as an unset variable.
    assert parse([], {"RAYGATE_CORS_METHODS": " , "}).cors_methods == Settings().cors_methods
    # Repeated flags replace the variable's list rather than adding to it.
    assert parse(["--api-key", "k3"], {"RAYGATE_API_KEYS": "k1,k2"}).api_keys == ("k3",)


@pytest.mark.parametrize(
    ("env", "text", "message"),
    [
        ("RAYGATE_PORT", "eighty", "invalid int value in RAYGATE_PORT: 'eighty'"),
        ("RAYGATE_HEADER_TIMEOUT", "soon", "invalid float value in RAYGATE_HEADER_TIMEOUT: 'soon'"),
        ("RAYGATE_CLOSED_ADMIN", "on", "invalid boolean value in RAYGATE_CLOSED_ADMIN: 'on'"),
        ("RAYGATE_LOG_LEVEL", "verbose", "invalid choice in RAYGATE_LOG_LEVEL: 'verbose'"),
    ],
)
def test_invalid_variable_is_a_usage_error(
    env: str, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse([], {env: text})
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: raygate serve") and "raygate serve: error: argument" in err
    assert message in err and "Traceback" not in err


def test_invalid_variable_unused_when_the_flag_is_given() -> None:
    assert parse(["--port", "9000"], {"RAYGATE_PORT": "eighty"}).port == 9000


def test_invalid_variable_does_not_stop_other_commands() -> None:
    args = build_parser({"RAYGATE_PORT": "eighty"}).parse_args(["list"])
    assert args.command == "list"


def test_invalid_flag_value_is_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(["--port", "eighty"])
    assert exit_.value.code == 2
    assert "raygate serve: error: argument --port: invalid int value: 'eighty'" in capsys.readouterr().err


def test_help_names_each_variable_and_shows_the_effective_default() -> None:
    text = serve_parser({"RAYGATE_PORT": "9001"}).format_help()
    for d in DECLARED:
        assert d.flag in text and d.option.env in text
    assert "(env RAYGATE_PORT; default: 9001)" in " ".join(text.split())
    assert "operations:" in text and "stored responses:" in text


def test_help_never_shows_a_secret_from_the_environment() -> None:
    text = serve_parser(
        {"RAYGATE_ADMIN_KEY": "admin-secret-1", "RAYGATE_API_KEYS": "api-secret-2"}
    ).format_help()
    assert "admin-secret-1" not in text and "api-secret-2" not in text


def test_admin_key_file_read_unless_the_key_is_given(tmp_path: Path) -> None:
    key_file = tmp_path / "admin_key"
    key_file.write_text("  from-file-key\n")
    from_file = resolve_settings(parse(["--admin-key-file", str(key_file)]))
    assert from_file.admin_key == "from-file-key"
    given = resolve_settings(
        parse(["--admin-key-file", str(key_file)], {"RAYGATE_ADMIN_KEY": "from-env-key"})
    )
    assert given.admin_key == "from-env-key"
    with pytest.raises(ConfigError, match="cannot read the admin key file"):
        resolve_settings(Settings(admin_key_file=tmp_path / "missing"))


def test_resolve_makes_paths_absolute() -> None:
    settings = resolve_settings(parse(["--config", "x.yaml", "--state-dir", "state"]))
    assert settings.config_path == Path("x.yaml").resolve() and settings.state_dir == Path("state").resolve()
    assert resolve_settings(Settings()).state_dir is None


def test_a_field_without_a_command_line_form_is_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class Undeclared:
        plain: int = 1

    @dataclasses.dataclass(frozen=True)
    class Unsupported:
        raw: bytes = setting(b"", env="X_RAW", help="no command-line form")

    for cls in (Undeclared, Unsupported):
        with pytest.raises(TypeError, match=r"\.(plain|raw)"):
            add_options(argparse.ArgumentParser(), cls, {})
