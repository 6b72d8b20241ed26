"""ACL entries from the client's side (`Admin.create_acls`, `delete_acls`, `list_acls`):
the public `Acl` value, checked when built, and the calls to the cluster's writer of users
and ACL entries (`writer_call`, ADR 15), whence changes reach every broker."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

import msgspec

from tidemq.client.cluster import ClusterClient
from tidemq.core import acl
from tidemq.core.errors import ChangeUnconfirmed, InvalidRequest, NotCoordinator
from tidemq.protocol.acl_messages import (
    AclCreateRequest,
    AclDeleteRequest,
    AclEntryMsg,
    AclListRequest,
    AclListResponse,
    AclsChangedResponse,
    acl_message,
)

__all__ = ["Acl", "create_acls", "delete_acls", "list_acls", "writer_call"]


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


#: Attempts at a change of users or ACL entries while the writer moves (a failover): each
#: NotCoordinator refreshes the routes and tries the broker they name; each
#: ChangeUnconfirmed sends the same (idempotent) request again.
_WRITER_ATTEMPTS = 3

T = TypeVar("T")


async def writer_call(
    cluster: ClusterClient,
    request: msgspec.Struct,
    expected: type[T],
    *,
    gone: Callable[[], T] | None = None,
) -> T:
    """A request to the cluster's writer of users and ACL entries (the security writer,
    ADR 15 and 20), which serialises every change and hands it to the other brokers
    through the name servers. A broker that is not the writer (any more) answers
    NotCoordinator or WriterFenced, and the request goes to the writer named anew; a
    change the name servers did not confirm (ChangeUnconfirmed, ADR 26) is sent again.
    `gone`: the answer when a retry after ChangeUnconfirmed is refused InvalidRequest
    (a deletion whose first attempt took effect finds nothing to delete)."""
    unconfirmed = False
    for attempt in range(1, _WRITER_ATTEMPTS + 1):
        writer = await cluster.security_writer()
        try:
            return await cluster.call(writer, request, expected)
        except InvalidRequest:
            if gone is None or not unconfirmed:
                raise
            return gone()
        except (NotCoordinator, ChangeUnconfirmed) as exc:
            if attempt == _WRITER_ATTEMPTS:
                raise
            unconfirmed = unconfirmed or isinstance(exc, ChangeUnconfirmed)
            await cluster.refresh_routes(force=True)
    raise AssertionError("unreachable")


async def create_acls(cluster: ClusterClient, acls: Iterable[Acl]) -> int:
    """Add the entries (on the writer, whence they reach every broker); how many were
    new."""
    request = AclCreateRequest(entries=_entries(acls))
    return (await writer_call(cluster, request, AclsChangedResponse)).changed


async def delete_acls(cluster: ClusterClient, acls: Iterable[Acl]) -> int:
    """Remove the entries (on the writer); how many were there."""
    request = AclDeleteRequest(entries=_entries(acls))
    return (await writer_call(cluster, request, AclsChangedResponse)).changed


async def list_acls(
    cluster: ClusterClient,
    *,
    principal: str | None = None,
    resource_type: str | None = None,
) -> list[Acl]:
    """The cluster's entries (the writer's), sorted, optionally only those of one
    principal or resource type."""
    request = AclListRequest(principal=principal or "", resource_type=resource_type or "")
    answer = await writer_call(cluster, request, AclListResponse)
    found = {_public(m) for m in answer.entries}
    return sorted(found, key=lambda a: (a.principal, a.resource_type, a.resource_name, str(a)))
