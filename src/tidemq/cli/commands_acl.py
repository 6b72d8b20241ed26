"""`tidemq acl add / remove / list`: the ACL entries of the brokers, with the flags of
Kafka's `kafka-acls.sh` (docs/guide/security.md, "Who may do what").

    tidemq acl add --allow-principal User:alice --operation write --topic orders
    tidemq acl add --allow-principal User:etl --operation read --topic raw- \\
        --resource-pattern-type prefixed --group etl
    tidemq acl remove --deny-principal User:bob --operation all --topic orders
    tidemq acl list [--principal User:alice] [--resource-type topic]

One resource per `--topic`, `--group`, `--transactional-id` or `--cluster` flag (several
may be given); every principal gets every operation on every resource (Kafka's rule).
With `broker.authorization_enabled` these run as a super user (TIDEMQ_USERNAME and
TIDEMQ_PASSWORD).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
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
from tidemq.client.acls import Acl
from tidemq.client.sync import Admin

__all__ = ["app"]

app = typer.Typer(
    help="ACL entries: who may do what (broker.authorization_enabled).", no_args_is_help=True
)

Principals = Annotated[
    list[str] | None,
    typer.Option(
        metavar="PRINCIPAL",
        help="A principal, User:<name> or User:* (repeatable).",
        show_default=False,
    ),
]
Topics = Annotated[
    list[str] | None,
    typer.Option("--topic", metavar="NAME", help="A topic (repeatable).", show_default=False),
]
Groups = Annotated[
    list[str] | None,
    typer.Option(
        "--group", metavar="NAME", help="A consumer group (repeatable).", show_default=False
    ),
]
TxnIds = Annotated[
    list[str] | None,
    typer.Option(
        "--transactional-id",
        metavar="GROUP",
        help="A transaction group (repeatable).",
        show_default=False,
    ),
]


@dataclass(frozen=True, slots=True)
class _Flags:
    allow: list[str]
    deny: list[str]
    operations: list[str]
    resources: list[tuple[str, str]]
    pattern: str
    hosts: list[str]


def _entries(flags: _Flags) -> list[Acl]:
    if not flags.allow and not flags.deny:
        raise CliUsageError("give --allow-principal or --deny-principal")
    if not flags.operations:
        raise CliUsageError("give --operation (read, write, create, delete, alter, describe, ...)")
    if not flags.resources:
        raise CliUsageError("give a resource: --topic, --group, --transactional-id or --cluster")
    out = []
    for permission, principals in (("allow", flags.allow), ("deny", flags.deny)):
        for principal, operation, (resource_type, name), host in itertools.product(
            principals, flags.operations, flags.resources, flags.hosts or ["*"]
        ):
            try:
                out.append(
                    Acl(
                        principal=principal,
                        resource_type=resource_type,
                        resource_name=name,
                        operation=operation,
                        permission=permission,
                        pattern_type=flags.pattern,
                        host=host,
                    )
                )
            except ValueError as exc:
                raise CliUsageError(str(exc)) from None
    return out


def _resources(
    *, topics: list[str] | None, groups: list[str] | None, txn_ids: list[str] | None, cluster: bool
) -> list[tuple[str, str]]:
    found = [("topic", t) for t in topics or []]
    found += [("group", g) for g in groups or []]
    found += [("transactional_id", x) for x in txn_ids or []]
    if cluster:
        found.append(("cluster", "cluster"))
    return found


def _change(add: bool, flags: _Flags, bootstrap: str) -> None:
    acls = _entries(flags)
    with Admin(check_bootstrap(bootstrap), client_config=client_config()) as admin:
        changed = admin.create_acls(acls) if add else admin.delete_acls(acls)
    verb = "added" if add else "removed"
    say(f"{changed} of {len(acls)} ACL entr{'y' if len(acls) == 1 else 'ies'} {verb}")


@command(app, "add")
def add(
    *,
    allow_principal: Principals = None,
    deny_principal: Principals = None,
    operation: Annotated[
        list[str] | None,
        typer.Option(
            metavar="OPERATION",
            help="read, write, create, delete, alter, describe, cluster_action or all "
            "(repeatable).",
            show_default=False,
        ),
    ] = None,
    topic: Topics = None,
    group: Groups = None,
    transactional_id: TxnIds = None,
    cluster: Annotated[bool, typer.Option("--cluster", help="The cluster resource.")] = False,
    resource_pattern_type: Annotated[
        str,
        typer.Option(metavar="TYPE", help="literal (the name, or * for all) or prefixed."),
    ] = "literal",
    host: Annotated[
        list[str] | None,
        typer.Option(
            help="*, an IP address or a network (repeatable; default *).", show_default=False
        ),
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Add ACL entries on every live broker."""
    resources = _resources(topics=topic, groups=group, txn_ids=transactional_id, cluster=cluster)
    flags = _Flags(
        allow_principal or [], deny_principal or [], operation or [], resources,
        resource_pattern_type, host or [],
    )  # fmt: skip
    _change(True, flags, bootstrap)


@command(app, "remove")
def remove(
    *,
    allow_principal: Principals = None,
    deny_principal: Principals = None,
    operation: Annotated[
        list[str] | None,
        typer.Option(metavar="OPERATION", help="As for add (repeatable).", show_default=False),
    ] = None,
    topic: Topics = None,
    group: Groups = None,
    transactional_id: TxnIds = None,
    cluster: Annotated[bool, typer.Option("--cluster", help="The cluster resource.")] = False,
    resource_pattern_type: Annotated[
        str, typer.Option(metavar="TYPE", help="literal or prefixed.")
    ] = "literal",
    host: Annotated[
        list[str] | None,
        typer.Option(metavar="HOST", help="As for add (default *).", show_default=False),
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Remove exactly these ACL entries on every live broker."""
    resources = _resources(topics=topic, groups=group, txn_ids=transactional_id, cluster=cluster)
    flags = _Flags(
        allow_principal or [], deny_principal or [], operation or [], resources,
        resource_pattern_type, host or [],
    )  # fmt: skip
    _change(False, flags, bootstrap)


@command(app, "list")
def list_(
    principal: Annotated[
        str | None, typer.Option(help="Only this principal's entries.", show_default=False)
    ] = None,
    resource_type: Annotated[
        str | None,
        typer.Option(help="Only entries on topic, group, cluster or transactional_id."),
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """List the ACL entries of the live brokers."""
    with Admin(check_bootstrap(bootstrap), client_config=client_config()) as admin:
        acls = admin.list_acls(principal=principal, resource_type=resource_type)
    if output is Output.JSON:
        emit_json(acls)
        return
    emit_table(
        ["PERMISSION", "PRINCIPAL", "HOST", "OPERATION", "RESOURCE", "NAME", "PATTERN"],
        (
            (a.permission, a.principal, a.host, a.operation, a.resource_type,
             a.resource_name, a.pattern_type)
            for a in acls
        ),
    )  # fmt: skip
