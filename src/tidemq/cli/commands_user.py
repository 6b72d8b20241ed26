"""`tidemq user create / delete / list`: the users of SCRAM authentication.

With `broker.auth_enabled` these run as a super user: set TIDEMQ_USERNAME and
TIDEMQ_PASSWORD (docs/guide/security.md, "Users and passwords").
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from tidemq.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    CliUsageError,
    Output,
    OutputOpt,
    check_bootstrap,
    client_config,
    command,
    emit_json,
    emit_table,
    say,
)
from tidemq.client.sync import Admin
from tidemq.core.scram import DEFAULT_ITERATIONS, MAX_ITERATIONS, MIN_ITERATIONS

__all__ = ["app"]

app = typer.Typer(
    help="Users of SCRAM-SHA-256 authentication (broker.auth_enabled).", no_args_is_help=True
)


def _admin(bootstrap: str) -> Admin:
    return Admin(check_bootstrap(bootstrap), client_config=client_config())


def _password(from_stdin: bool) -> str:
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise CliUsageError("the password is empty")
    return password


@command(app, "create")
def create(
    name: Annotated[str, typer.Argument(help="The user name.", show_default=False)],
    password_stdin: Annotated[
        bool,
        typer.Option(
            "--password-stdin",
            help="Read the password from the first line of stdin (else: a prompt).",
        ),
    ] = False,
    iterations: Annotated[
        int,
        typer.Option(
            "--iterations",
            min=MIN_ITERATIONS,
            max=MAX_ITERATIONS,
            help="PBKDF2 iterations of the stored credentials.",
        ),
    ] = DEFAULT_ITERATIONS,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Create a user on every live broker, or set a new password for one."""
    password = _password(password_stdin)
    with _admin(bootstrap) as admin:
        admin.create_user(name, password, iterations=iterations)
    say(f"user {name} saved")


@command(app, "delete")
def delete(
    name: Annotated[str, typer.Argument(help="The user name.", show_default=False)],
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Delete a user (its open connections stay open)."""
    with _admin(bootstrap) as admin:
        admin.delete_user(name)
    say(f"user {name} deleted")


@command(app, "list")
def list_(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, output: OutputOpt = Output.TABLE) -> None:
    """List the users (names and iterations; never credentials)."""
    with _admin(bootstrap) as admin:
        users = admin.list_users()
    if output is Output.JSON:
        emit_json(users)
        return
    emit_table(["USER", "ITERATIONS"], ((u.name, u.iterations) for u in users))


@command(app, "passwd")
def passwd(
    name: Annotated[str, typer.Argument(help="The user name.", show_default=False)],
    password_stdin: Annotated[
        bool,
        typer.Option(
            "--password-stdin",
            help="Read the new password from the first line of stdin (else: a prompt).",
        ),
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Set a new password for an existing user (on every live broker)."""
    with _admin(bootstrap) as admin:
        if name not in {u.name for u in admin.list_users()}:
            raise CliUsageError(f"no user {name!r}; create it with `tidemq user create`")
        admin.create_user(name, _password(password_stdin))
    say(f"password of {name} changed")
