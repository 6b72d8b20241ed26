"""Delayed and transactional messages found by the ids their receipts and consumers see
(`Admin.get_message`): ids that name the broker's timer or half topic, where the message
was first stored, before and after it is delivered or published."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from tidemq import aio
from tidemq.core.errors import UnknownMessage
from tidemq.core.message import message_id

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop

pytestmark = pytest.mark.timeout(120)

TOPIC = "later"
GROUP = "g-origin"


async def _consumed(address: str, count: int) -> dict[bytes, aio.Message]:
    """The topic's first `count` messages by value (within 20 s)."""
    consumer = aio.StreamConsumer(address, start="earliest")
    consumer.assign([(TOPIC, 0), (TOPIC, 1)])
    out: dict[bytes, aio.Message] = {}
    deadline = time.monotonic() + 20
    try:
        while len(out) < count:
            assert time.monotonic() < deadline, f"got {len(out)} of {count}"
            for m in await consumer.poll(200):
                out[m.value or b""] = m
    finally:
        await consumer.close()
    return out


def test_delayed_messages_by_id_before_and_after_delivery(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            await admin.create_topic(TOPIC, 2)
            async with aio.Producer(broker.address) as producer:
                pending = await producer.send(TOPIC, b"in-an-hour", delay=3600, key=b"k", queue=1)
                past = await producer.send_batch(
                    TOPIC, [b"b0", b"b1", b"b2"], deliver_at=time.time() - 1, queue=0
                )
            waiting = await admin.get_message(pending.message_id)
            assert waiting is not None
            assert (waiting.topic, waiting.queue, waiting.offset) == (TOPIC, 1, -1)
            assert (waiting.value, waiting.key) == (b"in-an-hour", b"k")
            assert waiting.message_id == pending.message_id
            assert waiting.deliver_at_ms > time.time() * 1000 + 3_000_000
            delivered = await _consumed(broker.address, 3)
            found = await admin.get_message(past[1].message_id)
            assert found is not None
            b1 = delivered[b"b1"]
            assert (found.value, found.topic, found.queue) == (b"b1", TOPIC, 0)
            assert (found.offset, found.message_id) == (b1.offset, b1.message_id)
            assert pending.origin is not None
            beyond = message_id(pending.origin[0], 0, pending.origin[2] + 100)
            with pytest.raises(UnknownMessage, match="no live broker stored it"):
                await admin.get_message(beyond)

    loop.run(main())


def test_transactional_messages_by_id(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            await admin.create_topic(TOPIC, 2)
            async with aio.TransactionProducer(broker.address, GROUP) as producer:
                kept = await producer.begin()
                half = await kept.send(TOPIC, b"kept", queue=0)
                dropped = await producer.begin()
                gone = await dropped.send(TOPIC, b"dropped", queue=1)
                before = await admin.get_message(half.message_id)
                assert before is not None
                assert (before.value, before.offset) == (b"kept", -1)  # open: not published
                (published,) = await kept.commit()
                await dropped.rollback()
            after = await admin.get_message(half.message_id)
            assert after is not None
            assert (after.topic, after.queue, after.offset) == (TOPIC, 0, published.offset)
            assert after.message_id == published.message_id
            rolled = await admin.get_message(gone.message_id)
            assert rolled is not None  # still kept in the half topic, never published
            assert (rolled.value, rolled.queue, rolled.offset) == (b"dropped", 1, -1)

    loop.run(main())
