"""A change is acknowledged only once a majority of the name servers confirmed it under
the writer's term (ADR 26). Name servers' handlers called directly, three of them, on a
manual clock; the broker's side is its lease table (`WriterLeases`) and the confirmation
rule (`WriterTerms.confirms`). No sockets.

The cases are the rows of ADR 26's table that a name server decides: a confirmation from
the holder of the term, one arriving after a newer term was granted (the deposed
writer's late push), one of tables older than those held, and terms numbered apart by
two name servers."""

from __future__ import annotations

import pytest

from tidemq.cluster.name_server_sets import digest
from tidemq.cluster.nameserver import NameServer
from tidemq.cluster.service import NameServerHandlers
from tidemq.cluster.writer_lease import WriterLeases, majority
from tidemq.cluster.writer_terms import WriterTerms
from tidemq.core.errors import BrokerNotAvailable, ConfigError, InvalidRequest, WriterFenced
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import RegisterBrokerRequest, RegisterBrokerResponse
from tidemq.protocol.security_messages import (
    SecurityPushRequest,
    SecurityPushResponse,
    SecuritySnapshot,
    UserRow,
    counter_of,
    snapshot_digest,
)
from tidemq.testing.clock import ManualClock

TTL = 4_000
A, B = "broker-a", "broker-b"
ADDRESS = {A: "127.0.0.1:1", B: "127.0.0.1:2"}
CREATED = {A: 0, B: 1}  # broker-a is the older: the first writer


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def servers(clock: ManualClock) -> list[NameServerHandlers]:
    """Three name servers past their first TTL (they grant terms)."""
    made = [
        NameServerHandlers(
            NameServer(clock, broker_ttl_ms=TTL, heartbeat_interval_ms=1_000), clock=clock
        )
        for _ in range(3)
    ]
    clock.advance(TTL)
    return made


def _register(
    server: NameServerHandlers, name: str, *, term: int = 0, counter: int = 0, listed: int = 0
) -> RegisterBrokerResponse:
    request = RegisterBrokerRequest(
        broker_name=name,
        address=ADDRESS[name],
        topics=[],
        created_ms=CREATED[name],
        writer_term=term,
        security_counter=counter,
        name_servers_digest=listed,
    )
    answer = server.handle(RequestCode.REGISTER_BROKER, request)
    assert isinstance(answer, RegisterBrokerResponse)
    return answer


def _tables(counter: int, *users: str) -> SecuritySnapshot:
    rows = [
        UserRow(name=u, salt=b"s" * 16, iterations=4096, stored_key=b"k" * 32, server_key=b"v" * 32)
        for u in users
    ]
    return SecuritySnapshot(counter=counter, digest=snapshot_digest(rows, []), users=rows)


def _confirm(server: NameServerHandlers, name: str, term: int, tables: SecuritySnapshot) -> None:
    push = SecurityPushRequest(broker_name=name, snapshot=tables, writer_term=term)
    assert isinstance(server.handle(RequestCode.SECURITY_PUSH, push), SecurityPushResponse)


def test_the_confirmation_rule_is_a_table() -> None:
    terms = WriterTerms(started_ms=0, grace_ms=0)
    assert terms.writer([(0, A), (1, B)], now_ms=1) == (A, 1)
    assert terms.confirms(A, 1) == ""  # the holder of the term
    assert "not broker-b's" in terms.confirms(B, 1)  # another broker under the same number
    assert terms.writer([(1, B)], now_ms=2) == (B, 2)  # broker-a lapsed: term 2 granted
    assert "granted writer term 2" in terms.confirms(A, 1)  # the deposed writer, late
    assert terms.confirms(B, 2) == ""
    assert "not broker-b's" in terms.confirms(B, 3)  # a term never granted to it here
    assert [majority(n, 3) for n in range(4)] == [False, False, True, True]
    assert [majority(n, 4) for n in range(5)] == [False, False, False, True, True]


def test_a_confirmed_change_reaches_the_next_writer_before_it_writes(
    servers: list[NameServerHandlers], clock: ManualClock
) -> None:
    """broker-a's change is confirmed by two of three name servers and broker-a is then
    killed; broker-b is granted term 2 by all three, and a majority's grant carries the
    change: it must catch up before it may write."""
    assert all(_register(s, A).writer_term == 1 for s in servers)
    v = _tables(counter_of(1, 1), "alice")
    for server in servers[:2]:
        _confirm(server, A, 1, v)
    clock.advance(TTL + 1)  # broker-a is gone (kill -9): it lapses everywhere
    leases = WriterLeases(ADDRESS[B], 3, clock)
    newest = (0, 0)
    for i, server in enumerate(servers):
        answer = _register(server, B, counter=0)
        assert (answer.security_writer, answer.writer_term) == (ADDRESS[B], 2)
        leases.seen(
            f"ns-{i}", answer.security_writer, answer.writer_term, clock.monotonic_ms() + TTL
        )
        newest = max(newest, (answer.security_counter, answer.security_digest))
    assert leases.held_term() == 2
    assert newest == (v.counter, v.digest)  # broker-b knows it is behind: it pulls first
    # broker-a's late confirmation (its push was delayed) is refused by every name server
    # that granted term 2, the one that never held the change included.
    for server in servers:
        with pytest.raises(WriterFenced, match="granted writer term 2"):
            _confirm(server, A, 1, _tables(counter_of(1, 2), "alice", "mallory"))


def test_a_deposed_writers_push_is_refused_though_the_next_one_has_not_written(
    servers: list[NameServerHandlers], clock: ManualClock
) -> None:
    """ADR 20 compared with the tables held only: with broker-b granted term 2 but not
    yet writing, a term-1 push was taken and broker-b would write over it. Now the
    granted term refuses it."""
    server = servers[0]
    _register(server, A)
    _confirm(server, A, 1, _tables(counter_of(1, 1), "alice"))
    clock.advance(TTL + 1)
    assert _register(server, B).writer_term == 2
    with pytest.raises(WriterFenced):
        _confirm(server, A, 1, _tables(counter_of(1, 2), "alice", "mallory"))
    assert server.security.held[0] == counter_of(1, 1)


def test_a_writer_behind_or_claiming_a_newer_term_is_not_confirmed(
    servers: list[NameServerHandlers],
) -> None:
    server = servers[0]
    _register(server, A)
    _confirm(server, A, 1, _tables(counter_of(1, 2), "alice", "bob"))
    with pytest.raises(BrokerNotAvailable, match="newer"):
        _confirm(server, A, 1, _tables(counter_of(1, 1), "alice"))
    with pytest.raises(InvalidRequest, match="term 2 confirmed under term 1"):
        _confirm(server, A, 1, _tables(counter_of(2, 1)))
    # The same version again (a retry whose first attempt was confirmed): confirmed.
    _confirm(server, A, 1, _tables(counter_of(1, 2), "alice", "bob"))
    # A no-op change on tables an earlier writer made: confirmed under this term.
    _confirm(server, A, 1, _tables(counter_of(1, 2), "alice", "bob"))


def test_terms_numbered_apart_converge_and_confirm_under_one(
    servers: list[NameServerHandlers], clock: ManualClock
) -> None:
    """One name server numbered the role 1, another 3 (it had granted terms to brokers
    since gone): broker-a holds no term a majority agrees on until the one reports the
    other's number; then it is confirmed under that."""
    terms = servers[1].nameserver._terms  # another name server's history, set directly
    terms.term = 2
    leases = WriterLeases(ADDRESS[A], 2, clock)
    for i, server in enumerate(servers[:2]):
        answer = _register(server, A)
        leases.seen(
            f"ns-{i}", answer.security_writer, answer.writer_term, clock.monotonic_ms() + TTL
        )
    assert (leases.held_term(), leases.claimed_term()) == (0, 3)
    answer = _register(servers[0], A, term=leases.claimed_term())
    leases.seen("ns-0", answer.security_writer, answer.writer_term, clock.monotonic_ms() + TTL)
    assert leases.held_term() == 3
    for server in servers[:2]:
        _confirm(server, A, 3, _tables(counter_of(3, 1), "alice"))
    with pytest.raises(WriterFenced):  # the old number is not confirmed any more
        _confirm(servers[0], A, 1, _tables(counter_of(1, 5), "alice"))


def test_brokers_listing_different_name_servers_get_no_confirmation(
    servers: list[NameServerHandlers],
) -> None:
    """Majorities of two different lists need not meet: while the live brokers disagree,
    a name server confirms nothing, and says who lists what."""
    server = servers[0]
    three = digest(["127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"])
    assert three == digest(["127.0.0.1:9003", "127.0.0.1:9001", "127.0.0.1:9002"])  # any order
    one = digest(["127.0.0.1:9001"])
    _register(server, A, listed=three)
    _register(server, B, listed=one)
    with pytest.raises(
        ConfigError, match=r"broker-a \(list .*broker-b \(list .*must list the same"
    ):
        _confirm(server, A, 1, _tables(counter_of(1, 1), "alice"))
    _register(server, B, listed=three)
    _confirm(server, A, 1, _tables(counter_of(1, 1), "alice"))
