"""ACL entries from the client's side (`Admin.create_acls`, `delete_acls`, `list_acls`):
the public `Acl` value, checked when built, and the calls to every live broker (each keeps
its own entries, as it keeps its own users: docs/guide/security.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from tidemq.client.cluster import ClusterClient
from tidemq.core import acl
from tidemq.protocol.acl_messages import (
    AclCreateRequest,
    AclDeleteRequest,
    AclEntryMsg,
    AclListRequest,
    AclListResponse,
    AclsChangedResponse,
    acl_message,
)

__all__ = ["Acl", "create_acls", "delete_acls", "list_acls"]


@dataclass(frozen=True, slots=True)
class Acl:
    """One ACL entry: `permission` ("allow" or "deny") for `principal` ("User:<name>",
    or "User:*" for everyone), connecting from `host` ("*", an IP address or a network
    such as "10.0.0.0/24"), to do `operation` ("read", "write", "create", "delete",
    "alter", "describe", "cluster_action", "all") on the `resource_type` ("topic",
    "group", "cluster", "transactional_id") named `resource_name` ("*" for every one;
    with `pattern_type` "prefixed", every name starting with it). ValueError, naming
    what is wrong, for an entry that cannot be valid."""

    principal: str
    resource_type: str
    resource_name: str
    operation: str
    permission: str = "allow"
    pattern_type: str = "literal"
    host: str = "*"

    def __post_init__(self) -> None:
        _checked(self)

    def __str__(self) -> str:
        return str(_checked(self))


_E = TypeVar("_E", bound=Enum)


def _enum(kind: type[_E], field: str, value: str) -> _E:
    try:
        return kind(value.lower())
    except ValueError:
        known = ", ".join(str(m.value) for m in kind)
        raise ValueError(f"ACL {field} {value!r}: one of {known}") from None


def _checked(entry: Acl) -> acl.AclEntry:
    try:
        return acl.AclEntry(
            principal=entry.principal,
            resource_type=_enum(acl.ResourceType, "resource type", entry.resource_type),
            resource_name=entry.resource_name,
            pattern_type=_enum(acl.PatternType, "pattern type", entry.pattern_type),
            operation=_enum(acl.Operation, "operation", entry.operation),
            permission=_enum(acl.Permission, "permission", entry.permission),
            host=entry.host,
        )
    except acl.AclError as exc:
        raise ValueError(f"bad ACL entry: {exc}") from None


def _wire(entry: Acl) -> AclEntryMsg:
    return acl_message(_checked(entry))


def _public(msg: AclEntryMsg) -> Acl:
    return Acl(
        principal=msg.principal,
        resource_type=msg.resource_type,
        resource_name=msg.resource_name,
        operation=msg.operation,
        permission=msg.permission,
        pattern_type=msg.pattern_type,
        host=msg.host,
    )


def _entries(acls: Iterable[Acl]) -> list[AclEntryMsg]:
    entries = [_wire(a) for a in acls]
    if not entries:
        raise ValueError("give at least one ACL entry")
    return entries


async def create_acls(cluster: ClusterClient, brokers: Sequence[str], acls: Iterable[Acl]) -> int:
    """Add the entries on every broker; how many were new (on the broker that added the
    most: a broker that missed an earlier call catches up)."""
    request = AclCreateRequest(entries=_entries(acls))
    answers = await asyncio.gather(
        *(cluster.call(b, request, AclsChangedResponse) for b in brokers)
    )
    return max(a.changed for a in answers)


async def delete_acls(cluster: ClusterClient, brokers: Sequence[str], acls: Iterable[Acl]) -> int:
    """Remove the entries on every broker; how many were there (the most on one broker)."""
    request = AclDeleteRequest(entries=_entries(acls))
    answers = await asyncio.gather(
        *(cluster.call(b, request, AclsChangedResponse) for b in brokers)
    )
    return max(a.changed for a in answers)


async def list_acls(
    cluster: ClusterClient,
    brokers: Sequence[str],
    *,
    principal: str | None = None,
    resource_type: str | None = None,
) -> list[Acl]:
    """The entries of every live broker (their union, sorted), optionally only those of
    one principal or resource type."""
    request = AclListRequest(principal=principal or "", resource_type=resource_type or "")
    answers = await asyncio.gather(*(cluster.call(b, request, AclListResponse) for b in brokers))
    found = {_public(m) for answer in answers for m in answer.entries}
    return sorted(found, key=lambda a: (a.principal, a.resource_type, a.resource_name, str(a)))
