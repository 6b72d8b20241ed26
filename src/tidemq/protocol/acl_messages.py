"""ACL management requests (codes 80-82, docs/design/security.md section 4): entries as
plain strings on the wire (the enum values of `tidemq.core.acl`), validated by the broker.

Appended to `commands.REQUESTS` like every other pair; fields only ever added at the end.
"""

from __future__ import annotations

from typing import Final

import msgspec

from tidemq.protocol.codes import RequestCode

__all__ = [
    "ACL_REQUESTS",
    "AclCreateRequest",
    "AclDeleteRequest",
    "AclEntryMsg",
    "AclListRequest",
    "AclListResponse",
    "AclsChangedResponse",
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
