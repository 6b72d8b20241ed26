"""ACL evaluation (core/acl.py): table-driven cases, validation, and a property test
against a reference model written here from the rules in words (TIDEMQ_SOAK=1 runs
10,000 examples, reliability.md section 6; the default run 200)."""

from __future__ import annotations

import ipaddress
import os
from typing import NamedTuple

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tidemq.core.acl import (
    AclEntry,
    AclError,
    Action,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    Requirement,
    ResourceType,
    principal_for,
)

SOAK = os.environ.get("TIDEMQ_SOAK") == "1"
EXAMPLES = 10_000 if SOAK else 200

R, W, D = Operation.READ, Operation.WRITE, Operation.DESCRIBE
TOPIC, GROUP, CLUSTER, TXN = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
ALLOW, DENY = Permission.ALLOW, Permission.DENY
PREFIXED = PatternType.PREFIXED


def entry(
    permission: Permission,
    principal: str,
    operation: Operation,
    resource_type: ResourceType,
    name: str,
    *,
    prefixed: bool = False,
    host: str = "*",
) -> AclEntry:
    return AclEntry(
        principal=principal,
        resource_type=resource_type,
        resource_name=name,
        pattern_type=PatternType.PREFIXED if prefixed else PatternType.LITERAL,
        operation=operation,
        permission=permission,
        host=host,
    )


class Case(NamedTuple):
    entries: list[AclEntry]
    principal: str
    host: str
    operation: Operation
    resource_type: ResourceType
    name: str
    allowed: bool
    reason: str  # a part of Decision.reason


ALICE_READS_ORDERS = entry(ALLOW, "User:alice", R, TOPIC, "orders")
CASES = {
    "nothing is allowed by default": Case(
        [], "User:alice", "10.0.0.1", R, TOPIC, "orders", False, "default deny"
    ),
    "a literal allow": Case(
        [ALICE_READS_ORDERS], "User:alice", "10.0.0.1", R, TOPIC, "orders", True, "allowed by"
    ),
    "a literal allow is for that name only": Case(
        [ALICE_READS_ORDERS], "User:alice", "10.0.0.1", R, TOPIC, "orders-eu", False, "default"
    ),
    "an allow is for that principal only": Case(
        [ALICE_READS_ORDERS], "User:bob", "10.0.0.1", R, TOPIC, "orders", False, "default"
    ),
    "an allow is for that operation only": Case(
        [ALICE_READS_ORDERS], "User:alice", "10.0.0.1", W, TOPIC, "orders", False, "default"
    ),
    "an allow is for that resource type only": Case(
        [entry(ALLOW, "User:alice", R, GROUP, "orders")],
        *("User:alice", "10.0.0.1", R, TOPIC, "orders", False, "default"),
    ),
    "read implies describe": Case(
        [ALICE_READS_ORDERS], "User:alice", "10.0.0.1", D, TOPIC, "orders", True, "READ"
    ),
    "describe does not imply read": Case(
        [entry(ALLOW, "User:alice", D, TOPIC, "orders")],
        *("User:alice", "10.0.0.1", R, TOPIC, "orders", False, "default"),
    ),
    "create does not imply describe": Case(
        [entry(ALLOW, "User:alice", Operation.CREATE, TOPIC, "orders")],
        *("User:alice", "10.0.0.1", D, TOPIC, "orders", False, "default"),
    ),
    "a deny of read does not deny describe": Case(
        [entry(ALLOW, "User:alice", D, TOPIC, "orders"), entry(DENY, "User:alice", R, TOPIC, "*")],
        *("User:alice", "10.0.0.1", D, TOPIC, "orders", True, "allowed"),
    ),
    "ALL allows every operation": Case(
        [entry(ALLOW, "User:alice", Operation.ALL, TOPIC, "orders")],
        *("User:alice", "10.0.0.1", Operation.DELETE, TOPIC, "orders", True, "ALL"),
    ),
    "a prefixed allow": Case(
        [entry(ALLOW, "User:alice", W, TOPIC, "ord", prefixed=True)],
        *("User:alice", "10.0.0.1", W, TOPIC, "orders", True, "(prefixed)"),
    ),
    "a prefix longer than the name does not match": Case(
        [entry(ALLOW, "User:alice", W, TOPIC, "orders-", prefixed=True)],
        *("User:alice", "10.0.0.1", W, TOPIC, "orders", False, "default"),
    ),
    "the name * is every topic": Case(
        [entry(ALLOW, "User:alice", W, TOPIC, "*")],
        *("User:alice", "10.0.0.1", W, TOPIC, "payments", True, "allowed"),
    ),
    "User:* is every principal": Case(
        [entry(ALLOW, "User:*", R, GROUP, "billing")],
        *("User:zed", "10.0.0.1", R, GROUP, "billing", True, "User:*"),
    ),
    "an explicit deny wins over a more specific allow": Case(
        [ALICE_READS_ORDERS, entry(DENY, "User:*", R, TOPIC, "*")],
        *("User:alice", "10.0.0.1", R, TOPIC, "orders", False, "denied by DENY User:*"),
    ),
    "a deny of ALL denies every operation": Case(
        [ALICE_READS_ORDERS, entry(DENY, "User:alice", Operation.ALL, TOPIC, "ord", prefixed=True)],
        *("User:alice", "10.0.0.1", R, TOPIC, "orders", False, "denied"),
    ),
    "a deny from another host does not apply": Case(
        [ALICE_READS_ORDERS, entry(DENY, "User:alice", R, TOPIC, "orders", host="10.9.9.9")],
        *("User:alice", "10.0.0.1", R, TOPIC, "orders", True, "allowed"),
    ),
    "an allow from a network": Case(
        [entry(ALLOW, "User:alice", R, TOPIC, "orders", host="10.0.0.0/24")],
        *("User:alice", "10.0.0.77", R, TOPIC, "orders", True, "10.0.0.0/24"),
    ),
    "an allow from a network is not from outside it": Case(
        [entry(ALLOW, "User:alice", R, TOPIC, "orders", host="10.0.0.0/24")],
        *("User:alice", "10.0.1.1", R, TOPIC, "orders", False, "default"),
    ),
    "an IPv4 client on a dual-stack listener matches its IPv4 entry": Case(
        [entry(ALLOW, "User:alice", R, TOPIC, "orders", host="10.0.0.1")],
        *("User:alice", "::ffff:10.0.0.1", R, TOPIC, "orders", True, "allowed"),
    ),
    "an IPv6 network": Case(
        [entry(ALLOW, "User:alice", R, TOPIC, "orders", host="2001:db8::/32")],
        *("User:alice", "2001:db8::5", R, TOPIC, "orders", True, "allowed"),
    ),
    "the reason names the most specific allow": Case(
        [
            entry(ALLOW, "User:*", R, TOPIC, "*"),
            entry(ALLOW, "User:alice", R, TOPIC, "o", prefixed=True),
            entry(ALLOW, "User:alice", R, TOPIC, "orde", prefixed=True),
        ],
        *("User:alice", "10.0.0.1", R, TOPIC, "orders", True, "topic orde (prefixed)"),
    ),
    "a super user may do anything": Case(
        [entry(DENY, "User:root", Operation.ALL, TOPIC, "*")],
        *("User:root", "10.0.0.1", Operation.DELETE, TOPIC, "orders", True, "super user"),
    ),
    "no one but a broker writes a %SYS% topic, super users included": Case(
        [], "User:root", "10.0.0.1", W, TOPIC, "%SYS%TIMER", False, "the broker's"
    ),
    "no entry grants a client write on a %SYS% topic": Case(
        [
            entry(ALLOW, "User:alice", Operation.ALL, TOPIC, "%SYS%TIMER"),
            entry(ALLOW, "User:alice", W, TOPIC, "%SYS%", prefixed=True),
        ],
        *("User:alice", "10.0.0.1", W, TOPIC, "%SYS%TIMER", False, "the broker's"),
    ),
    "nor create, delete or alter one": Case(
        [entry(ALLOW, "User:alice", Operation.ALL, TOPIC, "*")],
        *("User:alice", "10.0.0.1", Operation.ALTER, TOPIC, "%SYS%POP", False, "the broker's"),
    ),
    "a %SYS% topic may be read by an allowed client": Case(
        [entry(ALLOW, "User:alice", R, TOPIC, "%SYS%", prefixed=True)],
        *("User:alice", "10.0.0.1", R, TOPIC, "%SYS%POP", True, "allowed"),
    ),
    "a broker writes %SYS% topics": Case(
        [], "User:broker-1", "10.0.0.1", W, TOPIC, "%SYS%TIMER", True, "broker principal"
    ),
    "a broker registers": Case(
        [],
        *(
            "User:broker-1",
            "10.0.0.1",
            Operation.CLUSTER_ACTION,
            CLUSTER,
            "cluster",
            True,
            "broker",
        ),
    ),
    "a client may not register as a broker": Case(
        [entry(ALLOW, "User:alice", Operation.ALL, TOPIC, "*")],
        *("User:alice", "10.0.0.1", Operation.CLUSTER_ACTION, CLUSTER, "cluster", False, "default"),
    ),
    "a transactional id": Case(
        [entry(ALLOW, "User:alice", W, TXN, "txn-", prefixed=True)],
        *("User:alice", "10.0.0.1", D, TXN, "txn-orders", True, "allowed"),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_decisions(case: Case) -> None:
    authorizer = Authorizer(
        case.entries, super_users=["User:root"], broker_principals=["User:broker-1"]
    )
    decision = authorizer.authorize(
        case.principal, case.host, case.operation, case.resource_type, case.name
    )
    assert decision.allowed is case.allowed, decision.reason
    assert case.reason in decision.reason


BAD_ENTRIES = {
    "principal without User:": ({"principal": "alice"}, "must be User:<name>"),
    "empty principal name": ({"principal": "User:"}, "empty name"),
    "unprintable principal": ({"principal": "User:a\x00"}, "unprintable"),
    "long principal": ({"principal": "User:" + "a" * 256}, "longer than 255"),
    "host that is no address": ({"host": "example.com"}, "must be '\\*', an IP address"),
    "network with host bits": ({"host": "10.0.0.1/8"}, "has host bits set"),
    "IPv4-mapped network": ({"host": "::ffff:10.0.0.0/120"}, "write the IPv4 network"),
    "operation not for topics": (
        {"operation": Operation.CLUSTER_ACTION},
        "CLUSTER_ACTION does not apply to a topic",
    ),
    "prefixed *": ({"resource_name": "*", "pattern_type": PREFIXED}, "use the literal name '*'"),
    "prefix with a space": ({"resource_name": "or ders", "pattern_type": PREFIXED}, "prefix"),
    "bad topic name": ({"resource_name": "-rf"}, "topic name '-rf' is not valid"),
    "bad group name": (
        {"resource_type": GROUP, "operation": Operation.READ, "resource_name": "a/b"},
        "group name 'a/b' is not valid",
    ),
    "write on a group": ({"resource_type": GROUP, "operation": W}, "WRITE does not apply"),
    "another cluster name": (
        {"resource_type": CLUSTER, "operation": Operation.ALTER, "resource_name": "prod"},
        "'cluster' or '*'",
    ),
    "cluster by prefix": (
        {
            "resource_type": CLUSTER,
            "operation": Operation.ALTER,
            "resource_name": "clu",
            "pattern_type": PREFIXED,
        },
        "takes no prefix",
    ),
}


@pytest.mark.parametrize(("changes", "problem"), BAD_ENTRIES.values(), ids=BAD_ENTRIES.keys())
def test_bad_entries_are_refused_clearly(changes: dict[str, object], problem: str) -> None:
    fields: dict[str, object] = {
        "principal": "User:alice",
        "resource_type": TOPIC,
        "resource_name": "orders",
        "operation": R,
        "permission": ALLOW,
        "host": "*",
    }
    fields.update(changes)
    with pytest.raises(AclError, match=problem):
        AclEntry(**fields)  # type: ignore[arg-type]


def test_entries_print_as_one_readable_line() -> None:
    printed = str(entry(DENY, "User:bob", W, TOPIC, "ord", prefixed=True, host="10.0.0.0/8"))
    assert printed == "DENY User:bob from 10.0.0.0/8 WRITE topic ord (prefixed)"


@pytest.mark.parametrize(
    ("principal", "host", "operation", "resource_type", "problem"),
    [
        ("User:alice", "10.0.0.1", Operation.ALL, TOPIC, "a request asks for one operation"),
        ("User:alice", "10.0.0.1", Operation.CLUSTER_ACTION, GROUP, "does not apply"),
        ("User:alice", "localhost", R, TOPIC, "not an IP address"),
        ("User:alice", "10.0.0.0/24", R, TOPIC, "not an IP address"),
        ("alice", "10.0.0.1", R, TOPIC, "User:<name>"),
        ("User:*", "10.0.0.1", R, TOPIC, "never makes a request"),
    ],
)
def test_malformed_requests_are_errors_not_denials(
    principal: str, host: str, operation: Operation, resource_type: ResourceType, problem: str
) -> None:
    with pytest.raises(AclError, match=problem):
        Authorizer([]).authorize(principal, host, operation, resource_type, "orders")


def test_super_users_and_brokers_must_be_single_principals() -> None:
    with pytest.raises(AclError, match="not User:\\*"):
        Authorizer([], super_users=["User:*"])
    with pytest.raises(AclError, match="User:<name>"):
        Authorizer([], broker_principals=["broker"])


def test_principal_for_a_user_name() -> None:
    assert principal_for("alice") == "User:alice"
    with pytest.raises(AclError, match="not a user name"):
        principal_for("*")
    with pytest.raises(AclError, match="empty name"):
        principal_for("")


def test_requirements_for_the_brokers_request_table() -> None:
    produce = (Requirement(W, TOPIC), Requirement(W, TXN))
    authorizer = Authorizer(
        [entry(ALLOW, "User:alice", W, TOPIC, "orders"), entry(ALLOW, "User:alice", W, TXN, "t")]
    )
    actions = [produce[0].on("orders"), produce[1].on("t")]
    assert actions[0] == Action(W, TOPIC, "orders")
    assert authorizer.authorize_all("User:alice", "10.0.0.1", actions).allowed
    refused = authorizer.authorize_all(
        "User:alice", "10.0.0.1", [produce[0].on("orders"), produce[0].on("payments")]
    )
    assert not refused.allowed
    assert "payments" in refused.reason
    with pytest.raises(AclError, match="does not apply"):
        Requirement(Operation.CLUSTER_ACTION, TOPIC)
    with pytest.raises(AclError, match="one operation"):
        Requirement(Operation.ALL, TOPIC)


# The reference model: the rules of reliability.md section 6 and the brief, in words and
# plain data (strings, integers), sharing no code with the module.

MODEL_OPS = {
    "topic": ["read", "write", "create", "delete", "alter", "describe"],
    "group": ["read", "delete", "describe"],
    "cluster": ["create", "alter", "describe", "cluster_action"],
    "transactional_id": ["write", "describe"],
}
MODEL_NAMES = {
    "topic": ["orders", "orders-eu", "ord", "payments", "%SYS%TIMER", "%SYS%POP", "%RETRY%bill"],
    "group": ["bill", "billing", "billing-eu", "%REDRIVE%billing"],
    "cluster": ["cluster"],
    "transactional_id": ["txn-a", "txn-b", "tx"],
}
MODEL_PREFIXES = {
    "topic": ["o", "ord", "orders", "orders-", "%SYS%", "%", "pay", "%RETRY%"],
    "group": ["bill", "billing", "%REDRIVE%"],
    "cluster": [],
    "transactional_id": ["txn", "txn-", "tx"],
}
ENTRY_PRINCIPALS = ["User:alice", "User:bob", "User:*", "User:root"]
REQUEST_PRINCIPALS = ["User:alice", "User:bob", "User:carol", "User:root", "User:broker"]
ENTRY_HOSTS = [
    "*",
    "10.0.0.1",
    "10.0.0.0/24",
    "10.0.0.0/8",
    "10.0.1.0/24",
    "::1",
    "::ffff:10.0.0.1",
    "2001:db8::/32",
    "0.0.0.0/0",
]
REQUEST_HOSTS = [
    "10.0.0.1",
    "10.0.0.7",
    "10.0.1.3",
    "10.200.0.1",
    "192.168.1.1",
    "::1",
    "::ffff:10.0.0.1",
    "::ffff:10.0.1.3",
    "2001:db8::5",
    "2001:db9::1",
]


class ModelEntry(NamedTuple):
    principal: str
    resource_type: str
    name: str
    prefixed: bool
    operation: str
    allow: bool
    host: str


class Query(NamedTuple):
    principal: str
    host: str
    operation: str
    resource_type: str
    name: str


def host_bits(text: str) -> tuple[int, int, int]:
    """(IP version, address as an integer, prefix length), IPv4-mapped IPv6 as IPv4."""
    address, _, length = text.partition("/")
    parsed = ipaddress.ip_address(address)
    value, bits = int(parsed), parsed.max_prefixlen
    if bits == 128 and value >> 32 == 0xFFFF:
        value, bits = value & 0xFFFF_FFFF, 32
    return (4 if bits == 32 else 6), value, int(length) if length else bits


def model_host_matches(pattern: str, host: str) -> bool:
    if pattern == "*":
        return True
    version, network, length = host_bits(pattern)
    request_version, address, _ = host_bits(host)
    width = 32 if version == 4 else 128
    shift = width - length
    return version == request_version and network >> shift == address >> shift


def model_allows(
    entries: list[ModelEntry], supers: set[str], brokers: set[str], query: Query
) -> bool:
    if query.principal in brokers:
        return True
    if (
        query.resource_type == "topic"
        and query.name[:5] == "%SYS%"
        and query.operation in ("write", "create", "delete", "alter")
    ):
        return False
    if query.principal in supers:
        return True

    def applies(e: ModelEntry) -> bool:
        named = query.name[: len(e.name)] == e.name if e.prefixed else e.name in ("*", query.name)
        return (
            e.resource_type == query.resource_type
            and named
            and e.principal in ("User:*", query.principal)
            and model_host_matches(e.host, query.host)
        )

    relevant = [e for e in entries if applies(e)]
    if any(not e.allow and e.operation in ("all", query.operation) for e in relevant):
        return False
    describe_by = {"read", "write", "delete", "alter"} if query.operation == "describe" else set()
    return any(
        e.allow and (e.operation in ("all", query.operation) or e.operation in describe_by)
        for e in relevant
    )


@st.composite
def model_entries(draw: st.DrawFn) -> ModelEntry:
    resource_type = draw(st.sampled_from(sorted(MODEL_OPS)))
    prefixed = bool(MODEL_PREFIXES[resource_type]) and draw(st.booleans())
    pool = MODEL_PREFIXES[resource_type] if prefixed else [*MODEL_NAMES[resource_type], "*"]
    return ModelEntry(
        principal=draw(st.sampled_from(ENTRY_PRINCIPALS)),
        resource_type=resource_type,
        name=draw(st.sampled_from(pool)),
        prefixed=prefixed,
        operation=draw(st.sampled_from([*MODEL_OPS[resource_type], "all"])),
        allow=draw(st.booleans()),
        host=draw(st.sampled_from(ENTRY_HOSTS)),
    )


@st.composite
def queries(draw: st.DrawFn, near: list[ModelEntry]) -> Query:
    """A query; half of them aimed at one of the entries `near` (its type, a name it
    names, its principal, a host inside its host), so that entries decide often."""
    aimed = bool(near) and draw(st.booleans())
    target = draw(st.sampled_from(near)) if aimed else None
    if target is None:
        resource_type = draw(st.sampled_from(sorted(MODEL_OPS)))
        return Query(
            principal=draw(st.sampled_from(REQUEST_PRINCIPALS)),
            host=draw(st.sampled_from(REQUEST_HOSTS)),
            operation=draw(st.sampled_from(MODEL_OPS[resource_type])),
            resource_type=resource_type,
            name=draw(st.sampled_from(MODEL_NAMES[resource_type])),
        )
    names = [
        n
        for n in MODEL_NAMES[target.resource_type]
        if (n.startswith(target.name) if target.prefixed else target.name in ("*", n))
    ]
    hosts = [h for h in REQUEST_HOSTS if model_host_matches(target.host, h)]
    principal = target.principal
    if principal == "User:*":
        principal = draw(st.sampled_from(REQUEST_PRINCIPALS))
    return Query(
        principal=principal,
        host=draw(st.sampled_from(hosts or REQUEST_HOSTS)),
        operation=draw(st.sampled_from(MODEL_OPS[target.resource_type])),
        resource_type=target.resource_type,
        name=draw(st.sampled_from(names or MODEL_NAMES[target.resource_type])),
    )


def real_entry(e: ModelEntry) -> AclEntry:
    return AclEntry(
        principal=e.principal,
        resource_type=ResourceType(e.resource_type),
        resource_name=e.name,
        pattern_type=PatternType.PREFIXED if e.prefixed else PatternType.LITERAL,
        operation=Operation(e.operation),
        permission=Permission.ALLOW if e.allow else Permission.DENY,
        host=e.host,
    )


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    entries=st.lists(model_entries(), max_size=10),
    supers=st.sets(st.sampled_from(["User:root", "User:alice"]), max_size=1),
    brokers=st.sets(st.just("User:broker"), max_size=1),
    data=st.data(),
)
def test_authorizer_agrees_with_the_reference_model(
    entries: list[ModelEntry], supers: set[str], brokers: set[str], data: st.DataObject
) -> None:
    authorizer = Authorizer(
        [real_entry(e) for e in entries], super_users=supers, broker_principals=brokers
    )
    asked = data.draw(st.lists(queries(entries), min_size=1, max_size=12), label="queries")
    disagreements = []
    for query in asked:
        decision = authorizer.authorize(
            query.principal,
            query.host,
            Operation(query.operation),
            ResourceType(query.resource_type),
            query.name,
        )
        expected = model_allows(entries, supers, brokers, query)
        event("allowed" if expected else "denied")
        if decision.allowed != expected:
            disagreements.append((query, decision, expected))
    assert disagreements == []


def test_reference_model_reaches_every_rule() -> None:
    """The model and the strategies above are not vacuous: each rule decides some query."""
    entries = [
        ModelEntry("User:alice", "topic", "ord", True, "read", True, "10.0.0.0/24"),
        ModelEntry("User:*", "topic", "orders-eu", False, "all", False, "*"),
    ]
    ask = {
        "prefix allow": (Query("User:alice", "::ffff:10.0.0.7", "describe", "topic", "orders"), 1),
        "outside the network": (Query("User:alice", "10.0.1.3", "read", "topic", "orders"), 0),
        "deny wins": (Query("User:alice", "10.0.0.1", "read", "topic", "orders-eu"), 0),
        "super user": (Query("User:root", "10.0.0.1", "delete", "topic", "orders-eu"), 1),
        "%SYS%": (Query("User:root", "10.0.0.1", "write", "topic", "%SYS%POP"), 0),
        "broker": (Query("User:broker", "10.0.0.1", "write", "topic", "%SYS%POP"), 1),
    }
    authorizer = Authorizer(
        [real_entry(e) for e in entries],
        super_users=["User:root"],
        broker_principals=["User:broker"],
    )
    for label, (query, allowed) in ask.items():
        assert model_allows(entries, {"User:root"}, {"User:broker"}, query) is bool(allowed), label
        real = authorizer.authorize(
            query.principal,
            query.host,
            Operation(query.operation),
            ResourceType(query.resource_type),
            query.name,
        )
        assert real.allowed is bool(allowed), label
