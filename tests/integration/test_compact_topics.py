"""Compact topics on a real broker: produce, compact on demand, then every reader (the
stream consumer's messages and batches, group consumers) steps over the holes; key
lookups and the TableView agree with a dict model; keyless messages are refused at the
send; compaction while producers and a consumer run loses nothing."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING

import pytest

import tidemq
import tidemq.aio
from tidemq.core.errors import ConfigError, InvalidBatch

if TYPE_CHECKING:
    from tests.integration.conftest import ThreadedBroker

pytestmark = pytest.mark.timeout(90)

COMPACT = {"cleanup.policy": "compact"}


def _read_all(address: str, topic: str, queues: int) -> list[tidemq.Message]:
    """Every message of the topic, read from the start until each queue's end."""
    out: list[tidemq.Message] = []
    with tidemq.Admin(address) as admin:
        ends = {q.queue: q.max_offset for q in admin.describe_topic(topic).queue_info}
    with tidemq.StreamConsumer(address, start="earliest") as consumer:
        consumer.assign([(topic, q) for q in range(queues)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all((consumer.position(topic, q) or 0) >= ends[q] for q in range(queues)):
                break
            out += consumer.poll(timeout_ms=200)
    return sorted(out, key=lambda m: (m.queue, m.offset))


def test_a_consumer_from_the_start_sees_the_latest_value_of_every_key(
    sync_broker: ThreadedBroker,
) -> None:
    address = sync_broker.address
    model: dict[bytes, bytes | None] = {}
    with tidemq.Admin(address) as admin, tidemq.Producer(address) as producer:
        admin.create_topic("prices", 2, config=COMPACT)
        for round_ in range(5):
            for i in range(50):
                key = f"stock-{i}".encode()
                value = None if (round_ == 4 and i % 10 == 0) else f"{round_}:{i}".encode()
                producer.send("prices", value, key=key)
                model[key] = value
        producer.flush()
        before = _read_all(address, "prices", 2)
        assert len(before) == 250
        reports = admin.compact("prices")
        assert sum(r.messages_in for r in reports) == 250
        assert sum(r.messages_out for r in reports) == 50  # tombstones stay a day
        after = _read_all(address, "prices", 2)
        latest = {m.key: m.value for m in after}
        assert latest == model
        assert len(after) == 50  # one per key
        for key, value in model.items():
            assert admin.get("prices", key) == value
            found = admin.lookup("prices", key)
            assert found is not None
            assert found.value == value
        assert admin.get("prices", b"no-such-key") is None
        # Batches carry the offsets of compacted messages, holes included.
        with tidemq.StreamConsumer(address, start="earliest") as consumer:
            consumer.assign([("prices", 0)])
            offsets: list[int] = []
            deadline = time.monotonic() + 20
            want = {m.offset for m in after if m.queue == 0}
            while set(offsets) != want and time.monotonic() < deadline:
                for batch in consumer.poll_batches(timeout_ms=200):
                    offsets += batch.offsets.tolist()
            assert sorted(offsets) == sorted(want)


def test_keyless_messages_are_refused_at_the_send(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    with tidemq.Admin(address) as admin, tidemq.Producer(address) as producer:
        admin.create_topic("orders", 1, config=COMPACT)
        with pytest.raises(InvalidBatch, match="compact topic"):
            producer.send("orders", b"no key")
        with pytest.raises(InvalidBatch, match="compact topic"):
            producer.send("orders", b"later", delay=60.0)
        producer.send("orders", b"fine", key=b"o-1")


def test_compaction_settings_are_checked_and_alterable(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    with tidemq.Admin(address) as admin:
        with pytest.raises(ConfigError, match=r"dirty\.ratio"):
            admin.create_topic("bad", 1, config={**COMPACT, "min.cleanable.dirty.ratio": "1.5"})
        admin.create_topic("plain", 1)
        with pytest.raises(ConfigError, match="only compact topics"):
            admin.compact("plain")
        with pytest.raises(ConfigError, match="not a compact topic"):
            admin.get("plain", b"k")
        admin.alter_topic("plain", config={"cleanup.policy": "compact", "delete.retention.ms": "0"})
        info = admin.describe_topic("plain")
        assert info.config["delete.retention.ms"] == "0"
        with tidemq.Producer(address) as producer:
            producer.send("plain", b"v", key=b"k")
            producer.send("plain", None, key=b"k")
        admin.compact("plain")
        assert admin.get("plain", b"k") is None
        assert _read_all(address, "plain", 1) == []  # delete.retention.ms 0: tombstone gone


def test_table_view_follows_the_topic(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    changes: list[tuple[bytes, bytes | None]] = []
    seen = threading.Event()
    with tidemq.Admin(address) as admin, tidemq.Producer(address) as producer:
        admin.create_topic("table", 3, config=COMPACT)
        for i in range(30):
            producer.send("table", f"v{i}".encode(), key=f"k{i % 10}".encode())
        producer.flush()
        admin.compact("table")
        with tidemq.TableView("table", address) as view:
            assert view.snapshot() == {f"k{i}".encode(): f"v{i + 20}".encode() for i in range(10)}

            def listener(key: bytes, value: bytes | None) -> None:
                changes.append((key, value))
                if key == b"k3":
                    seen.set()

            view.listen(listener)
            producer.send("table", b"new", key=b"k1")
            producer.send("table", None, key=b"k3")
            view.refresh()
            assert view.get(b"k1") == b"new"
            assert b"k3" not in view
            assert len(view) == 9
            assert seen.wait(10)
            assert (b"k1", b"new") in changes
            assert (b"k3", None) in changes


def test_async_table_view_and_admin(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address

    async def scenario() -> None:
        async with tidemq.aio.Admin(address) as admin, tidemq.aio.Producer(address) as producer:
            await admin.create_topic("atable", 1, config=COMPACT)
            await producer.send("atable", b"1", key=b"a")
            await producer.send("atable", b"2", key=b"a")
            async with tidemq.aio.TableView("atable", address) as view:
                assert view.get(b"a") == b"2"
            assert await admin.get("atable", b"a") == b"2"

    asyncio.run(scenario())


def test_compaction_while_producers_and_a_consumer_run_loses_nothing(
    sync_broker: ThreadedBroker,
) -> None:
    address = sync_broker.address
    keys = 40
    with tidemq.Admin(address) as admin:
        admin.create_topic("live", 1, config=COMPACT)
    latest: dict[bytes, bytes] = {}
    stop = threading.Event()
    consumed: list[tidemq.Message] = []

    def consume() -> None:
        with tidemq.StreamConsumer(address, start="earliest") as consumer:
            consumer.assign([("live", 0)])
            while not stop.is_set():
                consumed.extend(consumer.poll(timeout_ms=100))

    reader = threading.Thread(target=consume)
    reader.start()
    try:
        with tidemq.Producer(address) as producer, tidemq.Admin(address) as admin:
            for round_ in range(20):
                for i in range(keys):
                    key, value = f"k{i}".encode(), f"{round_}".encode()
                    producer.send_async("live", value, key=key)
                    latest[key] = value
                if round_ % 4 == 3:
                    producer.flush()
                    admin.compact("live")
            producer.flush()
            admin.compact("live")
            for key, value in latest.items():
                assert admin.get("live", key) == value
    finally:
        stop.set()
        reader.join(30)
    # The consumer that ran throughout saw offsets in increasing order, and the last value
    # of every key (compaction never removes a key's latest message).
    offsets = [m.offset for m in consumed]
    assert offsets == sorted(set(offsets))
    assert {m.key: m.value for m in _read_all(address, "live", 1)} == latest


def test_pop_consumption_of_a_compacted_topic(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    with tidemq.Admin(address) as admin, tidemq.Producer(address) as producer:
        admin.create_topic("popkv", 1, config=COMPACT)
        for i in range(12):
            producer.send("popkv", f"v{i}".encode(), key=f"k{i % 4}".encode())
        producer.flush()
        admin.compact("popkv")
    got: list[tidemq.ReceivedMessage] = []
    with tidemq.SimpleConsumer(address, "popkv-g", {"popkv": "*"}, await_duration=1.0) as c:
        deadline = time.monotonic() + 20
        while len(got) < 4 and time.monotonic() < deadline:
            batch = c.receive(16)
            c.ack_many(batch)
            got += batch
    assert sorted((m.offset, m.key, m.value) for m in got) == [
        (8 + i, f"k{i}".encode(), f"v{8 + i}".encode()) for i in range(4)
    ]


def test_transactions_on_a_compact_topic(sync_broker: ThreadedBroker) -> None:
    """A committed transaction's value is the latest; a rolled-back or undecided one is
    never a key's value, before or after compaction."""
    address = sync_broker.address

    async def scenario() -> None:
        async with tidemq.aio.Admin(address) as admin:
            await admin.create_topic("txkv", 1, config=COMPACT)
            async with tidemq.aio.TransactionProducer(address, "txkv-g") as producer:
                async with producer.transaction() as tx:
                    await tx.send("txkv", b"committed", key=b"k")
                tx = await producer.begin()
                await tx.send("txkv", b"rolled-back", key=b"k")
                await tx.rollback()
                open_tx = await producer.begin()
                await open_tx.send("txkv", b"undecided", key=b"k")
                assert await admin.get("txkv", b"k") == b"committed"
                await admin.compact("txkv")
                assert await admin.get("txkv", b"k") == b"committed"
                with pytest.raises(InvalidBatch, match="compact topic"):
                    await open_tx.send("txkv", b"no key")
                await open_tx.rollback()

    asyncio.run(scenario())
