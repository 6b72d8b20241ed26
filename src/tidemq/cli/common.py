"""What every command shares: the client options, output (rich tables or JSON), error
reporting and exit codes (0 ok, 1 error, 2 usage)."""

from __future__ import annotations

import enum
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any, ParamSpec, TypeVar

import msgspec
import typer
from rich import box
from rich.console import Console
from rich.table import Table

from tidemq.cli.config import ConfigUsageError
from tidemq.client.cluster import ClientConfig
from tidemq.core.errors import TidemqError

__all__ = [
    "CLIENT_CONFIG",
    "DEFAULT_BOOTSTRAP",
    "Bootstrap",
    "CliError",
    "CliUsageError",
    "Output",
    "OutputOpt",
    "check_bootstrap",
    "command",
    "emit_json",
    "emit_table",
    "info",
    "parse_pairs",
    "reports_errors",
    "say",
    "to_builtins",
]

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_BOOTSTRAP = "127.0.0.1:9876"

#: Commands fail fast when nothing listens: a few quick retries, not the library's eight.
CLIENT_CONFIG = ClientConfig(retries=2, connect_timeout_ms=5_000)


class Output(enum.StrEnum):
    TABLE = "table"
    JSON = "json"


Bootstrap = Annotated[
    str,
    typer.Option(
        "--bootstrap",
        "--bootstrap-server",
        "-n",
        "--namesrv",
        metavar="HOST:PORT",
        help="Name server (or `tidemq server`) to contact.",
    ),
]
OutputOpt = Annotated[
    Output,
    typer.Option("--output", "-o", case_sensitive=False, help="table, or json for scripts."),
]


class CliUsageError(Exception):
    """A usage problem found after parsing (bad k=v, conflicting options): exit 2."""


class CliError(Exception):
    """A failure the CLI finds itself (a group that does not exist): exit 1."""


_ADDRESS = re.compile(r"^\[?[A-Za-z0-9_.:-]+\]?:\d{1,5}$")


def check_bootstrap(address: str) -> str:
    if not _ADDRESS.match(address) or not 0 < int(address.rpartition(":")[2]) < 65536:
        raise CliUsageError(f"--bootstrap must be host:port, got {address!r}")
    return address


def parse_pairs(items: Iterable[str], option: str) -> dict[str, str]:
    """`k=v` options into a dict (later wins)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliUsageError(f"{option} {item!r}: use key=value")
        out[key.strip()] = value.strip()
    return out


# ------------------------------------------------------------------ output


def _stdout_console() -> Console:
    # Not a terminal: no wrapping at 80 columns, so scripts and tests see whole cells.
    width = None if sys.stdout.isatty() else 4096
    return Console(file=sys.stdout, markup=False, highlight=False, emoji=False, width=width)


def to_builtins(value: Any) -> Any:
    return msgspec.to_builtins(value)


def emit_json(value: Any) -> None:
    """One JSON document on stdout."""
    sys.stdout.write(json.dumps(to_builtins(value), ensure_ascii=False) + "\n")
    sys.stdout.flush()


def emit_table(
    columns: Sequence[str], rows: Iterable[Sequence[object]], *, title: str | None = None
) -> None:
    if title is not None:
        say(title)  # a line of its own: a table title would wrap at the table's width
    table = Table(*columns, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    _stdout_console().print(table)


def say(message: str) -> None:
    """A line for the human reading table output, on stdout."""
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def info(message: str) -> None:
    """A human-oriented note on stderr (never on stdout, which scripts read)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def _fail(message: str, code: int) -> typer.Exit:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    return typer.Exit(code)


def reports_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Wrap a command so tidemq errors become `error: <message>` on stderr and an exit
    code, without a traceback: 2 for usage and configuration mistakes, 1 for the rest."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except (CliUsageError, ConfigUsageError) as exc:
            raise _fail(str(exc), 2) from None
        except CliError as exc:
            raise _fail(str(exc), 1) from None
        except TidemqError as exc:
            raise _fail(str(exc) or type(exc).__name__, 1) from None
        except BrokenPipeError:
            # `tidemq consume ... | head`: the reader left; that is not an error.
            _silence_stdout()
            raise typer.Exit(0) from None
        except OSError as exc:  # the port is taken, the data dir is not writable, ...
            raise _fail(str(exc), 1) from None

    return run


def command(
    app: typer.Typer, name: str | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """`@app.command()` with `reports_errors`."""

    def register(fn: Callable[P, R]) -> Callable[P, R]:
        app.command(name)(reports_errors(fn))
        return fn

    return register


def _silence_stdout() -> None:
    """After EPIPE, point stdout at /dev/null so the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
