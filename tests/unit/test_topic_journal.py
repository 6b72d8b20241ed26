"""Incremental registration (cluster/topic_journal.py and NameServer.update): a broker's
deltas bring a name server to exactly the state a full registration would, and anything
the journal cannot express falls back to a full one."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.cluster.nameserver import NameServer, TopicRegistration
from tidemq.cluster.topic_journal import STATIC, StaticMark, TopicJournal
from tidemq.testing.clock import ManualClock

TTL = 30_000
INTERVAL = 10_000


def _ns(clock: ManualClock | None = None) -> NameServer:
    return NameServer(clock or ManualClock(), broker_ttl_ms=TTL, heartbeat_interval_ms=INTERVAL)


class _Broker:
    """A broker's topic table and journal, registering with one name server the way
    Broker._register_local does."""

    def __init__(self, ns: NameServer, name: str = "b1", max_changes: int = 1000) -> None:
        self.ns = ns
        self.name = name
        self.address = f"h:{len(name)}"
        self.topics: dict[str, TopicRegistration] = {}
        self.static: set[str] = set()
        self.journal = TopicJournal(max_changes=max_changes)
        self.acked: int | None = None
        self.full = 0  # full registrations sent

    def lookup(self, topic: str) -> TopicRegistration | StaticMark | None:
        if topic in self.static:
            return STATIC
        return self.topics.get(topic)

    def change(self, topic: str, reg: TopicRegistration | None) -> None:
        if reg is None:
            self.topics.pop(topic, None)
        else:
            self.topics[topic] = reg
        self.journal.touch(topic)

    def beat(self) -> None:
        delta = self.journal.delta(self.acked, self.lookup)
        if delta is not None and self.ns.update(
            self.name,
            self.address,
            epoch=self.journal.epoch,
            base_version=delta.base_version,
            version=delta.version,
            topics=delta.upserts,
            removed=delta.removed,
        ):
            self.acked = delta.version
            return
        self.full += 1
        self.ns.register(
            self.name,
            self.address,
            [t for n, t in self.topics.items() if n not in self.static],
            epoch=self.journal.epoch,
            version=self.journal.version,
        )
        self.acked = self.journal.version


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_deltas_reach_the_state_of_a_full_registration(seed: int) -> None:
    rng = random.Random(seed)
    ns = _ns()
    brokers = [_Broker(ns, "b1"), _Broker(ns, "b22")]
    for _ in range(rng.randrange(1, 60)):
        i = rng.randrange(2)
        b = brokers[i]
        topic = f"t{i}-{rng.randrange(8)}"  # each broker its own topics: no contested queue
        if rng.random() < 0.25:
            b.change(topic, None)
        else:
            total = rng.randrange(1, 5)
            hosted = sorted(rng.sample(range(total), rng.randrange(1, total + 1)))
            b.change(topic, (topic, total, "NORMAL", hosted if rng.random() < 0.5 else []))
        if rng.random() < 0.6:
            b.beat()
    for b in brokers:
        b.beat()
    expected = _ns()
    for b in brokers:
        expected.register(b.name, b.address, list(b.topics.values()))
    assert ns.routes() == expected.routes()
    assert ns.conflicts() == expected.conflicts() == []
    assert [s.topics for s in ns.status()] == [s.topics for s in expected.status()]


def test_a_beat_with_no_change_is_an_empty_delta() -> None:
    ns = _ns()
    b = _Broker(ns)
    b.change("orders", ("orders", 2, "NORMAL", []))
    b.beat()
    assert b.full == 1
    delta = b.journal.delta(b.acked, b.lookup)
    assert delta is not None
    assert (delta.upserts, delta.removed) == ([], [])
    b.beat()
    b.change("orders", None)
    b.change("payments", ("payments", 1, "NORMAL", []))
    b.beat()
    assert b.full == 1
    assert [r.topic for r in ns.routes()] == ["payments"]


def test_a_name_server_that_lost_the_broker_refuses_the_delta(ns_clock: ManualClock) -> None:
    ns = _ns(ns_clock)
    b = _Broker(ns)
    b.change("orders", ("orders", 1, "NORMAL", []))
    b.beat()
    # The name server restarts: it holds nothing, the delta is refused, a full one sent.
    b.ns = _ns(ns_clock)
    b.change("payments", ("payments", 1, "NORMAL", []))
    b.beat()
    assert b.full == 2
    assert [r.topic for r in b.ns.routes()] == ["orders", "payments"]
    # The broker lapses there: a lapsed broker's delta is refused too.
    ns_clock.advance(TTL + 1)
    b.change("orders", None)
    b.beat()
    assert b.full == 3
    # (orders stays known as stale, with no route: a lapsed broker's topics do.)
    assert [r.topic for r in b.ns.routes() if r.brokers] == ["payments"]


def test_a_delta_on_another_epoch_or_base_is_refused() -> None:
    ns = _ns()
    ns.register("b1", "h:1", [("orders", 1, "NORMAL", [])], epoch="e1", version=5)
    assert not ns.update("b1", "h:1", epoch="e2", base_version=5, version=6)  # restarted
    assert not ns.update("b1", "h:1", epoch="e1", base_version=4, version=6)  # missed one
    assert not ns.update("b1", "h:9", epoch="e1", base_version=5, version=6)  # moved
    assert not ns.update("b1", "h:1", epoch="", base_version=5, version=6)
    assert not ns.update("b2", "h:1", epoch="e1", base_version=5, version=6)  # unknown
    assert ns.update("b1", "h:1", epoch="e1", base_version=5, version=6, removed=["orders"])
    assert ns.routes() == []


def test_static_topics_and_forgotten_changes_need_a_full_registration() -> None:
    ns = _ns()
    b = _Broker(ns, max_changes=3)
    b.beat()
    b.static.add("chained")
    b.change("chained", ("chained", 2, "NORMAL", []))
    assert b.journal.delta(b.acked, b.lookup) is None
    b.beat()
    for i in range(4):  # one more than remembered: the oldest is forgotten
        b.change(f"t{i}", (f"t{i}", 1, "NORMAL", []))
    assert b.journal.delta(b.acked, b.lookup) is None
    recent = b.journal.version - 3
    delta = b.journal.delta(recent, b.lookup)
    assert delta is not None
    assert [t[0] for t in delta.upserts] == ["t3", "t2", "t1"]
    b.journal.touch(None)  # a change it cannot name
    assert b.journal.delta(b.journal.version - 1, b.lookup) is None
    assert b.journal.delta(b.journal.version, b.lookup) is not None


@pytest.fixture
def ns_clock() -> ManualClock:
    return ManualClock()
