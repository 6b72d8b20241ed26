"""Producing and stream consumption against a real broker: queue choice, batches, message
fields, seeking, long polling, and the synchronous twins of the asyncio API."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest

import tidemq
from tidemq import aio
from tidemq.client.cluster import ClusterClient
from tidemq.cluster.route import queue_for_key
from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.core.errors import RequestTimeout
from tidemq.core.filters import FilterSyntaxError
from tidemq.core.limits import MAX_QUEUES_PER_TOPIC
from tidemq.protocol.commands import FetchRequest, FetchResponse

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop, StartBroker, ThreadedBroker

pytestmark = pytest.mark.timeout(120)

TOPIC = "orders"


async def _create(address: str, topic: str = TOPIC, queues: int = 4) -> None:
    async with aio.Admin(address) as admin:
        await admin.create_topic(topic, queues)


async def _read(
    consumer: aio.StreamConsumer, count: int, *, timeout_s: float = 20.0
) -> list[aio.Message]:
    """Poll until `count` messages arrived (fail after `timeout_s`), and a little longer to
    catch any extra ones."""
    out: list[aio.Message] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count:
        assert time.monotonic() < deadline, f"got {len(out)} of {count} messages"
        out.extend(await consumer.poll(500))
    out.extend(await consumer.poll(100))
    return out


# ------------------------------------------------------------------ queue choice


def test_same_key_goes_to_same_queue(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, queues=8)
        async with aio.Producer(broker.address) as producer:
            by_key: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
            for round_ in range(5):
                for k in range(12):
                    key = f"customer-{k}".encode()
                    r = await producer.send(TOPIC, b"%d" % round_, key=key)
                    by_key[key].append((r.queue, r.offset))
        for key, placed in by_key.items():
            queues = {q for q, _ in placed}
            # The key's queue is the documented stable hash, not a per-process one.
            assert queues == {queue_for_key(key, 8)}, key
            offsets = [o for _, o in placed]
            assert offsets == sorted(offsets)  # a key's messages stay in order
        assert len({q for placed in by_key.values() for q, _ in placed}) > 1

    loop.run(main())


def test_acks_zero_sends_without_answers(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, queues=1)
        with pytest.raises(ValueError, match="idempotent=False"):
            aio.Producer(broker.address, acks=0)
        async with aio.Producer(broker.address, acks=0, idempotent=False) as producer:
            receipts = [await producer.send(TOPIC, b"fire-%d" % i, queue=0) for i in range(50)]
            receipts += await producer.send_batch(TOPIC, [b"a", b"b"], queue=0)
        assert {r.offset for r in receipts} == {-1}  # where they landed is not known
        consumer = aio.StreamConsumer(broker.address, start="earliest")
        consumer.assign([(TOPIC, 0)])
        got = await _read(consumer, 52)
        await consumer.close()
        assert [m.value for m in got] == [b"fire-%d" % i for i in range(50)] + [b"a", b"b"]

    loop.run(main())


def test_explicit_queue_and_round_robin(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, queues=4)
        async with aio.Producer(broker.address) as producer:
            explicit = [await producer.send(TOPIC, b"x", queue=2) for _ in range(5)]
            assert [(r.queue, r.offset) for r in explicit] == [(2, i) for i in range(5)]
            spread = [(await producer.send(TOPIC, b"y")).queue for _ in range(12)]
        # Round robin over the four served queues: each gets every fourth message.
        assert sorted(spread) == sorted([0, 1, 2, 3] * 3)
        for i in range(4, 12):
            assert spread[i] == spread[i - 4]

    loop.run(main())


# ------------------------------------------------------------------ batches


def test_send_batch_is_one_record_with_contiguous_offsets(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, queues=2)
        values = [b"m%d" % i for i in range(50)]
        async with aio.Producer(broker.address) as producer:
            await producer.send(TOPIC, b"first", queue=1)
            receipts = await producer.send_batch(
                TOPIC, values, keys=[b"k%d" % i for i in range(50)], queue=1
            )
        assert [r.queue for r in receipts] == [1] * 50
        assert [r.offset for r in receipts] == list(range(1, 51))
        assert len({r.message_id for r in receipts}) == 50

        # One record on the wire and on disk: a fetch from the batch's base offset
        # answers with exactly one record holding all 50 messages.
        client = ClusterClient(broker.address)
        try:
            request = FetchRequest(topic=TOPIC, queue=1, offset=1, max_bytes=1 << 20)
            response, _ = await client.request(broker.address, request, FetchResponse)
        finally:
            await client.close()
        assert response.status == "found"
        assert len(response.record_sizes) == 1
        assert response.next_offset == 51

        consumer = aio.StreamConsumer(broker.address)
        try:
            consumer.assign([(TOPIC, 1)])
            consumer.seek(TOPIC, 1, 1)
            got = await _read(consumer, 50)
        finally:
            await consumer.close()
        assert [m.value for m in got] == values
        assert [m.offset for m in got] == list(range(1, 51))
        assert [m.key for m in got] == [b"k%d" % i for i in range(50)]

    loop.run(main())


def test_send_batch_by_first_key_and_starting_mid_batch(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, queues=4)
        async with aio.Producer(broker.address) as producer:
            receipts = await producer.send_batch(TOPIC, [b"a", b"b", b"c"], keys=[b"x", b"y", b"z"])
        assert {r.queue for r in receipts} == {queue_for_key(b"x", 4)}
        consumer = aio.StreamConsumer(broker.address)
        try:
            q = receipts[0].queue
            consumer.assign([(TOPIC, q)])
            consumer.seek(TOPIC, q, 1)  # inside the batch: the first message is skipped
            got = await _read(consumer, 2)
        finally:
            await consumer.close()
        assert [(m.offset, m.value) for m in got] == [(1, b"b"), (2, b"c")]

    loop.run(main())


def test_send_nowait_and_flush(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, queues=3)
        async with aio.Producer(broker.address, linger_ms=5) as producer:
            futures = [
                await producer.send_nowait(TOPIC, b"%d" % i, key=b"%d" % (i % 7))
                for i in range(600)
            ]
            await producer.flush()
            assert all(f.done() for f in futures)
            receipts = [f.result() for f in futures]
        per_queue: dict[int, list[int]] = defaultdict(list)
        for r in receipts:
            per_queue[r.queue].append(r.offset)
        for offsets in per_queue.values():
            # Every queue's offsets are dense from 0 and follow the send order.
            assert offsets == list(range(len(offsets)))

        consumer = aio.StreamConsumer(broker.address, start="earliest")
        try:
            consumer.assign([(TOPIC, q) for q in range(3)])
            got = await _read(consumer, 600)
        finally:
            await consumer.close()
        assert sorted(int(m.value or b"") for m in got) == list(range(600))

    loop.run(main())


def test_flush_returns_when_a_sender_task_is_cancelled(loop: Loop, broker: BrokerEnv) -> None:
    """What happens to every task when an event loop shuts down (asyncio.run after Ctrl-C):
    a producer's flush, and so its close, must not wait forever for a cancelled sender."""

    async def main() -> None:
        await _create(broker.address, queues=1)
        async with aio.Producer(broker.address) as producer:
            future = await producer.send_nowait(TOPIC, b"lost", queue=0)
            await asyncio.sleep(0)  # sealed: the sender's task exists but has not started
            task = producer._senders[(TOPIC, 0)]._task
            assert task is not None
            assert not task.done()
            task.cancel()
            await asyncio.wait_for(producer.flush(), 10)
            with pytest.raises(RequestTimeout, match="cancelled"):
                await future
            # The producer keeps working: the next send gets a new sender.
            receipt = await producer.send(TOPIC, b"kept", queue=0)
        assert (receipt.queue, receipt.offset) == (0, 0)

    loop.run(main())


# ------------------------------------------------------------------ message fields


def test_fields_round_trip(loop: Loop, broker: BrokerEnv) -> None:
    when = datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)

    async def main() -> None:
        await _create(broker.address, queues=1)
        async with aio.Producer(broker.address) as producer:
            await producer.send(
                TOPIC,
                b"\x00payload\xff",
                key=b"k-1",
                tag="TagA",
                keys=["order-1", "customer-9"],
                headers={"trace": b"abc", "empty": b"", "bin": bytes(range(256))},
                timestamp=when,
            )
            await producer.send(TOPIC, None, key=b"tombstone", timestamp=1_700_000_000.25)
            await producer.send(TOPIC, b"", tag="", headers={})
        consumer = aio.StreamConsumer(broker.address, start="earliest")
        try:
            consumer.assign([(TOPIC, 0)])
            first, second, third = await _read(consumer, 3)
        finally:
            await consumer.close()
        assert first.value == b"\x00payload\xff"
        assert first.key == b"k-1"
        assert first.tag == "TagA"
        assert first.keys == ("order-1", "customer-9")
        assert dict(first.headers) == {"trace": b"abc", "empty": b"", "bin": bytes(range(256))}
        assert first.timestamp == when
        assert first.timestamp_ms == int(when.timestamp() * 1000)
        assert (first.topic, first.queue, first.offset) == (TOPIC, 0, 0)
        assert second.value is None
        assert second.key == b"tombstone"
        assert second.timestamp_ms == 1_700_000_000_250
        assert third.value == b""
        assert dict(third.headers) == {}

    loop.run(main())


def test_tag_subscription_filters(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, queues=1)
        async with aio.Producer(broker.address) as producer:
            for i in range(30):
                await producer.send(TOPIC, b"%d" % i, tag=("A", "B", "C")[i % 3])
        consumer = aio.StreamConsumer(broker.address, start="earliest", tags=["A", "C"])
        try:
            consumer.assign([(TOPIC, 0)])
            got = await _read(consumer, 20)
        finally:
            await consumer.close()
        assert [m.tag for m in got] == ["A", "C"] * 10
        assert all(int(m.value or b"") % 3 != 1 for m in got)

    loop.run(main())


# ------------------------------------------------------------------ stream consumer


def test_assign_seek_and_positions(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, queues=2)
        async with aio.Producer(broker.address) as producer:
            for i in range(10):
                await producer.send(TOPIC, b"q0-%d" % i, queue=0)
            for i in range(4):
                await producer.send(TOPIC, b"q1-%d" % i, queue=1)
        consumer = aio.StreamConsumer(broker.address, start="latest")
        try:
            consumer.assign([(TOPIC, 0), (TOPIC, 1)])
            assert consumer.assignment() == [(TOPIC, 0), (TOPIC, 1)]
            assert consumer.position(TOPIC, 0) is None  # resolved at the first poll
            assert await consumer.poll(300) == []  # start="latest": nothing old
            assert consumer.position(TOPIC, 0) == 10
            assert consumer.position(TOPIC, 1) == 4

            consumer.seek(TOPIC, 0, 7)
            got = await _read(consumer, 3)
            assert [m.value for m in got] == [b"q0-7", b"q0-8", b"q0-9"]
            assert consumer.position(TOPIC, 0) == 10

            await consumer.seek_to_beginning(TOPIC, 1)
            assert consumer.position(TOPIC, 1) == 0
            got = await _read(consumer, 4)
            assert [m.value for m in got] == [b"q1-%d" % i for i in range(4)]

            await consumer.seek_to_beginning()  # every assigned queue
            assert len(await _read(consumer, 14)) == 14
            assert consumer.position(TOPIC, 0) == 10
            await consumer.seek_to_end()
            assert (consumer.position(TOPIC, 0), consumer.position(TOPIC, 1)) == (10, 4)

            consumer.assign([(TOPIC, 1)])  # replaces the assignment
            assert consumer.assignment() == [(TOPIC, 1)]
            with pytest.raises(ValueError, match="not assigned"):
                consumer.seek(TOPIC, 0, 0)
            with pytest.raises(ValueError, match="offset must be 0 to"):
                consumer.seek(TOPIC, 1, -1)
        finally:
            await consumer.close()

    loop.run(main())


def test_seek_to_time(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, queues=1)
        async with aio.Producer(broker.address) as producer:
            for i in range(5):
                await producer.send(TOPIC, b"old-%d" % i, queue=0)
            # The lookup is by store time: wait until the broker's clock is past the old
            # batches before taking the cut, then send the new ones.
            await asyncio.sleep(0.02)
            cut_ms = time.time_ns() // 1_000_000
            await asyncio.sleep(0.02)
            for i in range(5):
                await producer.send(TOPIC, b"new-%d" % i, queue=0)
        consumer = aio.StreamConsumer(broker.address)
        try:
            consumer.assign([(TOPIC, 0)])
            await consumer.seek_to_time(cut_ms / 1000)  # seconds, as every timestamp
            assert consumer.position(TOPIC, 0) == 5
            got = await _read(consumer, 5)
            assert [m.value for m in got] == [b"new-%d" % i for i in range(5)]
            await consumer.seek_to_time(0)
            assert consumer.position(TOPIC, 0) == 0
            await consumer.seek_to_time(cut_ms / 1000 + 3600)  # after everything: the end
            assert consumer.position(TOPIC, 0) == 10
        finally:
            await consumer.close()

    loop.run(main())


def test_long_poll_wakes_when_data_arrives(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, queues=1)
        # The consumer's fetch parks on the broker for up to 5 s: only the broker's wake-up
        # can make the poll return early.
        consumer = aio.StreamConsumer(broker.address, start="latest", fetch_wait_ms=5_000)
        try:
            consumer.assign([(TOPIC, 0)])
            polling = asyncio.create_task(consumer.poll(timeout_ms=5_000))
            await loop.wait_until(lambda: broker.broker._polling.parked > 0, what="a parked fetch")
            async with aio.Producer(broker.address) as producer:
                sent_at = time.monotonic()
                await producer.send(TOPIC, b"wake up", queue=0)
            got = await polling
            waited = time.monotonic() - sent_at
        finally:
            await consumer.close()
        assert [m.value for m in got] == [b"wake up"]
        assert waited < 2.0, f"poll returned {waited:.2f} s after the send"

    loop.run(main())


def test_append_made_durable_by_a_checkpoint_is_acknowledged(loop: Loop, broker: BrokerEnv) -> None:
    """Sync flush mode: a checkpoint (which flushes on the loop) can make an append durable
    before the flusher gets to it; the append is still answered, and fetches wake. (The
    append is over the gateway's inline-sync size, so the flusher thread owns its sync.)"""

    async def main() -> None:
        await _create(broker.address, queues=1)
        client = ClusterClient(broker.address)
        try:
            parked = asyncio.create_task(
                client.request(
                    broker.address,
                    FetchRequest(
                        topic=TOPIC, queue=0, offset=0, max_bytes=1024, max_wait_ms=20_000
                    ),
                    FetchResponse,
                )
            )
            await loop.wait_until(lambda: broker.broker._polling.parked == 1, what="the park")
            gateway = broker.broker._gateway
            payload = encode_batch([MessageRecord(b"v" * 20_000, None, None, (), (), 1)])
            append = asyncio.create_task(gateway.append(TOPIC, 0, payload))
            await asyncio.sleep(0)  # the append runs up to its wait for the flusher...
            assert gateway.store.flushed_position < gateway.store.end_position
            gateway.store.checkpoint()  # ...and a checkpoint flushes first
            result = await asyncio.wait_for(append, 10)
            assert (result.base_offset, result.count) == (0, 1)
            response, _ = await asyncio.wait_for(parked, 10)
            assert (response.status, response.next_offset) == ("found", 1)
        finally:
            await client.close()

    loop.run(main())


def test_poll_times_out_empty_when_idle(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, queues=2)
        consumer = aio.StreamConsumer(broker.address, fetch_wait_ms=200)
        try:
            consumer.assign([(TOPIC, 0), (TOPIC, 1)])
            started = time.monotonic()
            assert await consumer.poll(timeout_ms=600) == []
            assert time.monotonic() - started >= 0.55
        finally:
            await consumer.close()

    loop.run(main())


# ------------------------------------------------------------------ sync API


def test_sync_producer_and_stream_consumer(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    with tidemq.Admin(address) as admin:
        admin.create_topic(TOPIC, 3)
    with tidemq.Producer(address) as producer:
        r = producer.send(TOPIC, b"one", key=b"k", tag="T", headers={"h": b"v"}, keys=["id-1"])
        assert isinstance(r, tidemq.Receipt)
        assert (r.queue, r.offset) == (queue_for_key(b"k", 3), 0)
        # The other two queues: 20 single sends to one, batches to the other.
        singles, batched = (r.queue + 1) % 3, (r.queue + 2) % 3
        futures = [producer.send_async(TOPIC, b"async-%d" % i, queue=singles) for i in range(20)]
        producer.flush()
        assert [f.result(10).offset for f in futures] == list(range(20))
        batch = producer.send_batch(TOPIC, [b"b0", b"b1", b"b2"], queue=batched)
        assert [x.offset for x in batch] == [0, 1, 2]
        later = producer.send_batch_async(TOPIC, [b"b3"], queue=batched).result(10)
        assert later[0].offset == 3

    with tidemq.StreamConsumer(address, start="earliest") as consumer:
        consumer.assign([(TOPIC, q) for q in range(3)])
        assert consumer.assignment() == [(TOPIC, 0), (TOPIC, 1), (TOPIC, 2)]
        got: list[tidemq.Message] = []
        deadline = time.monotonic() + 20
        while len(got) < 25 and time.monotonic() < deadline:
            got.extend(consumer.poll(500))
        assert len(got) == 25
        one = next(m for m in got if m.value == b"one")
        assert (one.key, one.tag, one.keys, dict(one.headers)) == (
            b"k",
            "T",
            ("id-1",),
            {"h": b"v"},
        )

        consumer.seek(TOPIC, batched, 2)
        assert consumer.position(TOPIC, batched) == 2
        assert [m.value for m in consumer.poll(5_000)] == [b"b2", b"b3"]
        consumer.seek_to_beginning(TOPIC, singles)
        assert consumer.position(TOPIC, singles) == 0
        consumer.seek_to_end()
        ends = {q: consumer.position(TOPIC, q) for q in range(3)}
        assert ends == {r.queue: 1, singles: 20, batched: 4}
        consumer.seek_to_time(0, TOPIC, singles)
        assert consumer.position(TOPIC, singles) == 0
        for message in consumer:  # iteration polls forever; take one
            assert (message.queue, message.offset) == (singles, 0)
            break


def test_stream_and_group_consumers_filter_on_the_broker(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, queues=1)
        async with aio.Producer(broker.address) as producer:
            values = [b"v%d" % i for i in range(40)]
            await producer.send_batch(
                TOPIC,
                values,
                tags=["paid" if i % 4 == 0 else "new" for i in range(40)],
                headers={"region": b"eu"},
                queue=0,
            )
            for i in range(10):
                await producer.send(
                    TOPIC, b"w%d" % i, headers={"region": b"us", "n": b"%d" % i}, queue=0
                )
        sql = aio.StreamConsumer(
            broker.address, start="earliest", filter=aio.Sql92("region = 'us' AND n >= 7")
        )
        sql.assign([(TOPIC, 0)])
        got = await _read(sql, 3)
        await sql.close()
        assert [m.value for m in got] == [b"w7", b"w8", b"w9"]
        tags = aio.StreamConsumer(broker.address, start="earliest", filter="paid")
        tags.assign([(TOPIC, 0)])
        got = await _read(tags, 10)
        await tags.close()
        assert [m.value for m in got] == [b"v%d" % i for i in range(0, 40, 4)]
        group = aio.GroupConsumer(
            broker.address, "filtered", [TOPIC], start="earliest", filter=aio.Sql92("region = 'us'")
        )
        got_g: list[aio.Message] = []
        deadline = time.monotonic() + 20
        while len(got_g) < 10 and time.monotonic() < deadline:
            got_g += await group.poll(500)
        await group.close()
        assert [m.value for m in got_g] == [b"w%d" % i for i in range(10)]
        with pytest.raises(FilterSyntaxError, match="column"):
            aio.StreamConsumer(broker.address, filter=aio.Sql92("n >>= 1"))

    loop.run(main())


def test_a_topic_with_the_most_queues_routes_and_serves(loop: Loop, broker: BrokerEnv) -> None:
    """Thousands of queues: the create answer and the routes exceed the u16 frame header
    and travel as long headers (protocol.md)."""

    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            info = await admin.create_topic("wide", MAX_QUEUES_PER_TOPIC)
            assert len(info.queue_info) == MAX_QUEUES_PER_TOPIC
            described = await admin.describe_topic("wide")
            assert [q.queue for q in described.queue_info] == list(range(MAX_QUEUES_PER_TOPIC))
        last = MAX_QUEUES_PER_TOPIC - 1
        async with aio.Producer(broker.address) as producer:
            receipt = await producer.send("wide", b"far", queue=last)
            assert (receipt.queue, receipt.offset) == (last, 0)
        consumer = aio.StreamConsumer(broker.address, start="earliest")
        consumer.assign([("wide", last)])
        got = await _read(consumer, 1)
        await consumer.close()
        assert [m.value for m in got] == [b"far"]

    loop.run(main())


def test_an_idempotent_producer_keeps_no_more_in_flight_than_the_broker_remembers(
    loop: Loop, start_broker: StartBroker
) -> None:
    """The broker says its idempotence window with the producer id; a producer asking
    for more in flight keeps to it (so a retried batch is always recognised), and every
    batch is stored once, in order."""
    env = start_broker(store_overrides={"idempotence_window": 3})

    async def main() -> None:
        async with aio.Admin(env.address) as admin:
            await admin.create_topic("w", 1)
        with pytest.raises(ValueError, match=r"max_in_flight_per_queue must be 1\.\.32"):
            aio.Producer(env.address, max_in_flight_per_queue=33)
        producer = aio.Producer(env.address, max_in_flight_per_queue=32)
        futures = [
            await producer.send_batch_nowait("w", [b"%d-%d" % (b, i) for i in range(10)])
            for b in range(40)
        ]
        receipts = [await f for f in futures]
        assert [r[0].offset for r in receipts] == list(range(0, 400, 10))
        assert producer.window_for(env.address) == 3
        plain = aio.Producer(env.address, max_in_flight_per_queue=32, idempotent=False)
        assert plain.window_for(env.address) == 32  # nothing to remember: as asked
        await producer.close()
        await plain.close()

    loop.run(main())
