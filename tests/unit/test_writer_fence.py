"""The security writer's term (ADR 20). At the name server: registration answers grant
it with a term (none in the name server's first TTL), tables written under an older term
than those held are refused, and a standalone name server cuts routes by the ACL entries
it holds (its handlers called directly). At the broker: the writer's lease, from a
majority of its name servers, runs out on its own clock. No sockets, a manual clock."""

from __future__ import annotations

import pytest

from tidemq.cluster.nameserver import NameServer
from tidemq.cluster.route_acls import RouteAcls
from tidemq.cluster.service import NameServerHandlers
from tidemq.cluster.writer_lease import WriterLeases
from tidemq.core.errors import (
    AuthorizationFailed,
    BrokerNotAvailable,
    NotCoordinator,
    WriterFenced,
)
from tidemq.protocol.acl_messages import AclEntryMsg
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import (
    GetRoutesRequest,
    GetRoutesResponse,
    RegisterBrokerRequest,
    RegisterBrokerResponse,
)
from tidemq.protocol.security_messages import (
    SecurityPushRequest,
    SecurityPushResponse,
    SecuritySnapshot,
    counter_of,
    snapshot_digest,
    term_of,
)
from tidemq.testing.clock import ManualClock

TTL = 4_000


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def handlers(clock: ManualClock) -> NameServerHandlers:
    return NameServerHandlers(
        NameServer(clock, broker_ttl_ms=TTL, heartbeat_interval_ms=1_000), clock=clock
    )


def _register(
    handlers: NameServerHandlers, name: str, port: int, *, created_ms: int, writer_term: int = 0
) -> RegisterBrokerResponse:
    request = RegisterBrokerRequest(
        broker_name=name,
        address=f"127.0.0.1:{port}",
        topics=[("orders", 1, "NORMAL", [])],
        created_ms=created_ms,
        writer_term=writer_term,
    )
    answer = handlers.handle(RequestCode.REGISTER_BROKER, request)
    assert isinstance(answer, RegisterBrokerResponse)
    return answer


def _acl(principal: str, operation: str, topic: str) -> AclEntryMsg:
    return AclEntryMsg(
        principal=principal,
        resource_type="topic",
        resource_name=topic,
        operation=operation,
        permission="allow",
    )


def _push(handlers: NameServerHandlers, counter: int, acls: tuple[AclEntryMsg, ...] = ()) -> bool:
    snapshot = SecuritySnapshot(counter=counter, digest=snapshot_digest([], acls), acls=list(acls))
    request = SecurityPushRequest(broker_name="broker-a", snapshot=snapshot)
    answer = handlers.handle(RequestCode.SECURITY_PUSH, request)
    assert isinstance(answer, SecurityPushResponse)
    return answer.accepted


def test_the_writer_is_granted_a_term_once_the_name_server_has_run_one_ttl(
    handlers: NameServerHandlers, clock: ManualClock
) -> None:
    first = _register(handlers, "broker-a", 1, created_ms=1)
    assert (first.security_writer, first.writer_term) == ("127.0.0.1:1", 0)
    clock.advance(TTL)
    answer = _register(handlers, "broker-a", 1, created_ms=1)
    assert (answer.security_writer, answer.writer_term) == ("127.0.0.1:1", 1)
    # broker-b, older, joins: the role stays where it is.
    answer = _register(handlers, "broker-b", 2, created_ms=0)
    assert (answer.security_writer, answer.writer_term) == ("127.0.0.1:1", 1)


def test_a_restarted_name_server_takes_the_writer_its_lease_names(
    handlers: NameServerHandlers,
) -> None:
    _register(handlers, "broker-a", 1, created_ms=0)
    answer = _register(handlers, "broker-b", 2, created_ms=1, writer_term=4)
    assert (answer.security_writer, answer.writer_term) == ("127.0.0.1:2", 4)


def test_tables_written_under_an_older_term_than_those_held_are_refused(
    handlers: NameServerHandlers,
) -> None:
    assert _push(handlers, counter_of(1, 7))
    assert _push(handlers, counter_of(2, 1))  # the next writer's first change
    with pytest.raises(WriterFenced, match=r"writer term 1.*term 2"):
        _push(handlers, counter_of(1, 8))  # the deposed writer's late change
    assert term_of(handlers.security.held[0]) == 2


def test_a_user_gets_only_the_routes_it_may_describe(handlers: NameServerHandlers) -> None:
    handlers.nameserver.register(
        "broker-a",
        "127.0.0.1:1",
        [("orders", 1, "NORMAL", []), ("payroll", 1, "NORMAL", [])],
    )
    assert _push(handlers, counter_of(1, 1), (_acl("User:bob", "write", "orders"),))
    acls = RouteAcls(handlers.security, super_users=["User:admin"])

    def ask(principal: str, topics: list[str] | None = None) -> GetRoutesResponse:
        header = GetRoutesRequest(topics=topics)
        answer = handlers.handle(RequestCode.GET_ROUTES, header)
        assert isinstance(answer, GetRoutesResponse)
        return acls.filter(header, answer, principal, "127.0.0.1")

    assert [r.topic for r in ask("User:bob").routes] == ["orders"]  # WRITE implies DESCRIBE
    assert [r.topic for r in ask("User:admin").routes] == ["orders", "payroll"]
    assert [r.topic for r in ask("Broker:broker-b").routes] == ["orders", "payroll"]
    assert ask("User:eve").routes == []
    named = ask("User:bob", ["payroll", "orders", "payroll"])
    assert ([r.topic for r in named.routes], named.denied) == (["orders"], ["payroll"])
    # The generation a user sees changes with the tables: an ACL change is not
    # "unchanged" to a client that asks with the token it had.
    before = ask("User:bob").generation
    assert _push(handlers, counter_of(1, 2), (_acl("User:bob", "read", "payroll"),))
    assert ask("User:bob").generation != before
    assert acls.token(acls.token(before, "User:bob", "h"), "User:bob", "h") == before
    # Cluster status: DESCRIBE on the cluster, as on a broker.
    acls.check_status("User:admin", "127.0.0.1")
    acls.check_status("Broker:broker-b", "127.0.0.1")
    with pytest.raises(AuthorizationFailed, match="DESCRIBE cluster"):
        acls.check_status("User:bob", "127.0.0.1")


# ------------------------------------------------------------------ the writer's lease

ME = "127.0.0.1:1"


def test_a_lease_lasts_the_ttl_from_when_the_registration_was_sent(clock: ManualClock) -> None:
    leases = WriterLeases(ME, 1, clock)
    assert isinstance(leases.refusal(), BrokerNotAvailable)  # nothing granted yet
    sent = clock.monotonic_ms()
    clock.advance(300)  # the answer took a while: the lease still counts from the send
    leases.seen("ns-1", ME, 1, sent + TTL)
    assert leases.held_term() == 1
    clock.advance(TTL - 301)
    assert leases.held_term() == 1
    clock.advance(1)  # paused past its end: fenced, on this broker's own clock
    assert leases.held_term() == 0
    refusal = leases.refusal()
    assert isinstance(refusal, WriterFenced)
    assert "(term 1) ran out" in str(refusal)


def test_a_writer_named_elsewhere_is_not_coordinator(clock: ManualClock) -> None:
    leases = WriterLeases(ME, 1, clock)
    leases.seen("ns-1", ME, 1, clock.monotonic_ms() + TTL)
    leases.seen("ns-1", "127.0.0.1:2", 2, clock.monotonic_ms() + TTL)
    assert leases.held_term() == 0
    refusal = leases.refusal()
    assert isinstance(refusal, NotCoordinator)
    assert not isinstance(refusal, WriterFenced)
    assert "127.0.0.1:2" in str(refusal)


def test_a_lease_needs_a_majority_of_the_name_servers(clock: ManualClock) -> None:
    leases = WriterLeases(ME, 3, clock)
    until = clock.monotonic_ms() + TTL
    leases.seen("ns-1", ME, 4, until)
    # One name server's grant is neither held nor reported: reported, it would take the
    # role from a writer the others still name.
    assert (leases.held_term(), leases.claimed_term()) == (0, 0)
    assert isinstance(leases.refusal(), BrokerNotAvailable)
    leases.seen("ns-2", ME, 5, until)
    # Two name servers, two numbers: no term a majority agrees on (ADR 26). The newest is
    # reported, and the name server that numbered it 4 adopts 5.
    assert (leases.held_term(), leases.claimed_term()) == (0, 5)
    leases.seen("ns-1", ME, 5, until)
    assert leases.held_term() == 5
    leases.seen("ns-3", "127.0.0.1:2", 6, until)
    assert leases.held_term() == 5
    leases.seen("ns-1", ME, 0, until)  # a name server in its first TTL grants none
    assert leases.held_term() == 0
