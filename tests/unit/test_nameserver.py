"""NameServer: registration as heartbeat, TTL expiry, routes, queue claims, security writer."""

from __future__ import annotations

import pytest

from tidemq.cluster import nameserver
from tidemq.cluster.nameserver import (
    MAX_TOPICS_PER_BROKER,
    NameServer,
    QueueConflict,
    TopicRegistration,
    parse_address,
)
from tidemq.core.errors import ConfigError, InvalidRequest, InvalidTopicName
from tidemq.protocol.commands import BrokerStatus, TopicRoute
from tidemq.testing.clock import ManualClock

TTL = 30_000
INTERVAL = 10_000
STALE = 600_000


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ns(clock: ManualClock) -> NameServer:
    return NameServer(
        clock, broker_ttl_ms=TTL, heartbeat_interval_ms=INTERVAL, stale_topic_ms=STALE
    )


def _reg(topic: str, total: int, hosted: list[int] | None = None) -> TopicRegistration:
    return (topic, total, "NORMAL", hosted or [])


def _stale(topic: str, total: int) -> TopicRoute:
    return TopicRoute(topic=topic, queues=total, message_type="NORMAL", brokers={})


def _served(topic: str, total: int, address: str) -> TopicRoute:
    return TopicRoute(
        topic=topic,
        queues=total,
        message_type="NORMAL",
        brokers=dict.fromkeys(range(total), address),
    )


# ------------------------------------------------------------------ registration


def test_register_returns_interval_and_ttl_and_lists_the_broker(ns: NameServer) -> None:
    assert ns.register("b1", "10.0.0.1:8081", [_reg("orders", 4)]) == (INTERVAL, TTL)
    assert ns.brokers() == {"b1": "10.0.0.1:8081"}
    assert ns.routes() == [
        TopicRoute(
            topic="orders",
            queues=4,
            message_type="NORMAL",
            brokers=dict.fromkeys(range(4), "10.0.0.1:8081"),
        )
    ]


def test_reregistration_replaces_the_topic_list(ns: NameServer) -> None:
    ns.register("b1", "h:1", [_reg("a", 1), _reg("b", 1)])
    ns.register("b1", "h:1", [_reg("b", 2), _reg("c", 1)])
    assert [r.topic for r in ns.routes()] == ["b", "c"]
    assert ns.routes(["b"])[0].queues == 2


def test_restart_with_a_new_address_under_the_same_name_is_accepted(ns: NameServer) -> None:
    ns.register("b1", "old-host:8081", [_reg("orders", 2)])
    ns.register("b1", "new-host:9091", [_reg("orders", 2)])
    assert ns.brokers() == {"b1": "new-host:9091"}
    assert set(ns.routes()[0].brokers.values()) == {"new-host:9091"}


def test_unregister(ns: NameServer) -> None:
    ns.register("b1", "h:1", [_reg("orders", 2)])
    assert ns.unregister("b1") is True
    assert ns.unregister("b1") is False
    assert ns.brokers() == {}
    # The topic is not deleted: "no route right now", for a while.
    assert ns.routes() == [TopicRoute(topic="orders", queues=2, message_type="NORMAL", brokers={})]


@pytest.mark.parametrize(
    ("name", "address", "match"),
    [
        ("", "h:1", "invalid broker name"),
        ("b/1", "h:1", "invalid broker name"),
        ("b" * 128, "h:1", "invalid broker name"),
        ("b1", "h", "not host:port"),
        ("b1", ":8081", "not host:port"),
        ("b1", "h:", "no valid port"),
        ("b1", "h:0", "no valid port"),
        ("b1", "h:65536", "no valid port"),
        ("b1", "h:80a", "no valid port"),
        ("b1", "h:٣", "no valid port"),
        ("b1", "bad host:1", "invalid host"),
        ("b1", "-h:1", "invalid host"),
        ("b1", "x" * 254 + ":1", "invalid host"),
        ("b1", "[zz::1]:1", "bad IPv6"),
        ("b1", "0.0.0.0:8081", "wildcard"),
        ("b1", "[::]:8081", "wildcard"),
    ],
)
def test_register_validates_name_and_address(
    ns: NameServer, name: str, address: str, match: str
) -> None:
    with pytest.raises(InvalidRequest, match=match):
        ns.register(name, address, [])
    assert ns.status() == []


@pytest.mark.parametrize(
    "address",
    ["localhost:8081", "10.1.2.3:1", "broker_1.svc.local:65535", "[::1]:8081", "[fe80::1]:9"],
)
def test_valid_addresses(address: str) -> None:
    host, port = parse_address(address)
    assert f"{host}:{port}" == address


@pytest.mark.parametrize(
    ("topics", "error", "match"),
    [
        ([_reg("bad/name", 1)], InvalidTopicName, "invalid topic name"),
        ([_reg("t", 1), _reg("t", 1)], InvalidRequest, "twice"),
        ([_reg("t", 0)], InvalidRequest, "outside"),
        ([_reg("t", 4097)], InvalidRequest, "outside"),
        ([("t", 1, "normal", [])], InvalidRequest, "message type"),
        ([_reg("t", 4, [1, 1])], InvalidRequest, "twice"),
        ([_reg("t", 4, [4])], InvalidRequest, r"hosted queue id 4 is outside \[0, 4\)"),
        ([_reg("t", 4, [-1, 2])], InvalidRequest, "hosted queue id -1"),
    ],
)
def test_register_validates_topics_and_changes_nothing(
    ns: NameServer, topics: list[TopicRegistration], error: type[Exception], match: str
) -> None:
    ns.register("b1", "h:1", [_reg("keep", 1)])
    with pytest.raises(error, match=match):
        ns.register("b1", "h:2", topics)
    assert ns.brokers() == {"b1": "h:1"}
    assert [r.topic for r in ns.routes()] == ["keep"]


def test_register_limits_topics_per_broker(ns: NameServer, monkeypatch: pytest.MonkeyPatch) -> None:
    assert MAX_TOPICS_PER_BROKER == 1 << 20
    monkeypatch.setattr(nameserver, "MAX_TOPICS_PER_BROKER", 10)  # a million is slow here
    topics = [_reg(f"t{i}", 1) for i in range(11)]
    with pytest.raises(InvalidRequest, match="topics in one registration"):
        ns.register("b1", "h:1", topics)
    ns.register("b1", "h:1", topics[:10], epoch="e", version=1)
    with pytest.raises(InvalidRequest, match="at most 10 topics"):  # deltas count too
        ns.update("b1", "h:1", epoch="e", base_version=1, version=2, topics=[_reg("t10", 1)])
    assert ns.update(  # replacing one within the limit is fine
        "b1", "h:1", epoch="e", base_version=1, version=2, topics=[_reg("t10", 1)],
        removed=["t0"],
    )  # fmt: skip


def test_max_brokers_counts_live_brokers_and_makes_room_from_lapsed_ones(
    clock: ManualClock,
) -> None:
    ns = NameServer(clock, broker_ttl_ms=TTL, heartbeat_interval_ms=INTERVAL, max_brokers=2)
    ns.register("b1", "h:1", [])
    ns.register("b2", "h:2", [])
    with pytest.raises(InvalidRequest, match="max_brokers"):
        ns.register("b3", "h:3", [])
    ns.register("b2", "h:2", [])  # a known broker's heartbeat is never refused
    clock.advance(20_000)
    ns.register("b2", "h:2", [])
    clock.advance(TTL - 20_000 + 1)  # b1 lapsed, b2 not
    ns.register("b3", "h:3", [])
    assert ns.brokers() == {"b2": "h:2", "b3": "h:3"}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"heartbeat_interval_ms": 0},
        {"heartbeat_interval_ms": 30_000, "broker_ttl_ms": 30_000},
        {"max_brokers": 0},
    ],
)
def test_constructor_rejects_bad_config(clock: ManualClock, kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        NameServer(clock, **kwargs)


# ------------------------------------------------------------------ TTL


def test_broker_silent_longer_than_the_ttl_is_expired(ns: NameServer, clock: ManualClock) -> None:
    ns.register("b1", "h:1", [_reg("orders", 1)])
    clock.advance(TTL)
    assert ns.brokers() == {"b1": "h:1"}  # exactly at the TTL: still live
    assert ns.expire() == []
    clock.advance(1)
    assert ns.expire() == ["b1"]
    assert ns.brokers() == {}
    assert ns.routes() == [_stale("orders", 1)]
    assert ns.status() == []


def test_heartbeats_keep_a_broker_alive(ns: NameServer, clock: ManualClock) -> None:
    for _ in range(10):
        ns.register("b1", "h:1", [_reg("orders", 1)])
        clock.advance(10_000)
        assert ns.expire() == []
    assert ns.security_writer() == "h:1"


def test_a_lapsed_broker_disappears_from_routes_before_expire_runs(
    ns: NameServer, clock: ManualClock
) -> None:
    ns.register("b1", "h:1", [_reg("orders", 1)])
    ns.register("b2", "h:2", [_reg("payments", 1)])
    clock.advance(TTL // 2)
    ns.register("b2", "h:2", [_reg("payments", 1)])
    clock.advance(TTL // 2 + 1)
    assert ns.brokers() == {"b2": "h:2"}
    assert ns.routes() == [_stale("orders", 1), _served("payments", 1, "h:2")]
    assert ns.security_writer() == "h:2"
    # status still shows it, with its silence, until expire() forgets it
    assert ns.status() == [
        BrokerStatus(name="b1", address="h:1", last_heartbeat_ms_ago=TTL + 1, topics=1),
        BrokerStatus(name="b2", address="h:2", last_heartbeat_ms_ago=TTL // 2 + 1, topics=1),
    ]
    assert ns.expire() == ["b1"]


def test_expire_returns_names_sorted(ns: NameServer, clock: ManualClock) -> None:
    for name in ("b3", "b1", "b2"):
        ns.register(name, "h:1", [])
    clock.advance(TTL + 1)
    assert ns.expire() == ["b1", "b2", "b3"]


# ------------------------------------------------------------------ routes


def test_a_topic_spread_over_brokers_routes_each_queue_to_its_host(ns: NameServer) -> None:
    ns.register("b1", "h:1", [_reg("orders", 4, [0, 2])])
    ns.register("b2", "h:2", [_reg("orders", 4, [3, 1])])
    assert ns.routes(["orders"]) == [
        TopicRoute(
            topic="orders",
            queues=4,
            message_type="NORMAL",
            brokers={0: "h:1", 1: "h:2", 2: "h:1", 3: "h:2"},
        )
    ]


def test_a_partly_served_topic_lists_only_its_served_queues(
    ns: NameServer, clock: ManualClock
) -> None:
    ns.register("b1", "h:1", [_reg("orders", 4, [0, 1])])
    ns.register("b2", "h:2", [_reg("orders", 4, [2, 3])])
    clock.advance(TTL // 2)
    ns.register("b2", "h:2", [_reg("orders", 4, [2, 3])])
    clock.advance(TTL // 2 + 1)
    (route,) = ns.routes()
    assert route.queues == 4
    assert route.brokers == {2: "h:2", 3: "h:2"}


def test_routes_filter_by_topic_and_skip_unknown_ones(ns: NameServer) -> None:
    ns.register("b1", "h:1", [_reg("a", 1), _reg("b", 1), _reg("c", 1)])
    assert [r.topic for r in ns.routes(["c", "a", "nope", "a"])] == ["a", "c"]
    assert ns.routes([]) == []
    assert [r.topic for r in ns.routes(None)] == ["a", "b", "c"]


def test_route_queue_count_is_the_largest_any_live_broker_reports(ns: NameServer) -> None:
    # An alter from 2 to 4 queues reaches b2 first.
    ns.register("b1", "h:1", [_reg("orders", 2, [0])])
    ns.register("b2", "h:2", [_reg("orders", 4, [1, 2, 3])])
    (route,) = ns.routes()
    assert route.queues == 4
    assert route.brokers == {0: "h:1", 1: "h:2", 2: "h:2", 3: "h:2"}


def test_route_message_type_comes_from_the_smallest_named_broker(ns: NameServer) -> None:
    ns.register("b2", "h:2", [("orders", 2, "FIFO", [1])])
    ns.register("b1", "h:1", [("orders", 2, "NORMAL", [0])])
    assert ns.routes()[0].message_type == "NORMAL"


# ------------------------------------------------------------------ queue claims


def test_a_broker_cannot_take_a_queue_another_live_broker_serves(ns: NameServer) -> None:
    ns.register("b1", "h:1", [_reg("orders", 2)])
    ns.register("b0", "h:9", [_reg("orders", 2, [1])])  # a newer claim on queue 1
    ns.register("b1", "h:1", [_reg("orders", 2)])  # b1's heartbeat keeps its claims' age
    assert ns.routes()[0].brokers == {0: "h:1", 1: "h:1"}
    assert ns.conflicts() == [QueueConflict("orders", 1, "b1", ["b0"])]


def test_a_contested_queue_moves_when_its_holder_drops_it(ns: NameServer) -> None:
    ns.register("b1", "h:1", [_reg("orders", 2)])
    ns.register("b2", "h:2", [_reg("orders", 2, [1])])
    ns.register("b1", "h:1", [_reg("orders", 2, [0])])  # b1 hands queue 1 over
    assert ns.routes()[0].brokers == {0: "h:1", 1: "h:2"}
    ns.register("b1", "h:1", [_reg("orders", 2)])  # and cannot take it back
    assert ns.routes()[0].brokers == {0: "h:1", 1: "h:2"}
    assert ns.conflicts() == [QueueConflict("orders", 1, "b2", ["b1"])]


def test_a_contested_queue_moves_when_its_holder_lapses_and_stays_moved(
    ns: NameServer, clock: ManualClock
) -> None:
    ns.register("b1", "h:1", [_reg("orders", 1)])
    ns.register("b2", "h:2", [_reg("orders", 1)])
    assert ns.routes()[0].brokers == {0: "h:1"}
    clock.advance(TTL // 2)
    ns.register("b2", "h:2", [_reg("orders", 1)])
    clock.advance(TTL // 2 + 1)
    assert ns.routes()[0].brokers == {0: "h:2"}  # b1 lapsed, expire() not yet run
    ns.register("b1", "h:1", [_reg("orders", 1)])  # back, but as a new claimant
    assert ns.routes()[0].brokers == {0: "h:2"}
    assert ns.conflicts() == [QueueConflict("orders", 0, "b2", ["b1"])]


def test_a_contested_queue_moves_when_its_holder_unregisters(ns: NameServer) -> None:
    ns.register("b1", "h:1", [_reg("orders", 1)])
    ns.register("b2", "h:2", [_reg("orders", 1)])
    ns.register("b3", "h:3", [_reg("orders", 1)])
    ns.unregister("b1")
    assert ns.routes()[0].brokers == {0: "h:2"}
    assert ns.conflicts() == [QueueConflict("orders", 0, "b2", ["b3"])]


def test_no_conflicts_when_brokers_host_disjoint_queues(ns: NameServer) -> None:
    ns.register("b1", "h:1", [_reg("orders", 2, [0])])
    ns.register("b2", "h:2", [_reg("orders", 2, [1])])
    assert ns.conflicts() == []


# ------------------------------------------------------------------ security writer and status


def test_a_new_name_server_names_the_oldest_live_broker_without_a_term(
    ns: NameServer, clock: ManualClock
) -> None:
    """In its first TTL a name server cannot know whether a lease its previous run
    granted is still live: it names a candidate (the oldest live broker) but no term."""
    assert ns.security_writer_term() == ("", 0)
    ns.register("broker-b", "h:2", [], created_ms=1_000)
    assert ns.security_writer_term() == ("h:2", 0)
    # A broker added later does not take over, whatever its name.
    ns.register("broker-a", "h:1", [], created_ms=2_000)
    assert ns.security_writer() == "h:2"
    # Same creation time: the name decides.
    ns.register("broker-0", "h:3", [], created_ms=1_000)
    assert ns.security_writer_term() == ("h:3", 0)
    ns.unregister("broker-0")
    clock.advance(TTL)
    ns.register("broker-a", "h:1", [], created_ms=2_000)
    ns.register("broker-b", "h:2", [], created_ms=1_000)
    assert ns.security_writer_term() == ("h:2", 1)


def test_the_writer_keeps_its_term_while_live_and_the_next_oldest_takes_the_next(
    ns: NameServer, clock: ManualClock
) -> None:
    clock.advance(TTL)  # past the first TTL: terms are granted
    ns.register("broker-b", "h:2", [], created_ms=1_000)
    ns.register("broker-a", "h:1", [], created_ms=2_000)
    assert ns.security_writer_term() == ("h:2", 1)
    # The writer lapses (paused): the next oldest takes the next term ...
    clock.advance(TTL // 2)
    ns.register("broker-a", "h:1", [], created_ms=2_000)
    clock.advance(TTL // 2 + 1)
    assert ns.security_writer_term() == ("h:1", 2)
    # ... and keeps it when the older one comes back.
    ns.register("broker-b", "h:2", [], created_ms=1_000)
    assert ns.security_writer_term() == ("h:1", 2)
    ns.unregister("broker-a")
    assert ns.security_writer_term() == ("h:2", 3)
    ns.unregister("broker-b")
    assert ns.security_writer_term() == ("", 0)


def test_a_writer_back_from_another_address_takes_a_new_term(
    ns: NameServer, clock: ManualClock
) -> None:
    """A replica group's new leader registers the group's name from its own address: the
    previous leader's lease may still run, so the role moves to the next term."""
    clock.advance(TTL)
    ns.register("group-1", "h:1", [], created_ms=1_000)
    assert ns.security_writer_term() == ("h:1", 1)
    ns.register("group-1", "h:1", [], created_ms=1_000)
    assert ns.security_writer_term() == ("h:1", 1)
    ns.register("group-1", "h:9", [], created_ms=1_000)
    assert ns.security_writer_term() == ("h:9", 2)


def test_a_new_name_server_learns_the_writer_and_its_term_from_the_brokers(
    ns: NameServer, clock: ManualClock
) -> None:
    """A restarted name server: the holder reports its lease, and is the writer at once;
    tables written under a term it never granted keep its numbers from going back."""
    ns.register("broker-b", "h:2", [], created_ms=1_000)
    ns.register("broker-a", "h:1", [], created_ms=2_000)
    ns.report_writer("broker-a", 7, (7 << 32) | 3)
    assert ns.security_writer_term() == ("h:1", 7)
    # A deposed writer that has not noticed reports an older term: ignored.
    ns.report_writer("broker-b", 5, (5 << 32) | 9)
    assert ns.security_writer_term() == ("h:1", 7)
    # Tables of a newer term (another name server's writer): the holder here is stale.
    ns.report_writer("broker-b", 0, (9 << 32) | 1)
    clock.advance(TTL)
    ns.register("broker-b", "h:2", [], created_ms=1_000)
    ns.register("broker-a", "h:1", [], created_ms=2_000)
    assert ns.security_writer_term() == ("h:2", 10)


def test_brokers_without_a_creation_time_order_by_name(ns: NameServer) -> None:
    ns.register("broker-b", "h:2", [])
    ns.register("broker-a", "h:1", [])
    assert ns.security_writer() == "h:1"


def test_status_lists_brokers_by_name_with_their_topic_counts(
    ns: NameServer, clock: ManualClock
) -> None:
    ns.register("b2", "h:2", [_reg("a", 1), _reg("b", 2)])
    clock.advance(1_500.7)
    ns.register("b1", "h:1", [])
    assert ns.status() == [
        BrokerStatus(name="b1", address="h:1", last_heartbeat_ms_ago=0, topics=0),
        BrokerStatus(name="b2", address="h:2", last_heartbeat_ms_ago=1_500, topics=2),
    ]


# ------------------------------------------------------------------ stale topics and pauses


def test_defaults_drop_a_dead_broker_within_five_seconds(clock: ManualClock) -> None:
    ns = NameServer(clock)
    interval, ttl = ns.register("b1", "h:1", [_reg("orders", 1)])
    assert ttl <= 5_000
    assert ttl >= 3 * interval  # three beats may be missed
    clock.advance(ttl + 1)
    assert ns.brokers() == {}


def test_a_lapsed_brokers_topic_stays_known_without_a_route_for_a_bounded_time(
    ns: NameServer, clock: ManualClock
) -> None:
    ns.register("b1", "h:1", [_reg("orders", 4)])
    clock.advance(TTL + 1)
    # Lapsed, not yet expired: already "no route right now", never "unknown".
    assert ns.routes(["orders"]) == [_stale("orders", 4)]
    assert ns.expire() == ["b1"]
    assert ns.routes(["orders"]) == [_stale("orders", 4)]
    clock.advance(STALE - 1)
    ns.expire()
    assert ns.routes() == [_stale("orders", 4)]
    clock.advance(1)
    ns.expire()
    assert ns.routes() == []
    assert ns.routes(["orders"]) == []


def test_a_returning_broker_serves_its_stale_topic_again(
    ns: NameServer, clock: ManualClock
) -> None:
    ns.register("b1", "h:1", [_reg("orders", 2)])
    clock.advance(TTL + 1)
    ns.expire()
    ns.register("b1", "h:9", [_reg("orders", 2)])
    assert ns.routes() == [_served("orders", 2, "h:9")]
    ns.register("b1", "h:9", [])  # then deleted: the stale entry went when it returned
    assert ns.routes() == []


def test_a_topic_dropped_from_a_registration_is_unknown_at_once(ns: NameServer) -> None:
    ns.register("b1", "h:1", [_reg("orders", 1), _reg("gone", 1)])
    ns.register("b1", "h:1", [_reg("orders", 1)])  # "gone" was deleted
    assert [r.topic for r in ns.routes()] == ["orders"]
    assert ns.routes(["gone"]) == []


def test_a_partly_lapsed_topic_lists_the_live_brokers_queues(
    ns: NameServer, clock: ManualClock
) -> None:
    ns.register("b1", "h:1", [_reg("orders", 2, [0])])
    ns.register("b2", "h:2", [_reg("orders", 2, [1])])
    clock.advance(TTL // 2)
    ns.register("b2", "h:2", [_reg("orders", 2, [1])])
    clock.advance(TTL // 2 + 1)
    ns.expire()
    assert ns.routes() == [
        TopicRoute(topic="orders", queues=2, message_type="NORMAL", brokers={1: "h:2"})
    ]


def test_stale_topics_can_be_turned_off(clock: ManualClock) -> None:
    ns = NameServer(clock, stale_topic_ms=0)
    ns.register("b1", "h:1", [_reg("orders", 1)])
    ns.unregister("b1")
    assert ns.routes() == []


def test_extend_leases_does_not_count_the_name_servers_own_pause(
    ns: NameServer, clock: ManualClock
) -> None:
    ns.register("b1", "h:1", [_reg("orders", 1)])
    clock.advance(45_000)  # the name server was stopped for 45 s
    ns.extend_leases(45_000)
    assert ns.expire() == []
    assert ns.brokers() == {"b1": "h:1"}
    assert ns.status()[0].last_heartbeat_ms_ago == 0
    clock.advance(TTL + 1)  # and silent for a TTL after the pause: gone
    assert ns.expire() == ["b1"]


# ------------------------------------------------------------------ generation


def _answer(ns: NameServer) -> tuple[list[TopicRoute], dict[str, str], str]:
    return ns.routes(), ns.brokers(), ns.security_writer()


def test_generation_changes_exactly_when_the_answer_may(ns: NameServer, clock: ManualClock) -> None:
    """Equal generations, equal answers: each change of what `routes()`, `brokers()` or
    `security_writer()` answer gives a new generation; heartbeats that change nothing keep it."""
    seen: dict[int, tuple[list[TopicRoute], dict[str, str], str]] = {}

    def step() -> int:
        g = ns.generation()
        assert g > 0
        assert seen.setdefault(g, _answer(ns)) == _answer(ns)  # same token: same answer
        return g

    g0 = step()
    ns.register("b1", "h:1", [_reg("t", 2)], epoch="e", version=1)
    g1 = step()
    assert g1 != g0
    ns.register("b1", "h:1", [_reg("t", 2)], epoch="e", version=1)  # a full beat, same
    assert ns.update("b1", "h:1", epoch="e", base_version=1, version=1)  # an empty delta
    assert step() == g1
    assert ns.update("b1", "h:1", epoch="e", base_version=1, version=2, topics=[_reg("u", 1)])
    g2 = step()
    assert g2 != g1
    assert ns.update("b1", "h:1", epoch="e", base_version=2, version=3, removed=["u"])
    g3 = step()
    assert g3 not in (g1, g2)  # the same topics as at g1, but counted as a change
    ns.register("b2", "h:2", [_reg("v", 1)])
    g4 = step()
    clock.advance(TTL - 1)
    ns.register("b2", "h:2", [_reg("v", 1)])
    assert step() == g4
    clock.advance(2)  # b1 lapses: its topic is stale ("no route right now")
    g5 = step()
    assert g5 != g4
    assert ns.routes(["t"]) == [_stale("t", 2)]
    ns.expire()
    g6 = step()
    for _ in range(STALE // INTERVAL):  # b2 beats the whole time; b1's topic is forgotten
        clock.advance(INTERVAL)
        ns.register("b2", "h:2", [_reg("v", 1)])
        assert step() == g6 or ns.routes(["t"]) == []
    g7 = step()
    assert ns.routes(["t"]) == []
    assert g7 != g6
    ns.register("b2", "h:9", [_reg("v", 1)])  # a new address
    assert step() != g7


def test_generations_of_two_runs_differ(clock: ManualClock) -> None:
    """A restarted name server never repeats the previous run's tokens."""
    a, b = NameServer(clock), NameServer(clock)
    for ns in (a, b):
        ns.register("b1", "h:1", [_reg("t", 1)])
    assert _answer(a) == _answer(b)
    assert a.generation() != b.generation()


def test_a_replica_groups_name_stays_with_its_newest_leader(ns: NameServer) -> None:
    """A deposed leader that has not noticed yet (it was paused) beats under its old
    epoch: refused, so the group's routes keep pointing at the new leader."""
    ns.register("g1", "127.0.0.1:1001", [_reg("t", 2, [0, 1])], leader_epoch=1)
    ns.register("g1", "127.0.0.1:1002", [_reg("t", 2, [0, 1])], epoch="e", leader_epoch=2)
    with pytest.raises(InvalidRequest, match=r"replica epoch 1 refused.*epoch 2"):
        ns.register("g1", "127.0.0.1:1001", [_reg("t", 2, [0, 1])], leader_epoch=1)
    with pytest.raises(InvalidRequest, match="replica epoch 1 refused"):
        ns.update("g1", "127.0.0.1:1002", epoch="e", base_version=0, version=1, leader_epoch=1)
    assert ns.brokers() == {"g1": "127.0.0.1:1002"}
    ns.register("g1", "127.0.0.1:1003", [_reg("t", 2, [0, 1])], leader_epoch=3)
    assert ns.brokers() == {"g1": "127.0.0.1:1003"}


def test_an_old_leaders_unregister_leaves_the_new_leaders_routes(ns: NameServer) -> None:
    """After a handover the old leader stops and unregisters the group's name; reaching
    the name server after the new leader registered, it took the group's routes away
    until the new leader's next heartbeat (clients got BrokerNotAvailable meanwhile)."""
    ns.register("g1", "127.0.0.1:1001", [_reg("t", 2, [0, 1])], leader_epoch=1)
    ns.register("g1", "127.0.0.1:1002", [_reg("t", 2, [0, 1])], leader_epoch=2)
    assert not ns.unregister("g1", leader_epoch=1)
    assert ns.brokers() == {"g1": "127.0.0.1:1002"}
    assert ns.unregister("g1", leader_epoch=2)  # the leader itself stopping
    assert ns.brokers() == {}
