"""ACL management requests (codes 80-82, docs/design/security.md section 4): entries as
plain strings on the wire (the enum values of `tidemq.core.acl`), validated by the broker.

Appended to `commands.REQUESTS` like every other pair; fields only ever added at the end.
"""

from __future__ import annotations

from typing import Final

import msgspec

from tidemq.core.acl import AclEntry, Operation, PatternType, Permission, ResourceType
from tidemq.core.errors import InvalidRequest
from tidemq.protocol.codes import RequestCode

__all__ = [
    "ACL_REQUESTS",
    "AclCreateRequest",
    "AclDeleteRequest",
    "AclEntryMsg",
    "AclListRequest",
    "AclListResponse",
    "AclsChangedResponse",
    "acl_message",
    "entry_of",
]


class _Msg(msgspec.Struct, kw_only=True, omit_defaults=True):
    pass


class AclEntryMsg(_Msg):
    """One entry: `User:<name>` or `User:*`; topic | group | cluster | transactional_id;
    a name, `*`, or a prefix; literal | prefixed; read | write | create | delete | alter |
    describe | cluster_action | all; allow | deny; `*`, an IP address or a network."""

    principal: str
    resource_type: str
    resource_name: str
    operation: str
    permission: str
    pattern_type: str = "literal"
    host: str = "*"


def acl_message(entry: AclEntry) -> AclEntryMsg:
    """An entry as it travels (its enums as their values)."""
    return AclEntryMsg(
        principal=entry.principal,
        resource_type=entry.resource_type.value,
        resource_name=entry.resource_name,
        operation=entry.operation.value,
        permission=entry.permission.value,
        pattern_type=entry.pattern_type.value,
        host=entry.host,
    )


def entry_of(msg: AclEntryMsg) -> AclEntry:
    """The entry a message describes; InvalidRequest naming what is wrong."""
    try:
        return AclEntry(
            principal=msg.principal,
            resource_type=ResourceType(msg.resource_type.lower()),
            resource_name=msg.resource_name,
            pattern_type=PatternType(msg.pattern_type.lower()),
            operation=Operation(msg.operation.lower()),
            permission=Permission(msg.permission.lower()),
            host=msg.host,
        )
    except ValueError as exc:  # AclError is a ValueError, and so are unknown enum values
        raise InvalidRequest(f"bad ACL entry ({_describe(msg)}): {exc}") from None


def _describe(msg: AclEntryMsg) -> str:
    return (
        f"{msg.permission} {msg.principal} from {msg.host} {msg.operation} "
        f"{msg.resource_type} {msg.resource_name} ({msg.pattern_type})"
    )


class AclCreateRequest(_Msg):
    entries: list[AclEntryMsg]


class AclDeleteRequest(_Msg):
    entries: list[AclEntryMsg]


class AclsChangedResponse(_Msg):
    #: Entries added (create) or removed (delete): those already there, or not there,
    #: count for nothing.
    changed: int


class AclListRequest(_Msg):
    #: Only the entries of this principal ("" for all).
    principal: str = ""
    #: Only entries on this resource type ("" for all).
    resource_type: str = ""


class AclListResponse(_Msg):
    entries: list[AclEntryMsg]


ACL_REQUESTS: Final[dict[RequestCode, tuple[type[msgspec.Struct], type[msgspec.Struct]]]] = {
    RequestCode.ACL_CREATE: (AclCreateRequest, AclsChangedResponse),
    RequestCode.ACL_DELETE: (AclDeleteRequest, AclsChangedResponse),
    RequestCode.ACL_LIST: (AclListRequest, AclListResponse),
}
