"""RouteTable: lookups and queue selection, with a key hash stable across processes."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest

from tidemq.cluster.group_coordinator import coordinator_for
from tidemq.cluster.nameserver import NameServer
from tidemq.cluster.route import RouteTable, key_hash, queue_for_key
from tidemq.core.errors import BrokerNotAvailable, TopicNotFound
from tidemq.protocol.commands import GetRoutesResponse, TopicRoute
from tidemq.testing.clock import ManualClock


def _table() -> RouteTable:
    return RouteTable(
        [
            TopicRoute(
                topic="orders",
                queues=8,
                message_type="FIFO",
                brokers={q: "h:1" if q < 4 else "h:2" for q in range(8)},
            ),
            # queue 1 of 3 has no live broker
            TopicRoute(
                topic="partial", queues=3, message_type="NORMAL", brokers={2: "h:2", 0: "h:1"}
            ),
            TopicRoute(topic="dark", queues=2, message_type="NORMAL", brokers={}),
        ],
        {"b1": "h:1", "b2": "h:2"},
        "h:1",
    )


# ------------------------------------------------------------------ key hashing


def test_key_hash_is_crc32c() -> None:
    assert key_hash(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert key_hash(b"") == 0


def test_key_to_queue_is_fixed_for_a_fixed_key() -> None:
    assert key_hash(b"order-42") == 4_064_620_166
    assert queue_for_key(b"order-42", 8) == 6
    assert queue_for_key(b"order-42", 3) == 4_064_620_166 % 3


def test_key_hash_is_the_same_in_another_process() -> None:
    # Python's hash() of bytes is salted per process; this must not be.
    code = "from tidemq.cluster.route import key_hash; print(key_hash(b'order-42'))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONHASHSEED": "12345"},
    )
    assert int(out.stdout) == key_hash(b"order-42")


def test_queue_for_key_needs_a_queue() -> None:
    with pytest.raises(ValueError, match="at least one queue"):
        queue_for_key(b"k", 0)


# ------------------------------------------------------------------ lookups


def test_broker_for_a_queue() -> None:
    table = _table()
    assert table.broker_for("orders", 0) == "h:1"
    assert table.broker_for("orders", 7) == "h:2"
    assert table.broker_for("orders", 8) is None
    assert table.broker_for("partial", 1) is None
    assert table.broker_for("nope", 0) is None


def test_queues_lists_served_queue_ids_sorted() -> None:
    table = _table()
    assert table.queues("orders") == list(range(8))
    assert table.queues("partial") == [0, 2]
    assert table.queues("dark") == []
    assert table.queues("nope") == []


def test_topic_level_facts() -> None:
    table = _table()
    assert table.topics() == ["dark", "orders", "partial"]
    assert "orders" in table
    assert "nope" not in table
    assert table.queue_count("partial") == 3
    assert table.message_type("orders") == "FIFO"
    assert table.security_writer == "h:1"
    assert dict(table.brokers) == {"b1": "h:1", "b2": "h:2"}
    with pytest.raises(TopicNotFound):
        table.queue_count("nope")


def test_brokers_mapping_is_read_only() -> None:
    with pytest.raises(TypeError):
        _table().brokers["b3"] = "h:3"  # type: ignore[index]


def test_an_empty_table() -> None:
    table = RouteTable()
    assert table.topics() == []
    assert table.security_writer == ""
    assert dict(table.brokers) == {}


def test_entries_outside_the_queue_range_are_dropped() -> None:
    table = RouteTable(
        [
            TopicRoute(
                topic="t", queues=2, message_type="NORMAL", brokers={1: "a:1", 5: "b:1", -1: "c:1"}
            )
        ]
    )
    assert table.queues("t") == [1]
    assert table.broker_for("t", 5) is None


# ------------------------------------------------------------------ queue selection


def test_keyed_selection_hashes_over_all_queues() -> None:
    table = _table()
    assert table.select_queue("orders", b"order-42", 0) == 6
    assert table.select_queue("orders", b"order-42", 999) == 6  # the counter is ignored


def test_keyed_selection_to_an_unserved_queue_fails_instead_of_moving_the_key() -> None:
    table = _table()
    key = next(k for k in (b"k%d" % i for i in range(100)) if queue_for_key(k, 3) == 1)
    with pytest.raises(BrokerNotAvailable, match="queue 1 of topic 'partial'"):
        table.select_queue("partial", key, 0)


def test_round_robin_selection_cycles_over_served_queues() -> None:
    table = _table()
    assert [table.select_queue("partial", None, i) for i in range(5)] == [0, 2, 0, 2, 0]
    assert [table.select_queue("orders", None, i) for i in range(9)] == [*range(8), 0]
    assert table.select_queue("orders", None, -1) == 7


def test_selection_errors() -> None:
    table = _table()
    with pytest.raises(TopicNotFound):
        table.select_queue("nope", None, 0)
    with pytest.raises(BrokerNotAvailable, match="no queue"):
        table.select_queue("dark", None, 0)


# ------------------------------------------------------------------ from the wire


def test_built_from_a_name_server_answer_after_a_msgpack_round_trip() -> None:
    ns = NameServer(ManualClock())
    ns.register("b1", "h:1", [("orders", 4, "NORMAL", [0, 1])])
    ns.register("b2", "h:2", [("orders", 4, "NORMAL", [2, 3])])
    response = GetRoutesResponse(
        routes=ns.routes(), brokers=ns.brokers(), coordinator=ns.security_writer()
    )
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(response), type=GetRoutesResponse)
    table = RouteTable.from_response(wire)
    assert [table.broker_for("orders", q) for q in range(4)] == ["h:1", "h:1", "h:2", "h:2"]
    assert table.security_writer == "h:1"
    assert table.select_queue("orders", b"order-42", 0) == 4_064_620_166 % 4


# ------------------------------------------------------------------ brokers marked down


def test_without_takes_a_brokers_queues_and_name_out_and_keeps_the_rest() -> None:
    table = _table()
    down = table.without({"h:2"})
    assert down.queues("orders") == [0, 1, 2, 3]
    assert down.queue_count("orders") == 8  # the topic keeps its queue count
    assert down.queues("partial") == [0]
    assert dict(down.brokers) == {"b1": "h:1"}
    assert down.security_writer == "h:1"
    key = next(k for k in (bytes([i]) for i in range(256)) if queue_for_key(k, 8) >= 4)
    with pytest.raises(BrokerNotAvailable):
        down.select_queue("orders", key, 0)  # its queue's broker is down: not moved
    assert table.queues("orders") == list(range(8))  # the original is unchanged
    assert table.without(()) is table


def test_group_coordinators_follow_the_listed_brokers_not_the_ones_marked_down() -> None:
    """A client that marks a broker down keeps sending its groups there: only the name
    server's list moves a group, so all clients agree on its coordinator."""
    table = _table()
    groups = [f"g{i}" for i in range(40)]
    chosen = {g: table.group_coordinator(g) for g in groups}
    assert set(chosen.values()) == {"h:1", "h:2"}
    assert all(chosen[g] == coordinator_for(g, {"b1": "h:1", "b2": "h:2"}) for g in groups)
    down = table.without({"h:2"})
    assert dict(down.listed_brokers) == {"b1": "h:1", "b2": "h:2"}
    assert {g: down.group_coordinator(g) for g in groups} == chosen
    # The name server drops b2: its groups go to b1, the others stay.
    table.merge(GetRoutesResponse(routes=[], brokers={"b1": "h:1"}), [])
    assert {table.group_coordinator(g) for g in groups} == {"h:1"}
    assert RouteTable().group_coordinator("g0") == ""


def test_a_topic_with_no_served_queue_is_no_route_right_now_not_unknown() -> None:
    table = _table().without({"h:1", "h:2"})
    assert "orders" in table
    with pytest.raises(BrokerNotAvailable):
        table.select_queue("orders", None, 0)
    with pytest.raises(TopicNotFound):
        table.select_queue("never-created", None, 0)
    assert BrokerNotAvailable.retriable
    assert not TopicNotFound.retriable


def test_addresses_and_unserved_queues() -> None:
    assert _table().addresses() == {"h:1", "h:2"}
    assert _table().has_unserved_queues  # "partial" and "dark"
    full = RouteTable(
        [TopicRoute(topic="t", queues=2, message_type="NORMAL", brokers={0: "a:1", 1: "b:1"})],
        {"a": "a:1", "b": "b:1"},
    )
    assert not full.has_unserved_queues
    assert full.without({"b:1"}).has_unserved_queues


def test_merge_replaces_the_asked_topics_in_place() -> None:
    table = _table()
    answer = GetRoutesResponse(
        routes=[
            TopicRoute(topic="orders", queues=2, message_type="FIFO", brokers={0: "h:3"}),
            TopicRoute(topic="new", queues=1, message_type="NORMAL", brokers={0: "h:3"}),
        ],
        brokers={"b3": "h:3"},
        coordinator="h:3",
    )
    # "partial" was asked for and not answered: it no longer exists; "dark" was not asked.
    table.merge(answer, ["orders", "new", "partial"])
    assert table.queue_count("orders") == 2
    assert table.broker_for("orders", 0) == "h:3"
    assert table.broker_for("new", 0) == "h:3"
    assert "partial" not in table
    assert "dark" in table
    assert dict(table.brokers) == {"b3": "h:3"}
    assert table.security_writer == "h:3"
    # An empty ask (the broker list alone) changes no topic.
    table.merge(GetRoutesResponse(routes=[], brokers={"b1": "h:1"}), [])
    assert "orders" in table
    assert dict(table.brokers) == {"b1": "h:1"}
