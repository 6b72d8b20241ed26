"""Consumer retries through `%RETRY%<group>` against a real broker: a nack on a plain topic
moves the message through the timer to the group's retry topic, from which the group
receives it again with the topic, id and attempt count it had; a FIFO topic retries in
place; the last attempt's nack dead-letters at once; retries survive a restart."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from tidemq import aio
from tidemq.broker.broker import Broker
from tidemq.client.simple_consumer import AsyncReceivedMessage, AsyncSimpleConsumer
from tidemq.core.errors import InvalidRequest

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop, StartBroker

pytestmark = pytest.mark.timeout(120)

TOPIC = "jobs"
GROUP = "workers"
RETRY = "%RETRY%workers"


def _consumer(address: str, **kw: object) -> AsyncSimpleConsumer:
    options: dict[str, object] = {"await_duration": 0.2, **kw}
    subs = options.pop("subscriptions", {TOPIC: "*"})
    return AsyncSimpleConsumer(address, GROUP, subs, **options)  # type: ignore[arg-type]


async def _receive_n(
    consumer: AsyncSimpleConsumer, n: int, timeout: float = 10.0
) -> list[AsyncReceivedMessage]:
    out: list[AsyncReceivedMessage] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += await consumer.receive(n - len(out))
    return out


async def _read_all(address: str, topic: str) -> list[aio.Message]:
    reader = aio.StreamConsumer(address, start="earliest")
    reader.assign([(topic, 0)])
    out: list[aio.Message] = []
    while batch := await reader.poll(200):
        out += batch
    await reader.close()
    return out


def test_a_nack_moves_the_message_to_the_retry_topic_after_its_delay(
    loop: Loop, broker: BrokerEnv
) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            await admin.create_topic(TOPIC, 1)
        async with aio.Producer(broker.address) as producer:
            sent = await producer.send(TOPIC, b"job", key=b"k", tag="t", headers={"h": b"1"})
        c = _consumer(broker.address)
        (first,) = await c.receive(1)
        assert first.message_id == sent.message_id
        nacked_at = time.time() * 1000
        await first.nack(delay=1.0, reason="db down")
        with pytest.raises(InvalidRequest, match="moved to its retry topic"):
            await first.ack()  # the lease is finished: the message moved
        async with aio.Admin(broker.address) as admin:
            timers = await admin.timer_status()
            (pending,) = [t for t in timers.topics if t.topic == RETRY]
            assert pending.pending_messages == 1
            assert pending.next_due_ms >= nacked_at + 1000
            (status,) = await admin.pop_status(GROUP)
            assert (status.topic, status.retried, status.in_flight) == (TOPIC, 1, 0)
            assert status.acked_below == 1  # the original is finished
        assert await c.receive(1) == []  # not before its delay
        (again,) = await _receive_n(c, 1)
        assert time.time() * 1000 >= nacked_at + 1000
        # Seen as it was first stored: same topic, queue, offset and id; one more attempt.
        assert (again.topic, again.queue, again.offset) == (TOPIC, 0, 0)
        assert again.message_id == sent.message_id
        assert (again.value, again.key, again.tag) == (b"job", b"k", "t")
        assert again.delivery_attempt == 2
        assert again.headers["h"] == b"1"
        assert again.headers["tidemq.retry.topic"] == TOPIC.encode()
        assert again.headers["tidemq.retry.attempts"] == b"1"
        assert again.headers["tidemq.retry.error"] == b"db down"
        await again.ack()
        assert await c.receive(1) == []
        # The retry topic is an ordinary topic: the copy is there to read.
        (copy,) = await _read_all(broker.address, RETRY)
        assert copy.value == b"job"
        assert copy.headers["tidemq.retry.message_id"] == sent.message_id.encode()
        async with aio.Admin(broker.address) as admin:
            statuses = {s.topic: s for s in await admin.pop_status(GROUP)}
        assert statuses[RETRY].acked_below == 1
        await c.close()

    loop.run(main())


def test_retries_keep_the_first_location_and_dead_letter_at_the_last_attempt(
    loop: Loop, broker: BrokerEnv
) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            await admin.create_topic(TOPIC, 1)
        async with aio.Producer(broker.address) as producer:
            delayed = await producer.send(TOPIC, b"later", delay=0.2)
        c = _consumer(broker.address, max_attempts=3)
        seen = []
        for attempt in (1, 2, 3):
            (m,) = await _receive_n(c, 1)
            assert (m.value, m.delivery_attempt) == (b"later", attempt)
            assert m.message_id == delayed.message_id  # a delayed message's id, kept
            seen.append((m.topic, m.queue, m.offset))
            await m.nack(reason=f"fail {attempt}")
        assert len(set(seen)) == 1
        # The third nack was the last attempt: straight to the DLQ, not retried again.
        assert await c.receive(1) == []
        (dead,) = await _read_all(broker.address, "%DLQ%workers")
        h = dead.headers
        assert (h["tidemq.dlq.topic"], h["tidemq.dlq.offset"]) == (TOPIC.encode(), b"0")
        assert h["tidemq.dlq.message_id"] == delayed.message_id.encode()
        assert (h["tidemq.dlq.attempts"], h["tidemq.dlq.error"]) == (b"3", b"fail 3")
        assert not [k for k in h if k.startswith("tidemq.retry.")]
        async with aio.Admin(broker.address) as admin:
            statuses = {s.topic: s for s in await admin.pop_status(GROUP)}
        assert statuses[TOPIC].retried == 1
        assert statuses[RETRY].retried == 1  # the copy was retried once more
        assert statuses[RETRY].dead_lettered == 1
        await c.close()

    loop.run(main())


def test_a_fifo_topic_retries_in_place(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            await admin.create_topic("fifo", 1, message_type="FIFO")
        async with aio.Producer(broker.address) as producer:
            await producer.send("fifo", b"a-0", key=b"a")
            await producer.send("fifo", b"a-1", key=b"a")
        c = _consumer(broker.address, subscriptions={"fifo": "*"})
        (m,) = await c.receive(2)
        await m.nack(reason="again")
        (m,) = await c.receive(2)  # at once, in place: a-1 still waits behind it
        assert (m.value, m.delivery_attempt, m.topic) == (b"a-0", 2, "fifo")
        await m.ack()
        (m,) = await c.receive(2)
        assert m.value == b"a-1"
        await m.ack()
        async with aio.Admin(broker.address) as admin:
            assert RETRY not in [t.name for t in await admin.list_topics()]
        await c.close()

    loop.run(main())


def test_a_pending_retry_survives_a_restart(loop: Loop, start_broker: StartBroker) -> None:
    env = start_broker(service_checkpoint_interval_ms=100)

    async def before() -> str:
        async with aio.Admin(env.address) as admin:
            await admin.create_topic(TOPIC, 1)
        async with aio.Producer(env.address) as producer:
            await producer.send(TOPIC, b"a")
            await producer.send(TOPIC, b"b")
        c = _consumer(env.address)
        got = await c.receive(2)
        assert len(got) == 2
        await got[0].nack(delay=1.5)
        await got[1].ack()
        await c.close()
        return got[0].message_id

    message_id = loop.run(before())
    loop.run(env.broker.stop())
    restarted = Broker(env.broker.config, embedded_nameserver=True)
    address = loop.run(restarted.start())

    async def after() -> None:
        c = _consumer(address)
        (m,) = await _receive_n(c, 1)
        assert (m.value, m.message_id, m.delivery_attempt) == (b"a", message_id, 2)
        await m.ack()
        assert await _receive_n(c, 1, timeout=1.0) == []  # once, not also from the original
        await c.close()

    try:
        loop.run(after())
    finally:
        loop.run(restarted.stop())


def test_a_suspended_retry_is_listed_and_resumed_by_its_first_id(
    loop: Loop, broker: BrokerEnv
) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            await admin.create_topic(TOPIC, 1)
        async with aio.Producer(broker.address) as producer:
            sent = await producer.send(TOPIC, b"x")
        c = _consumer(broker.address, max_attempts=2, on_exhausted="suspend")
        (m,) = await c.receive(1)
        await m.nack(reason="one")
        (m,) = await _receive_n(c, 1)  # from the retry topic
        await m.nack(reason="two")  # the last attempt: suspended there
        assert await c.receive(1) == []
        async with aio.Admin(broker.address) as admin:
            statuses = {s.topic: s for s in await admin.pop_status(GROUP)}
            (suspended,) = statuses[RETRY].suspended
            assert (suspended.message_id, suspended.attempts) == (sent.message_id, 2)
            assert suspended.error == "two"
            await admin.resume(GROUP, sent.message_id)
        (m,) = await _receive_n(c, 1)
        assert (m.value, m.message_id, m.delivery_attempt) == (b"x", sent.message_id, 1)
        await m.ack()
        await c.close()

    loop.run(main())


def test_pop_group_names_must_fit_their_retry_topic(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            await admin.create_topic(TOPIC, 1)
        for bad in ("has space", "x" * 121, "per%cent"):
            # Refused at the call (the broker's own check: test_wrong_input.py).
            with pytest.raises(ValueError, match="group"):
                AsyncSimpleConsumer(broker.address, bad, {TOPIC: "*"}, await_duration=0.0)

    loop.run(main())
