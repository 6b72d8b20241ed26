"""Delay/timer messages against a real broker: never early, delivered once with the id the
send returned, cancel before and after delivery, one maximum delay, typed topics, status,
and survival of a broker restart."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest

from tidemq import aio
from tidemq.broker.broker import Broker
from tidemq.core.errors import (
    AlreadyDelivered,
    DelayTooLong,
    MessageTypeMismatch,
    UnknownMessage,
)
from tidemq.core.message import message_id
from tidemq.core.properties import TIMER_TOPIC

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop, StartBroker

pytestmark = pytest.mark.timeout(120)

TOPIC = "jobs"


async def _create(
    address: str, topic: str = TOPIC, queues: int = 2, message_type: str = "MIXED"
) -> None:
    async with aio.Admin(address) as admin:
        await admin.create_topic(topic, queues, message_type=message_type)


async def _read_all(
    address: str, topic: str, queues: int, count: int, timeout_s: float = 20.0
) -> list[tuple[float, aio.Message]]:
    """(arrival time, message) for `count` messages, then a short wait for extra ones."""
    consumer = aio.StreamConsumer(address, start="earliest")
    consumer.assign([(topic, q) for q in range(queues)])
    out: list[tuple[float, aio.Message]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < count:
            assert time.monotonic() < deadline, f"got {len(out)} of {count} messages"
            for m in await consumer.poll(200):
                out.append((time.time(), m))
        for m in await consumer.poll(300):
            out.append((time.time(), m))
    finally:
        await consumer.close()
    return out


def test_delayed_messages_arrive_on_time_never_early(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address)
        async with aio.Producer(broker.address) as producer:
            sent_at = time.time()
            r1 = await producer.send(TOPIC, b"in-0.6s", delay=0.6, key=b"k", tag="t1")
            await producer.send(
                TOPIC, b"at-0.3s", deliver_at=datetime.now(UTC) + timedelta(seconds=0.3), queue=1
            )
            r3 = await producer.send(TOPIC, b"past", deliver_at=time.time() - 100, queue=0)
            batch = await producer.send_batch(
                TOPIC, [b"b0", b"b1", b"b2"], delay=timedelta(milliseconds=400), queue=0
            )
            plain = await producer.send(TOPIC, b"now", queue=0)
        assert r1.offset == -1
        assert r1.origin is not None
        # The broker's timer topic, named with the broker: ids differ between brokers.
        assert r1.origin[0] == f"{TIMER_TOPIC}@{broker.broker.config.broker_name}"
        assert plain.origin is None
        assert plain.offset >= 0
        got = await _read_all(broker.address, TOPIC, 2, 7)
        by_value = {m.value: (t, m) for t, m in got}
        assert len(got) == 7, [m.value for _, m in got]  # each delivered exactly once
        due = {b"in-0.6s": 0.6, b"at-0.3s": 0.3, b"past": 0.0, b"b0": 0.4}
        for value, delay in due.items():
            arrived, _ = by_value[value]
            # Never early (10 ms of slack for clock reads on either side).
            assert arrived >= sent_at + delay - 0.01, (value, arrived - sent_at)
        m1 = by_value[b"in-0.6s"][1]
        assert (m1.key, m1.tag, m1.message_id) == (b"k", "t1", r1.message_id)
        assert m1.deliver_at_ms >= int((sent_at + 0.6) * 1000) - 10  # the scheduled time
        assert by_value[b"now"][1].deliver_at_ms == 0
        assert by_value[b"at-0.3s"][1].queue == 1
        assert [by_value[v][1].message_id for v in (b"b0", b"b1", b"b2")] == [
            r.message_id for r in batch
        ]
        offsets = [by_value[v][1].offset for v in (b"b0", b"b1", b"b2")]
        assert offsets == list(range(offsets[0], offsets[0] + 3))  # still one batch
        assert by_value[b"past"][1].message_id == r3.message_id

    loop.run(main())


def test_cancel_before_and_after_delivery(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address)
        async with aio.Producer(broker.address) as producer:
            doomed = await producer.send(TOPIC, b"cancel-me", delay=30.0, queue=0)
            kept = await producer.send(TOPIC, b"keep-me", delay=0.2, queue=0)
            answer = await producer.cancel(doomed.message_id)
            assert (answer.topic, answer.count) == (TOPIC, 1)
            with pytest.raises(AlreadyDelivered, match="already delivered or cancelled"):
                await producer.cancel(doomed.message_id)
            got = await _read_all(broker.address, TOPIC, 2, 1)
            assert [m.value for _, m in got] == [b"keep-me"]
            with pytest.raises(AlreadyDelivered):
                await producer.cancel(kept.message_id)
            plain = await producer.send(TOPIC, b"plain", queue=0)
            with pytest.raises(UnknownMessage, match="not the id of a delayed message"):
                await producer.cancel(plain.message_id)
            with pytest.raises(UnknownMessage, match="28 hex digits"):
                await producer.cancel("nonsense")
            far = doomed.origin
            assert far is not None
            with pytest.raises(UnknownMessage, match="no delayed message"):
                await producer.cancel(message_id(far[0], 0, far[2] + 1000))

    loop.run(main())


def test_a_second_cancel_after_the_checkpoint_trimmed_the_batch(
    loop: Loop, start_broker: StartBroker
) -> None:
    # The checkpoint trims the timer topic up to its first pending batch, so the cancelled
    # batch is gone from the log: the answer must still be "already cancelled", not
    # "unknown" (CI once saw the checkpoint land between two cancels).
    env = start_broker(service_checkpoint_interval_ms=50)

    async def main() -> None:
        await _create(env.address)
        async with aio.Producer(env.address) as producer:
            first = await producer.send(TOPIC, b"first", delay=600.0, queue=0)
            await producer.send(TOPIC, b"second", delay=900.0, queue=0)
            await producer.cancel(first.message_id)
            assert first.origin is not None
            deadline = time.monotonic() + 10
            store = env.broker._gateway.store
            while store.queue_bounds(TIMER_TOPIC, 0)[0] <= first.origin[2]:
                assert time.monotonic() < deadline, "the checkpoint never trimmed the batch"
                await asyncio.sleep(0.05)
            with pytest.raises(AlreadyDelivered, match="already delivered or cancelled"):
                await producer.cancel(first.message_id)

    loop.run(main())


def test_a_cancel_racing_the_delivery_is_never_answered_cancelled(
    loop: Loop, broker: BrokerEnv
) -> None:
    """Messages due at once, cancelled at once: each cancel either wins (the message is
    never delivered) or says AlreadyDelivered (it is delivered once), never both."""

    async def main() -> None:
        await _create(broker.address, queues=1)
        cancelled: set[bytes] = set()
        delivered: set[bytes] = set()
        async with aio.Producer(broker.address) as producer:
            for i in range(40):
                value = b"race-%d" % i
                sent = await producer.send(TOPIC, value, delay=0.0, queue=0)
                try:
                    await producer.cancel(sent.message_id)
                    cancelled.add(value)
                except AlreadyDelivered:
                    delivered.add(value)
        got = await _read_all(broker.address, TOPIC, 1, len(delivered), timeout_s=10)
        values = [m.value or b"" for _, m in got]
        assert sorted(values) == sorted(delivered)  # once each, and no cancelled one

    loop.run(main())


def test_limits_and_message_types(loop: Loop, start_broker: StartBroker) -> None:
    env = start_broker(max_delay_ms=60_000)

    async def main() -> None:
        await _create(env.address)
        await _create(env.address, "plain-only", message_type="NORMAL")
        await _create(env.address, "delay-only", message_type="DELAY")
        async with aio.Producer(env.address) as producer:
            with pytest.raises(DelayTooLong, match="maximum delay is 60 s"):
                await producer.send(TOPIC, b"x", delay=61.0)
            with pytest.raises(DelayTooLong):
                await producer.send_batch(TOPIC, [b"x"], deliver_at=time.time() + 3600)
            with pytest.raises(ValueError, match="not both"):
                await producer.send(TOPIC, b"x", delay=1.0, deliver_at=time.time())
            with pytest.raises(ValueError, match=r"deliver_at .* naive datetime"):
                await producer.send(TOPIC, b"x", deliver_at=datetime(2030, 1, 1))
            with pytest.raises(ValueError, match=r"delay must be 0 to .* seconds, got -1\.0"):
                await producer.send(TOPIC, b"x", delay=-1.0)
            with pytest.raises(MessageTypeMismatch, match=r"message\.type NORMAL; a delayed"):
                await producer.send("plain-only", b"x", delay=1.0)
            with pytest.raises(MessageTypeMismatch, match="DELAY; an ordinary message"):
                await producer.send("delay-only", b"x", queue=0)
            await producer.send("delay-only", b"ok", delay=0.05, queue=0)
        got = await _read_all(env.address, "delay-only", 2, 1)
        assert [m.value for _, m in got] == [b"ok"]

    loop.run(main())


def test_status_counts_pending_timers(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address)
        await _create(broker.address, "other")
        async with aio.Producer(broker.address) as producer:
            r = await producer.send(TOPIC, b"a", delay=60.0)
            await producer.send_batch(TOPIC, [b"b", b"c"], delay=120.0)
            await producer.send("other", b"d", delay=30.0)
            async with aio.Admin(broker.address) as admin:
                status = await admin.timer_status()
                rows = {t.topic: t for t in status.topics}
                assert (rows[TOPIC].pending_batches, rows[TOPIC].pending_messages) == (2, 3)
                assert rows["other"].pending_messages == 1
                assert rows["other"].next_due_ms < rows[TOPIC].next_due_ms
                assert status.max_delay_ms == 7 * 24 * 3600 * 1000
                await producer.cancel(r.message_id)
                status = await admin.timer_status(TOPIC)
                assert [(t.topic, t.pending_messages) for t in status.topics] == [(TOPIC, 2)]
                assert status.cancelled_batches == 1

    loop.run(main())


def test_pending_timers_survive_a_restart(loop: Loop, start_broker: StartBroker) -> None:
    env = start_broker(service_checkpoint_interval_ms=100)

    async def main() -> dict[bytes, str]:
        await _create(env.address)
        ids: dict[bytes, str] = {}
        async with aio.Producer(env.address) as producer:
            for i in range(20):
                r = await producer.send(TOPIC, b"d%d" % i, delay=0.2 + 0.1 * i, queue=i % 2)
                ids[b"d%d" % i] = r.message_id
            gone = await producer.send(TOPIC, b"cancelled", delay=1.0, queue=0)
            await producer.cancel(gone.message_id)
        return ids

    ids = loop.run(main())
    time.sleep(0.5)  # some are delivered before the stop, most after the restart
    loop.run(env.broker.stop())
    restarted = Broker(env.broker.config, embedded_nameserver=True)
    address = loop.run(restarted.start())
    try:

        async def check() -> None:
            got = await _read_all(address, TOPIC, 2, 20, timeout_s=30)
            values = sorted(m.value or b"" for _, m in got)
            assert values == sorted(ids)  # all 20, once each, and not the cancelled one
            assert {m.value: m.message_id for _, m in got} == ids

        loop.run(check())
    finally:
        loop.run(restarted.stop())


def test_delays_beyond_the_wheel_window_roll_over(loop: Loop, start_broker: StartBroker) -> None:
    # A wheel of 4 slots of 50 ms covers 200 ms: these wait outside it and roll in.
    env = start_broker(timer_wheel_slots=4, timer_precision_ms=50)

    async def main() -> None:
        await _create(env.address)
        sent_at = time.time()
        async with aio.Producer(env.address) as producer:
            for i, delay in enumerate((0.9, 0.5, 1.3, 0.05)):
                await producer.send(TOPIC, b"%d" % i, delay=delay, queue=0)
        got = await _read_all(env.address, TOPIC, 1, 4)
        assert [m.value for _, m in got] == [b"3", b"1", b"0", b"2"]  # in due order
        for (arrived, m), delay in zip(got, (0.05, 0.5, 0.9, 1.3), strict=True):
            assert arrived >= sent_at + delay - 0.01, m.value

    loop.run(main())
