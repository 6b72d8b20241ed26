"""What each request needs: the table from request code to the permissions its
connection's principal must hold (`REQUEST_ACLS`), and the request kinds the
authorization serves or filters rather than refuses (docs/design/security.md section 2).

`REQUEST_ACLS` maps every `RequestCode` to rules: a `Requirement` (operation, resource
type) and a function naming the resources in the request. A request is served only if
its connection's principal is allowed every action; `()` means "authentication only".
A test walks `RequestCode`: a code without an entry here fails it, so a new request kind
cannot slip past authorization by being forgotten. `authorization.Authorization` applies it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from tidemq.core.acl import CLUSTER_NAME, Operation, Requirement, ResourceType
from tidemq.protocol.codes import RequestCode

__all__ = ["ACL_CODES", "FILTERED_CODES", "REQUEST_ACLS", "Names", "Rule", "txn_ids"]

Names = Callable[[Any], Iterable[str]]

#: The requests `Authorization` itself serves.
ACL_CODES: Final = frozenset({RequestCode.ACL_CREATE, RequestCode.ACL_DELETE, RequestCode.ACL_LIST})
#: The requests whose answers are cut to what the principal may describe.
FILTERED_CODES: Final = frozenset(
    {RequestCode.LIST_TOPICS, RequestCode.LIST_GROUPS, RequestCode.GET_ROUTES}
)


@dataclass(frozen=True, slots=True)
class Rule:
    """`requirement` on every resource `names(header)` returns."""

    requirement: Requirement
    names: Names


def _rule(operation: Operation, resource: ResourceType, names: Names) -> Rule:
    return Rule(Requirement(operation, resource), names)


def _cluster(_: Any) -> tuple[str]:
    return (CLUSTER_NAME,)


def _topic(h: Any) -> tuple[str]:
    return (h.topic,)


def _name(h: Any) -> tuple[str]:
    return (h.name,)


def _group(h: Any) -> tuple[str]:
    return (h.group,)


def _sink(h: Any) -> tuple[str, ...]:
    return (h.sink_id,) if h.sink_id else ()


_T, _G, _C, _X = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
_READ, _WRITE, _DESCRIBE = Operation.READ, Operation.WRITE, Operation.DESCRIBE
_ALTER, _CREATE, _DELETE = Operation.ALTER, Operation.CREATE, Operation.DELETE
_GROUP_READ = (_rule(_READ, _G, _group),)
_CLUSTER_DESCRIBE = (_rule(_DESCRIBE, _C, _cluster),)
_CLUSTER_ALTER = (_rule(_ALTER, _C, _cluster),)


def txn_ids(h: Any) -> list[str]:
    """END_TXN's transactions: `Authorization.check` turns them into their groups (the
    broker's `txn_groups`), on which the request needs WRITE."""
    return list(h.txn_ids)


REQUEST_ACLS: Final[Mapping[RequestCode, tuple[Rule, ...]]] = MappingProxyType(
    {
        RequestCode.PRODUCE: (_rule(_WRITE, _T, _topic),),
        RequestCode.FETCH: (_rule(_READ, _T, _topic),),
        RequestCode.LIST_OFFSETS: (_rule(_DESCRIBE, _T, _topic),),
        # Producer ids are not secret-bearing on their own; who uses them is checked
        # with PRODUCE (WRITE on the topic).
        RequestCode.INIT_PRODUCER: (),
        RequestCode.CREATE_TOPIC: (_rule(_CREATE, _T, _name),),
        RequestCode.CREATE_TOPICS: (_rule(_CREATE, _T, lambda h: [t.name for t in h.topics]),),
        RequestCode.ALTER_TOPIC: (_rule(_ALTER, _T, _name),),
        RequestCode.DELETE_TOPIC: (_rule(_DELETE, _T, _name),),
        RequestCode.LIST_TOPICS: (),  # filtered: the topics the principal may describe
        RequestCode.DESCRIBE_TOPIC: (_rule(_DESCRIBE, _T, _name),),
        RequestCode.JOIN_GROUP: (
            *_GROUP_READ,
            _rule(_READ, _T, lambda h: h.topics or ()),
        ),
        RequestCode.HEARTBEAT: _GROUP_READ,
        RequestCode.LEAVE_GROUP: _GROUP_READ,
        RequestCode.COMMIT_OFFSETS: (
            *_GROUP_READ,
            _rule(_READ, _T, lambda h: {o.topic for o in h.offsets}),
        ),
        RequestCode.FETCH_OFFSETS: (_rule(_DESCRIBE, _G, _group),),
        RequestCode.LIST_GROUPS: (),  # filtered: the groups the principal may describe
        RequestCode.DESCRIBE_GROUP: (_rule(_DESCRIBE, _G, _group),),
        RequestCode.RESET_OFFSETS: (*_GROUP_READ, _rule(_ALTER, _T, _topic)),
        # Filtered, never refused: the answer leaves out the topics the principal may not
        # describe, and names those of them it asked for by name (`denied`).
        RequestCode.GET_ROUTES: (),
        RequestCode.REGISTER_BROKER: (_rule(Operation.CLUSTER_ACTION, _C, _cluster),),
        RequestCode.UNREGISTER_BROKER: (_rule(Operation.CLUSTER_ACTION, _C, _cluster),),
        # Name-server requests of brokers (ADR 15), signed with the cluster secret; a
        # broker's own listener refuses them whoever sends them.
        RequestCode.REPLICA_FETCH: (_rule(Operation.CLUSTER_ACTION, _C, _cluster),),
        RequestCode.REPLICA_FILE: (_rule(Operation.CLUSTER_ACTION, _C, _cluster),),
        RequestCode.ELECT_LEADER: _CLUSTER_ALTER,
        RequestCode.SECURITY_PUSH: (_rule(Operation.CLUSTER_ACTION, _C, _cluster),),
        RequestCode.SECURITY_PULL: (_rule(Operation.CLUSTER_ACTION, _C, _cluster),),
        RequestCode.CLUSTER_STATUS: _CLUSTER_DESCRIBE,
        RequestCode.STATUS: _CLUSTER_DESCRIBE,
        # The id names the timer's record: the broker looks its topic up and checks WRITE
        # on it there (`check_cancel`), as for the send it undoes.
        RequestCode.CANCEL_DELAYED: (),
        RequestCode.TIMER_STATUS: _CLUSTER_DESCRIBE,
        RequestCode.BEGIN_TXN: (_rule(_WRITE, _X, _group),),
        RequestCode.END_TXN: (_rule(_WRITE, _X, txn_ids), _rule(_WRITE, _X, _sink)),
        RequestCode.SINK_MARKER: (_rule(_DESCRIBE, _X, _sink),),
        # Server to client only: refused by the dispatcher whoever sends it.
        RequestCode.CHECK_TXN: (),
        RequestCode.REGISTER_CHECKER: (_rule(_WRITE, _X, _group),),
        RequestCode.TXN_STATUS: _CLUSTER_DESCRIBE,
        RequestCode.POP_RECEIVE: (
            *_GROUP_READ,
            _rule(_READ, _T, lambda h: {s.topic for s in h.subscriptions}),
        ),
        RequestCode.POP_ACK: _GROUP_READ,
        RequestCode.POP_CHANGE_INVISIBLE: _GROUP_READ,
        RequestCode.POP_NACK: _GROUP_READ,
        RequestCode.POP_STATUS: (_rule(_DESCRIBE, _G, _group),),
        # A redrive is the group's own retry: READ on the group (the broker writes).
        RequestCode.POP_RESUME: _GROUP_READ,
        # Login happens before any of this is consulted.
        RequestCode.SASL_HANDSHAKE: (),
        RequestCode.SASL_AUTHENTICATE: (),
        # Users: the super users only, checked by the Authenticator as well.
        RequestCode.USER_UPSERT: _CLUSTER_ALTER,
        RequestCode.USER_DELETE: _CLUSTER_ALTER,
        RequestCode.USER_LIST: _CLUSTER_DESCRIBE,
        RequestCode.ACL_CREATE: _CLUSTER_ALTER,
        RequestCode.ACL_DELETE: _CLUSTER_ALTER,
        RequestCode.ACL_LIST: _CLUSTER_DESCRIBE,
        RequestCode.KV_GET: (_rule(_READ, _T, _topic),),
        RequestCode.QUERY_MESSAGES: (_rule(_READ, _T, _topic),),
        # The id names an internal topic: READ on the message's own topic, checked once
        # the broker has read it (`check_read`).
        RequestCode.ORIGIN_MESSAGE: (),
        RequestCode.COMPACT: (_rule(_ALTER, _T, _topic),),
        RequestCode.TIER_STATUS: _CLUSTER_DESCRIBE,
        # The files' names and ranges: a topic's metadata.
        RequestCode.TIER_FILES: (_rule(_DESCRIBE, _T, _topic),),
        RequestCode.TIER_OFFLOAD: (_rule(_ALTER, _T, _topic),),
        # Links of static topics: a remap moves data placement, an operator's act.
        RequestCode.STATIC_OPEN: (_rule(_CREATE, _T, _topic), _rule(_ALTER, _T, _topic)),
        RequestCode.STATIC_SEAL: (_rule(_ALTER, _T, _topic),),
        RequestCode.STATIC_TIMERS_TAKE: (_rule(_ALTER, _T, _topic),),
        RequestCode.STATIC_TIMERS_ADOPT: (_rule(_ALTER, _T, _topic),),
        RequestCode.STATIC_TIMERS_HANDED: (_rule(_ALTER, _T, _topic),),
        RequestCode.STATIC_UPDATE: (_rule(_ALTER, _T, _topic),),
    }
)
