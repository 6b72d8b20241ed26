"""What every command shares: the client options, output (rich tables or JSON), error
reporting and exit codes (0 ok, 1 error, 2 usage).

Every failure is one `error: <message>` line on stderr; the traceback too only with the
global `--debug` or `TIDEMQ_DEBUG=1`."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import inspect
import json
import os
import re
import ssl
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar, cast

import msgspec
import typer
from rich import box
from rich.console import Console
from rich.table import Table

from tidemq.cli.config import ConfigUsageError
from tidemq.client.cluster import ClientConfig
from tidemq.core.errors import ConfigError, TidemqError
from tidemq.core.names import is_user_name
from tidemq.net.tls import client_context

__all__ = [
    "CLIENT_CONFIG",
    "DEBUG_ENV",
    "DEFAULT_BOOTSTRAP",
    "PASSWORD_ENV",
    "USERNAME_ENV",
    "Bootstrap",
    "CliError",
    "CliUsageError",
    "Output",
    "OutputOpt",
    "check_bootstrap",
    "client_config",
    "command",
    "debugging",
    "emit_json",
    "emit_table",
    "info",
    "is_internal",
    "parse_pairs",
    "reports_errors",
    "say",
    "set_debug",
    "to_builtins",
]

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_BOOTSTRAP = "127.0.0.1:9876"

#: Environment variable that turns on `--debug` (any value but "", "0", "false", "no").
DEBUG_ENV = "TIDEMQ_DEBUG"

#: SCRAM login of the client commands, for a broker with broker.auth_enabled: the user
#: name and password come from the environment only (never a flag: it would show in `ps`).
USERNAME_ENV = "TIDEMQ_USERNAME"
PASSWORD_ENV = "TIDEMQ_PASSWORD"

#: Commands fail fast when nothing listens: a few quick retries, not the library's eight.
#: (Plaintext; `client_config()` is this with the command's --tls options applied.)
CLIENT_CONFIG = ClientConfig(retries=2, connect_timeout_ms=5_000)
_active_client_config: list[ClientConfig] = [CLIENT_CONFIG]


def client_config() -> ClientConfig:
    """The client settings of the command running now: CLIENT_CONFIG with its --tls
    options, and the login of TIDEMQ_USERNAME / TIDEMQ_PASSWORD when they are set."""
    config = _active_client_config[-1]
    username = os.environ.get(USERNAME_ENV)
    if not username:
        return config
    password = os.environ.get(PASSWORD_ENV)
    if not password:
        raise CliUsageError(f"{USERNAME_ENV} is set but {PASSWORD_ENV} is not")
    return dataclasses.replace(config, username=username, password=password)


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


def is_internal(name: str) -> bool:
    """A name of tidemq's own (`%RETRY%g`, `%DLQ%g`, `%SYS%...`, `%REDRIVE%g`,
    `g%BROADCAST%member`): topics and groups tidemq makes, hidden from `list` unless
    `--all`. User names cannot contain `%`."""
    return not is_user_name(name)


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


#: The global options of this process (one process runs one command).
_global_options: dict[str, bool] = {"debug": False}


def set_debug(on: bool) -> None:
    """The global `--debug`: failures print their traceback before the `error:` line."""
    _global_options["debug"] = on


def debugging() -> bool:
    """`--debug` was given, or `TIDEMQ_DEBUG` is set (to anything but "", 0, false, no)."""
    if _global_options["debug"]:
        return True
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _fail(message: str, code: int, exc: BaseException | None = None) -> typer.Exit:
    if exc is not None and debugging():
        # The whole chain, also what `raise ... from None` hid: that is what --debug is for.
        cause: BaseException | None = exc
        seen: set[int] = set()
        while cause is not None and id(cause) not in seen:
            seen.add(id(cause))
            cause.__suppress_context__ = False
            cause = cause.__cause__ or cause.__context__
        traceback.print_exception(exc, file=sys.stderr)
    first_line = message.strip().splitlines()[0] if message.strip() else "failed"
    sys.stderr.write(f"error: {first_line}\n")
    sys.stderr.flush()
    return typer.Exit(code)


def reports_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Wrap a command so its failures become one `error: <message>` line on stderr and an
    exit code, without a traceback (unless `debugging()`): 2 for usage and configuration
    mistakes, 1 for the rest, unexpected exceptions included."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise  # typer's own: exit codes, usage errors
        except (CliUsageError, ConfigUsageError) as exc:
            raise _fail(str(exc), 2, exc) from None
        except CliError as exc:
            raise _fail(str(exc), 1, exc) from None
        except TidemqError as exc:
            raise _fail(str(exc) or type(exc).__name__, 1, exc) from None
        except BrokenPipeError:
            # `tidemq consume ... | head`: the reader left; that is not an error.
            _silence_stdout()
            raise typer.Exit(0) from None
        except OSError as exc:  # the port is taken, the data dir is not writable, ...
            raise _fail(str(exc), 1, exc) from None
        except Exception as exc:  # a bug, or a library's failure nobody mapped
            raise _fail(f"{type(exc).__name__}: {exc}", 1, exc) from None

    return run


def command(
    app: typer.Typer, name: str | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """`@app.command()` with `reports_errors`."""

    def register(fn: Callable[P, R]) -> Callable[P, R]:
        app.command(name, short_help=_first_paragraph(fn.__doc__))(
            reports_errors(_with_client_tls(fn))
        )
        return fn

    return register


# ------------------------------------------------------------------ client TLS options

_TLS_OPTIONS = (
    inspect.Parameter(
        "tls",
        inspect.Parameter.KEYWORD_ONLY,
        default=False,
        annotation=Annotated[
            bool,
            typer.Option(
                "--tls",
                help="Connect with TLS, verifying the server against the system's CAs "
                "(implied by the other --tls-* options).",
            ),
        ],
    ),
    inspect.Parameter(
        "tls_ca_file",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            Path | None,
            typer.Option(
                "--tls-ca-file",
                metavar="FILE",
                help="Connect with TLS, verifying the server against this CA (PEM).",
                show_default=False,
            ),
        ],
    ),
    inspect.Parameter(
        "tls_cert_file",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            Path | None,
            typer.Option(
                "--tls-cert-file",
                metavar="FILE",
                help="Client certificate (PEM) for a server that asks for one.",
                show_default=False,
            ),
        ],
    ),
    inspect.Parameter(
        "tls_key_file",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            Path | None,
            typer.Option(
                "--tls-key-file",
                metavar="FILE",
                help="The client certificate's private key (PEM), unless in --tls-cert-file.",
                show_default=False,
            ),
        ],
    ),
)
_TLS_NAMES = ("--tls-ca-file", "--tls-cert-file", "--tls-key-file")
#: The running command's --tls options as given (the Spark pipelines pass the file names
#: on: each executor makes its own TLS context).
TlsFiles = tuple[bool, Path | None, Path | None, Path | None]
_active_tls_files: list[TlsFiles] = [(False, None, None, None)]


def client_tls_files() -> TlsFiles:
    """(--tls, --tls-ca-file, --tls-cert-file, --tls-key-file) of the running command."""
    return _active_tls_files[-1]


def _client_tls(
    tls: bool, ca_file: Path | None, cert_file: Path | None, key_file: Path | None
) -> ssl.SSLContext | None:
    if not (tls or ca_file or cert_file or key_file):
        return None
    try:
        return client_context(ca_file, cert_file, key_file, names=_TLS_NAMES)
    except ConfigError as exc:
        raise CliUsageError(str(exc)) from None


@contextlib.contextmanager
def _using(config: ClientConfig) -> Iterator[None]:
    """Make `config` the client settings (`client_config()`) while a command runs (and
    put the previous ones back after: tests run many commands in one process)."""
    _active_client_config.append(config)
    try:
        yield
    finally:
        _active_client_config.pop()


def _with_client_tls(fn: Callable[P, R]) -> Callable[P, R]:
    """A client command (one that takes --bootstrap) with the --tls options added."""
    signature = inspect.signature(fn, eval_str=True)
    if "bootstrap" not in signature.parameters:
        return fn
    assert not {p.name for p in _TLS_OPTIONS} & signature.parameters.keys()

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> R:
        files: TlsFiles = (
            kwargs.pop("tls", False),
            kwargs.pop("tls_ca_file", None),
            kwargs.pop("tls_cert_file", None),
            kwargs.pop("tls_key_file", None),
        )
        context = _client_tls(*files)
        if context is None:
            return fn(*args, **kwargs)
        config = dataclasses.replace(CLIENT_CONFIG, ssl_context=context)
        _active_tls_files.append(files)
        try:
            with _using(config):
                return fn(*args, **kwargs)
        finally:
            _active_tls_files.pop()

    run.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), *_TLS_OPTIONS]
    )
    return cast(Callable[P, R], run)


def _first_paragraph(doc: str | None) -> str | None:
    """A command's line in its group's list: the docstring's first paragraph, whole (click
    would cut it at the terminal's width with "...")."""
    if not doc:
        return None
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def _silence_stdout() -> None:
    """After EPIPE, point stdout at /dev/null so the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
