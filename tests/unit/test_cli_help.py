"""Every command's `--help` at 80 columns: every option explained, no `<bool>` placeholder
on a flag (flags take no value), no line longer than 80 columns and no summary cut short
with "..."."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import typer.main
from typer.testing import CliRunner

from tidemq.cli.main import app

ROOT = typer.main.get_command(app)


def _commands(command: object, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _commands(sub, (*path, name))


def _find(path: tuple[str, ...]) -> object:
    command: object = ROOT
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return command


COMMANDS = list(_commands(ROOT))


def test_every_command_is_walked() -> None:
    names = {" ".join(p) for p in COMMANDS}
    assert {"produce", "topic create", "group list", "pipeline archive", "cluster status"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "tidemq")
def test_help_explains_every_option_within_80_columns(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "<bool>" not in text
    for line in text.splitlines():
        assert len(line) <= 80, line
        if not line.startswith("Usage:"):
            assert not line.rstrip().endswith("..."), f"cut short: {line!r}"
            assert "…" not in line, line
    params = getattr(_find(path), "params", [])
    for param in params:
        if param.param_type_name in ("option", "argument") and not param.hidden:
            assert param.help, f"{' '.join(path)} {param.opts}: no help"


def test_a_flag_refuses_a_value_and_its_help_shows_none() -> None:
    text = CliRunner().invoke(app, ["topic", "create", "--help"]).stdout
    assert "--if-not-exists  " in text or "--if-not-exists\n" in text
    refused = CliRunner().invoke(app, ["topic", "create", "t", "--if-not-exists", "true"])
    assert refused.exit_code == 2


def test_debug_is_a_global_option() -> None:
    text = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"}).stdout
    assert "--debug" in text
    assert "TIDEMQ_DEBUG" in text
