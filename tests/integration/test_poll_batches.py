"""StreamConsumer.poll_batches: the same messages as poll, column by column."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import pytest

from tidemq import aio

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop

pytestmark = pytest.mark.timeout(120)

TOPIC = "columns"


async def _fill(address: str) -> None:
    async with aio.Admin(address) as admin:
        await admin.create_topic(TOPIC, 2)
    async with aio.Producer(address) as producer:
        for b in range(6):
            await producer.send_batch(
                TOPIC,
                [b"v%d-%d" % (b, i) if i % 7 else None for i in range(40)],
                keys=[b"k%d" % i if i % 3 else None for i in range(40)],
                tags=["paid" if i % 2 else "open" for i in range(40)],
                headers={"region": b"us" if b % 2 else b"eu"},
                queue=b % 2,
            )
        for i in range(10):  # single sends: batches of one (or a few, lingering)
            await producer.send(TOPIC, b"s%d" % i, tag="paid", queue=0)


async def _drain_messages(consumer: aio.StreamConsumer, count: int) -> list[aio.Message]:
    out: list[aio.Message] = []
    deadline = time.monotonic() + 20
    while len(out) < count and time.monotonic() < deadline:
        out.extend(await consumer.poll(300))
    out.extend(await consumer.poll(100))
    return sorted(out, key=lambda m: (m.queue, m.offset))


async def _drain_batches(consumer: aio.StreamConsumer, count: int) -> list[aio.MessageBatch]:
    out: list[aio.MessageBatch] = []
    deadline = time.monotonic() + 20
    while sum(len(b) for b in out) < count and time.monotonic() < deadline:
        out.extend(await consumer.poll_batches(300))
    out.extend(await consumer.poll_batches(100))
    return out


def _as_messages(batches: list[aio.MessageBatch]) -> list[aio.Message]:
    return sorted((m for b in batches for m in b.messages()), key=lambda m: (m.queue, m.offset))


@pytest.mark.parametrize(
    ("subscription", "expected_count"),
    # after the seek to offset 5 of queue 0: 245 of 250, 128 of 130 tagged paid (two of
    # the five skipped are), and the 120 of the three batches with region us (queue 1)
    [(None, 245), ("paid", 128), (aio.Sql92("region = 'us'"), 120)],
    ids=["all", "tag", "sql92"],
)
def test_poll_batches_gives_what_poll_gives(
    loop: Loop, broker: BrokerEnv, subscription: str | aio.Sql92 | None, expected_count: int
) -> None:
    async def main() -> None:
        await _fill(broker.address)
        plain = aio.StreamConsumer(broker.address, start="earliest", filter=subscription)
        columnar = aio.StreamConsumer(broker.address, start="earliest", filter=subscription)
        for c in (plain, columnar):
            c.assign([(TOPIC, 0), (TOPIC, 1)])
            c.seek(TOPIC, 0, 5)  # inside the first batch: its first messages are left out
        messages = await _drain_messages(plain, expected_count)
        batches = await _drain_batches(columnar, expected_count)
        assert len(messages) == expected_count
        assert _as_messages(batches) == messages
        for c in (plain, columnar):
            assert c.position(TOPIC, 0) == plain.position(TOPIC, 0)
        # the columns agree with the messages, and offsets are the messages' offsets
        by_offset = {(m.queue, m.offset): m for m in messages}
        for b in batches:
            assert b.topic == TOPIC
            assert len(b) == len(b.indices) > 0
            assert np.all(np.diff(b.offsets) > 0)
            got = [by_offset[(b.queue, int(o))] for o in b.offsets]
            assert b.values() == [m.value for m in got]
            assert b.keys() == [m.key for m in got]
            assert b.tags() == [m.tag for m in got]
        await plain.close()
        await columnar.close()

    loop.run(main())


def test_poll_batches_of_delayed_messages_keep_their_ids(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            await admin.create_topic(TOPIC, 1)
        async with aio.Producer(broker.address) as producer:
            receipts = await producer.send_batch(TOPIC, [b"a", b"b", b"c"], delay=0.2)
        consumer = aio.StreamConsumer(broker.address, start="earliest")
        consumer.assign([(TOPIC, 0)])
        batches = await _drain_batches(consumer, 3)
        await consumer.close()
        messages = [m for b in batches for m in b.messages()]
        assert [m.value for m in messages] == [b"a", b"b", b"c"]
        assert [m.message_id for m in messages] == [r.message_id for r in receipts]
        assert all(m.deliver_at_ms > 0 for m in messages)

    loop.run(main())
