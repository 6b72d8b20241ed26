"""Authorization by ACL entries: who may do what to which resource, from where. Pure: no
I/O, no clock, no cache; the broker builds an `Authorizer` from its entries and config and
asks it once per action of each request (docs/design/security.md).

An entry (Kafka's model, with reliability.md section 6's rules)::

    ALLOW User:alice from 10.0.0.0/24  READ  topic orders- (prefixed)

Evaluation, in this order; the first rule that applies decides:

1. a broker principal (the cluster's own brokers) is allowed everything;
2. WRITE, CREATE, DELETE or ALTER on a `%SYS%` topic is denied to everyone else, super
   users included: those topics are the broker's alone and no entry can grant them;
3. a super user is allowed everything else;
4. an explicit DENY on any matching entry wins;
5. otherwise a matching ALLOW allows (the reason names the most specific one);
6. otherwise denied: with authorization on, what is not allowed is forbidden.

An entry matches a request when its principal is the request's or ``User:*``; its host
is ``*``, the request's address, or a network (CIDR) holding it; its resource type is the
request's; its name is ``*``, equal to the request's (LITERAL), or a prefix of it
(PREFIXED); and its operation covers the request's. ALL covers every operation. For an
ALLOW, READ, WRITE, DELETE and ALTER each imply DESCRIBE (as in Kafka: who may read a
topic may see it); a DENY covers only its own operation (and ALL every one), so denying
READ does not hide the topic.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Final

from tidemq.core import limits, names
from tidemq.core.properties import INTERNAL_PREFIX
from tidemq.core.scram import MAX_USERNAME_BYTES

__all__ = [
    "ANY_HOST",
    "ANY_PRINCIPAL",
    "BROKER_ONLY_OPERATIONS",
    "CLUSTER_NAME",
    "IMPLIES_DESCRIBE",
    "OPERATIONS",
    "PRINCIPAL_PREFIX",
    "WILDCARD",
    "AclEntry",
    "AclError",
    "Action",
    "Authorizer",
    "Decision",
    "Operation",
    "PatternType",
    "Permission",
    "Requirement",
    "ResourceType",
    "principal_for",
]

#: Principals are `User:<name>`, the name a client authenticated with (core/scram.py).
PRINCIPAL_PREFIX: Final = "User:"
#: An entry with this principal applies to every principal. So no user may be named "*".
ANY_PRINCIPAL: Final = "User:*"
#: An entry with this host applies from every address.
ANY_HOST: Final = "*"
#: A LITERAL entry with this name applies to every resource of its type.
WILDCARD: Final = "*"
#: The one cluster resource's name (Kafka calls it "kafka-cluster").
CLUSTER_NAME: Final = "cluster"

#: Characters of a PREFIXED name: those of topic and group names (core/names.py), with
#: "%" (prefixes of internal names such as `%RETRY%`) and ":" (broadcast members).
_PREFIX: Final = re.compile(rf"[A-Za-z0-9_.%:-]{{1,{limits.MAX_TOPIC_NAME_BYTES}}}")


class AclError(ValueError):
    """An entry, principal, host or request that is not valid; the message says why."""


class ResourceType(Enum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"
    #: A transactional producer group (its transactions and check-backs).
    TRANSACTIONAL_ID = "transactional_id"


class PatternType(Enum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class Operation(Enum):
    READ = "read"  # consume, commit offsets (on the group too)
    WRITE = "write"  # produce
    CREATE = "create"
    DELETE = "delete"
    ALTER = "alter"
    DESCRIBE = "describe"
    #: What brokers do to each other and the name server: register, unregister, replicate.
    CLUSTER_ACTION = "cluster_action"
    #: In an entry only: every operation.
    ALL = "all"


class Permission(Enum):
    ALLOW = "allow"
    DENY = "deny"


#: The operations that make sense on each resource type (Kafka's table); entries and
#: requests outside it are refused as mistakes. ALL is valid on every type.
OPERATIONS: Final[Mapping[ResourceType, frozenset[Operation]]] = MappingProxyType(
    {
        ResourceType.TOPIC: frozenset(
            {
                Operation.READ,
                Operation.WRITE,
                Operation.CREATE,
                Operation.DELETE,
                Operation.ALTER,
                Operation.DESCRIBE,
            }
        ),
        ResourceType.GROUP: frozenset({Operation.READ, Operation.DELETE, Operation.DESCRIBE}),
        ResourceType.CLUSTER: frozenset(
            {Operation.CREATE, Operation.ALTER, Operation.DESCRIBE, Operation.CLUSTER_ACTION}
        ),
        ResourceType.TRANSACTIONAL_ID: frozenset({Operation.WRITE, Operation.DESCRIBE}),
    }
)
#: An ALLOW of one of these also allows DESCRIBE on the same resource.
IMPLIES_DESCRIBE: Final = frozenset(
    {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}
)
#: On a `%SYS%` topic, only a broker principal may do these.
BROKER_ONLY_OPERATIONS: Final = frozenset(
    {Operation.WRITE, Operation.CREATE, Operation.DELETE, Operation.ALTER}
)

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_IPV4_MAPPED: Final = ipaddress.IPv6Network("::ffff:0:0/96")


def principal_for(username: str) -> str:
    """The principal of an authenticated user name."""
    principal = PRINCIPAL_PREFIX + username
    _check_principal(principal)
    if principal == ANY_PRINCIPAL:
        raise AclError("'*' is not a user name: User:* stands for every principal")
    return principal


@dataclass(frozen=True, kw_only=True)
class AclEntry:
    """One rule. Validated when built: a bad principal, host, name, or an operation that
    does not apply to the resource type raises AclError."""

    principal: str
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType = PatternType.LITERAL
    operation: Operation
    permission: Permission
    host: str = ANY_HOST
    _network: _Network | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        _check_principal(self.principal)
        _check_operation(self.operation, self.resource_type, in_entry=True)
        _check_resource_name(self.resource_type, self.pattern_type, self.resource_name)
        if self.host != ANY_HOST:
            object.__setattr__(self, "_network", _parse_host_pattern(self.host))

    def __str__(self) -> str:
        pattern = " (prefixed)" if self.pattern_type is PatternType.PREFIXED else ""
        return (
            f"{self.permission.name} {self.principal} from {self.host} {self.operation.name} "
            f"{self.resource_type.value} {self.resource_name}{pattern}"
        )

    def covers_host(self, address: _Address) -> bool:
        """Whether this entry applies from `address` (already normalised)."""
        return self._network is None or address in self._network


@dataclass(frozen=True)
class Decision:
    """The answer to one authorization question, with the reason for the audit log."""

    allowed: bool
    reason: str


@dataclass(frozen=True)
class Action:
    """One thing a request does: an operation on one named resource."""

    operation: Operation
    resource_type: ResourceType
    resource_name: str


@dataclass(frozen=True)
class Requirement:
    """What a request code needs, before the request names the resource: the broker's
    table maps each request code to its requirements, e.g. PRODUCE ->
    ``(Requirement(WRITE, TOPIC),)``, and the handler calls ``on(topic)``. Checked when
    built, so a wrong table fails at import, not on the first request."""

    operation: Operation
    resource_type: ResourceType

    def __post_init__(self) -> None:
        _check_operation(self.operation, self.resource_type, in_entry=False)

    def on(self, resource_name: str) -> Action:
        """This requirement on one resource (CLUSTER_NAME for the cluster)."""
        return Action(self.operation, self.resource_type, resource_name)


class Authorizer:
    """Decides requests against a fixed set of entries (rebuilt when the entries change;
    immutable, so any thread may ask). See the module docstring for the order."""

    def __init__(
        self,
        entries: Iterable[AclEntry],
        *,
        super_users: Iterable[str] = (),
        broker_principals: Iterable[str] = (),
    ) -> None:
        self._super_users = _principal_set(super_users, "super user")
        self._brokers = _principal_set(broker_principals, "broker principal")
        # Per resource type: LITERAL entries by name ("*" included) and PREFIXED entries
        # by prefix, so a request looks up its name and each of its prefixes instead of
        # scanning every entry.
        self._literal: dict[tuple[ResourceType, str], list[AclEntry]] = {}
        self._prefixed: dict[tuple[ResourceType, str], list[AclEntry]] = {}
        self._longest_prefix = 0
        for entry in entries:
            if entry.pattern_type is PatternType.LITERAL:
                self._literal.setdefault((entry.resource_type, entry.resource_name), []).append(
                    entry
                )
            else:
                self._prefixed.setdefault((entry.resource_type, entry.resource_name), []).append(
                    entry
                )
                self._longest_prefix = max(self._longest_prefix, len(entry.resource_name))

    def authorize(
        self,
        principal: str,
        host: str,
        operation: Operation,
        resource_type: ResourceType,
        resource_name: str,
    ) -> Decision:
        """May `principal`, connected from `host` (an IP address), do `operation` on the
        named resource? Raises AclError for a malformed principal or host, or an operation
        that does not apply to the resource type (the caller's mistake, not a denial)."""
        _check_principal(principal)
        if principal == ANY_PRINCIPAL:
            raise AclError("User:* stands for every principal; it never makes a request")
        _check_operation(operation, resource_type, in_entry=False)
        address = _parse_address(host)
        if principal in self._brokers:
            return Decision(True, f"{principal} is a broker principal")
        if (
            resource_type is ResourceType.TOPIC
            and resource_name.startswith(INTERNAL_PREFIX)
            and operation in BROKER_ONLY_OPERATIONS
        ):
            return Decision(
                False, f"{INTERNAL_PREFIX} topics are the broker's: {operation.name} refused"
            )
        if principal in self._super_users:
            return Decision(True, f"{principal} is a super user")
        matching = [
            entry
            for entry in self._candidates(resource_type, resource_name)
            if entry.principal in (principal, ANY_PRINCIPAL) and entry.covers_host(address)
        ]
        denials = [e for e in matching if e.permission is Permission.DENY and _denies(e, operation)]
        if denials:
            return Decision(False, f"denied by {min(denials, key=_specificity)}")
        grants = [e for e in matching if e.permission is Permission.ALLOW and _grants(e, operation)]
        if grants:
            return Decision(True, f"allowed by {min(grants, key=_specificity)}")
        return Decision(
            False,
            f"no entry allows {principal} {operation.name} on "
            f"{resource_type.value} {resource_name!r} (default deny)",
        )

    def authorize_all(self, principal: str, host: str, actions: Iterable[Action]) -> Decision:
        """Allowed only if every action is; otherwise the first refusal. No actions is
        allowed: a request code that needs nothing beyond authentication."""
        count = 0
        for action in actions:
            decision = self.authorize(
                principal, host, action.operation, action.resource_type, action.resource_name
            )
            if not decision.allowed:
                return decision
            count += 1
        return Decision(True, f"all {count} actions allowed")

    def _candidates(self, resource_type: ResourceType, name: str) -> list[AclEntry]:
        found = list(self._literal.get((resource_type, WILDCARD), ()))
        if name != WILDCARD:
            found += self._literal.get((resource_type, name), ())
        for length in range(1, min(len(name), self._longest_prefix) + 1):
            found += self._prefixed.get((resource_type, name[:length]), ())
        return found


def _grants(entry: AclEntry, operation: Operation) -> bool:
    return entry.operation in (operation, Operation.ALL) or (
        operation is Operation.DESCRIBE and entry.operation in IMPLIES_DESCRIBE
    )


def _denies(entry: AclEntry, operation: Operation) -> bool:
    return entry.operation in (operation, Operation.ALL)


def _specificity(entry: AclEntry) -> tuple[int, int, int, int, str]:
    """Sort key: the most specific entry first (exact name, then the longest prefix, then
    "*"; a named principal before User:*; the narrowest host; the operation itself)."""
    if entry.pattern_type is PatternType.PREFIXED:
        name_rank = 1 + len(entry.resource_name)
    else:
        name_rank = 0 if entry.resource_name == WILDCARD else 1_000
    host_rank = -1 if entry._network is None else entry._network.prefixlen
    return (
        -name_rank,
        int(entry.principal == ANY_PRINCIPAL),
        -host_rank,
        int(entry.operation is Operation.ALL),
        str(entry),
    )


def _check_principal(principal: str) -> None:
    if not principal.startswith(PRINCIPAL_PREFIX):
        raise AclError(f"principal {principal!r} must be {PRINCIPAL_PREFIX}<name>")
    name = principal[len(PRINCIPAL_PREFIX) :]
    if not name:
        raise AclError(f"principal {principal!r} has an empty name")
    if len(name.encode(errors="surrogatepass")) > MAX_USERNAME_BYTES:
        raise AclError(f"principal {principal!r} is longer than {MAX_USERNAME_BYTES} bytes")
    if not name.isprintable():
        raise AclError(f"principal {principal!r} contains an unprintable character")


def _principal_set(principals: Iterable[str], what: str) -> frozenset[str]:
    found = frozenset(principals)
    for principal in found:
        _check_principal(principal)
        if principal == ANY_PRINCIPAL:
            raise AclError(f"a {what} must name one principal, not {ANY_PRINCIPAL}")
    return found


def _check_operation(operation: Operation, resource_type: ResourceType, *, in_entry: bool) -> None:
    if operation is Operation.ALL:
        if in_entry:
            return
        raise AclError("ALL is for entries; a request asks for one operation")
    if operation not in OPERATIONS[resource_type]:
        valid = ", ".join(sorted(op.name for op in OPERATIONS[resource_type]))
        raise AclError(
            f"{operation.name} does not apply to a {resource_type.value} (valid: {valid})"
        )


def _check_resource_name(resource_type: ResourceType, pattern: PatternType, name: str) -> None:
    if pattern is PatternType.PREFIXED:
        if _PREFIX.fullmatch(name) is None:
            raise AclError(
                f"prefix {name!r} must be 1-{limits.MAX_TOPIC_NAME_BYTES} characters "
                "from A-Z a-z 0-9 _ . - % : (use the literal name '*' for any name)"
            )
        if resource_type is ResourceType.CLUSTER:
            raise AclError(f"the cluster is named {CLUSTER_NAME!r}; it takes no prefix")
        return
    if name == WILDCARD:
        return
    valid = {
        ResourceType.TOPIC: names.is_topic_name,
        ResourceType.GROUP: names.is_group_name,
        ResourceType.TRANSACTIONAL_ID: names.is_group_name,
        ResourceType.CLUSTER: CLUSTER_NAME.__eq__,
    }[resource_type]
    if not valid(name):
        rule = (
            f"{CLUSTER_NAME!r} or '*'"
            if resource_type is ResourceType.CLUSTER
            else f"'*' or {names.NAME_RULE}"
        )
        raise AclError(f"{resource_type.value} name {name!r} is not valid: {rule}")


def _parse_host_pattern(host: str) -> _Network:
    """An entry's host: one address (a /32 or /128 network) or a CIDR network."""
    try:
        if "/" not in host:
            return ipaddress.ip_network(_normalise(ipaddress.ip_address(host)))
        network = ipaddress.ip_network(host, strict=True)
    except ValueError as e:
        raise AclError(f"host {host!r} must be '*', an IP address or a CIDR network: {e}") from None
    if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_IPV4_MAPPED):
        # Requests from such addresses are matched as IPv4 (see _normalise), so this
        # entry could never match anything.
        raise AclError(f"host {host!r} is IPv4-mapped: write the IPv4 network instead")
    return network


def _parse_address(host: str) -> _Address:
    try:
        return _normalise(ipaddress.ip_address(host))
    except ValueError:
        raise AclError(f"request host {host!r} is not an IP address") from None


def _normalise(address: _Address) -> _Address:
    # An IPv4 client of a dual-stack listener shows up as ::ffff:a.b.c.d; its entries
    # are written with the IPv4 address.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address
