"""Pop consumption (`SimpleConsumer`) against a real broker: shared queues, leases,
redelivery, ack / nack / release / change of invisible duration, stale and foreign
handles, filters, dead letters, limits, and a broker restart."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest

from tidemq import aio
from tidemq.broker.broker import Broker
from tidemq.client.simple_consumer import AsyncReceivedMessage, AsyncSimpleConsumer, Sql92
from tidemq.core.errors import InvalidRequest
from tidemq.core.filters import FilterSyntaxError

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop, StartBroker

pytestmark = pytest.mark.timeout(120)

TOPIC = "jobs"


async def _setup(address: str, count: int, queues: int = 2, **send: object) -> None:
    async with aio.Admin(address) as admin:
        await admin.create_topic(TOPIC, queues)
    async with aio.Producer(address) as producer:
        for i in range(count):
            await producer.send(TOPIC, b"job-%d" % i, queue=i % queues, **send)  # type: ignore[arg-type]


def _consumer(address: str, group: str = "workers", **kw: object) -> AsyncSimpleConsumer:
    options: dict[str, object] = {"await_duration": 0.3, **kw}
    subs = options.pop("subscriptions", {TOPIC: "*"})
    return AsyncSimpleConsumer(address, group, subs, **options)  # type: ignore[arg-type]


async def _drain(consumer: AsyncSimpleConsumer, *, ack: bool = True) -> list[AsyncReceivedMessage]:
    out: list[AsyncReceivedMessage] = []
    while batch := await consumer.receive(32, invisible_duration=30.0):
        out.extend(batch)
        if ack:
            await consumer.ack_many(batch)
    return out


async def _receive_n(
    consumer: AsyncSimpleConsumer, n: int, timeout: float = 10.0, **kw: object
) -> list[AsyncReceivedMessage]:
    """Receive until `n` messages came (retries arrive through the timer, one by one)."""
    out: list[AsyncReceivedMessage] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += await consumer.receive(n - len(out), **kw)  # type: ignore[arg-type]
    return out


def test_consumers_share_queues_and_each_message_goes_to_one(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _setup(broker.address, 200)
        a, b = _consumer(broker.address), _consumer(broker.address)
        got_a, got_b = await asyncio.gather(_drain(a), _drain(b))
        values = [m.value or b"" for m in got_a + got_b]
        assert sorted(values) == sorted(b"job-%d" % i for i in range(200))  # once each
        assert {m.delivery_attempt for m in got_a + got_b} == {1}
        assert await a.receive(10) == []  # all acked: nothing comes back
        # Another group gets every message again, independently.
        c = _consumer(broker.address, group="auditors")
        assert len(await _drain(c)) == 200
        for x in (a, b, c):
            await x.close()

    loop.run(main())


def test_unacked_messages_come_back_after_their_lease(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _setup(broker.address, 3, queues=1)
        c = _consumer(broker.address)
        first = await c.receive(3, invisible_duration=1.0)
        assert [m.value for m in first] == [b"job-0", b"job-1", b"job-2"]
        await first[0].ack()
        assert await c.receive(3, invisible_duration=1.0) == []  # still leased
        t0 = time.monotonic()
        again: list[AsyncReceivedMessage] = []
        while len(again) < 2:
            again += await c.receive(3, invisible_duration=5.0)
        assert 0.5 < time.monotonic() - t0 < 1.0 + 2.0  # late by at most 2 s
        assert sorted(m.value or b"" for m in again) == [b"job-1", b"job-2"]
        assert {m.delivery_attempt for m in again} == {2}
        with pytest.raises(InvalidRequest, match="stale handle"):
            await first[1].ack()  # the first lease's handle: the message was redelivered
        with pytest.raises(InvalidRequest, match="already acknowledged"):
            await first[0].ack()
        await c.ack_many(again)
        other = _consumer(broker.address, group="other")
        with pytest.raises(InvalidRequest, match="another group"):
            await other.ack(again[0])  # a foreign handle
        await c.close()
        await other.close()

    loop.run(main())


def test_nack_release_and_change_invisible(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _setup(broker.address, 1, queues=1)
        c = _consumer(broker.address)
        [m] = await c.receive(1)
        await m.release()  # back at once, the delivery not counted
        [m] = await c.receive(1)
        assert m.delivery_attempt == 1
        await m.nack(delay=1.0, reason="try later")  # counted
        assert await c.receive(1) == []  # waits 0.3 s: not yet
        await asyncio.sleep(0.8)
        [m] = await c.receive(1)
        assert m.delivery_attempt == 2
        longer = await m.change_invisible_duration(120.0)
        assert longer.handle != m.handle
        assert longer.invisible_until_ms > m.invisible_until_ms
        with pytest.raises(InvalidRequest, match="stale handle"):
            await m.ack()
        await longer.ack()
        with pytest.raises(ValueError, match="1 to 43200 seconds"):
            await c.receive(1, invisible_duration=0.5)
        await c.close()

    loop.run(main())


def test_tag_and_sql92_filters(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            await admin.create_topic(TOPIC, 1)
        async with aio.Producer(broker.address) as producer:
            for i in range(30):
                await producer.send(
                    TOPIC,
                    b"m%d" % i,
                    tag=("paid", "shipped", "cancelled")[i % 3],
                    headers={"region": b"eu" if i % 2 else b"us", "amount": b"%d" % (i * 10)},
                )
        tags = _consumer(broker.address, "t", subscriptions={TOPIC: "paid || shipped"})
        got = await _drain(tags)
        assert sorted(m.value or b"" for m in got) == sorted(
            b"m%d" % i for i in range(30) if i % 3 != 2
        )
        sql = _consumer(
            broker.address, "s", subscriptions={TOPIC: Sql92("region = 'eu' AND amount > 150")}
        )
        got = await _drain(sql)
        assert sorted(m.value or b"" for m in got) == sorted(
            b"m%d" % i for i in range(30) if i % 2 and i * 10 > 150
        )
        with pytest.raises(FilterSyntaxError, match="column"):
            _consumer(broker.address, "x", subscriptions={TOPIC: Sql92("region = ")})
        with pytest.raises(FilterSyntaxError):
            _consumer(broker.address, "x", subscriptions={TOPIC: "a || "})
        for c in (tags, sql):
            await c.close()

    loop.run(main())


def test_dead_letters_after_max_attempts(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _setup(broker.address, 2, queues=1)
        c = _consumer(broker.address, max_attempts=2)
        for attempt in (1, 2):
            batch = await _receive_n(c, 2)
            assert len(batch) == 2
            assert [m.delivery_attempt for m in batch] == [attempt, attempt]
            assert {m.topic for m in batch} == {TOPIC}  # a retry shows where it came from
            for m in batch:
                await m.nack(reason="handler failed")
        # The second nack was their last attempt: dead-lettered at once, not retried.
        assert await c.receive(2) == []
        dlq = aio.StreamConsumer(broker.address, start="earliest")
        dlq.assign([("%DLQ%workers", 0)])
        dead: list[aio.Message] = []
        deadline = time.monotonic() + 10
        while len(dead) < 2 and time.monotonic() < deadline:
            dead += await dlq.poll(300)
        dead += await dlq.poll(200)
        await dlq.close()
        assert sorted(m.value or b"" for m in dead) == [b"job-0", b"job-1"]  # once each
        h = dead[0].headers
        assert h["tidemq.dlq.topic"] == TOPIC.encode()
        assert h["tidemq.dlq.attempts"] == b"2"
        assert h["tidemq.dlq.error"] == b"handler failed"
        await c.close()

    loop.run(main())


def test_leases_and_acks_survive_a_restart(loop: Loop, start_broker: StartBroker) -> None:
    env = start_broker(service_checkpoint_interval_ms=100)

    async def before() -> None:
        await _setup(env.address, 10, queues=1)
        c = _consumer(env.address)
        batch = await c.receive(6, invisible_duration=2.0)
        assert len(batch) == 6
        await c.ack_many(batch[:3])
        await c.close()

    loop.run(before())
    loop.run(env.broker.stop())
    restarted = Broker(env.broker.config, embedded_nameserver=True)
    address = loop.run(restarted.start())

    async def after() -> None:
        c = _consumer(address)
        fresh = await _drain(c)  # the 4 never leased; the 3 leased are still invisible
        assert sorted(m.value or b"" for m in fresh) == [b"job-%d" % i for i in range(6, 10)]
        await asyncio.sleep(2.0)
        back = await _drain(c)
        assert sorted(m.value or b"" for m in back) == [b"job-3", b"job-4", b"job-5"]
        assert {m.delivery_attempt for m in back} == {2}
        await c.close()

    try:
        loop.run(after())
    finally:
        loop.run(restarted.stop())


def test_fifo_groups_are_delivered_in_order_one_at_a_time(
    loop: Loop, start_broker: StartBroker
) -> None:
    env = start_broker(service_checkpoint_interval_ms=100)

    async def before() -> None:
        async with aio.Admin(env.address) as admin:
            await admin.create_topic("fifo", 1, message_type="FIFO")
        async with aio.Producer(env.address) as producer:
            for i in range(4):
                for g in (b"g1", b"g2", b"g3"):
                    await producer.send("fifo", g + b"-%d" % i, key=g, queue=0)
        c = _consumer(env.address, subscriptions={"fifo": "*"}, max_attempts=2)
        first = await c.receive(10)
        # One message per group: each group's first; the rest wait behind them.
        assert sorted(m.value or b"" for m in first) == [b"g1-0", b"g2-0", b"g3-0"]
        assert await c.receive(10) == []
        by = {m.key: m for m in first}
        await by[b"g1"].ack()
        await by[b"g2"].nack(reason="poison")  # g2 is stuck; g1 and g3 go on
        got = await c.receive(10)
        assert sorted(m.value or b"" for m in got) == [b"g1-1", b"g2-0"]
        for m in got:
            if m.key == b"g2":
                await m.nack(reason="poison again")  # second attempt: next stop, the DLQ
            else:
                await m.ack()
        await by[b"g3"].ack()
        await c.close()

    loop.run(before())
    loop.run(env.broker.stop())  # FIFO state survives a restart
    restarted = Broker(env.broker.config, embedded_nameserver=True)
    address = loop.run(restarted.start())

    async def after() -> None:
        c = _consumer(address, subscriptions={"fifo": "*"}, max_attempts=2)
        order: dict[bytes, list[bytes]] = {b"g1": [b"g1-0", b"g1-1"], b"g2": [], b"g3": [b"g3-0"]}
        deadline = time.monotonic() + 20
        while sum(map(len, order.values())) < 11 and time.monotonic() < deadline:
            batch = await c.receive(10)
            keys = [m.key for m in batch]
            assert len(keys) == len(set(keys))  # never two of one group at once
            for m in batch:
                order[m.key or b""].append(m.value or b"")
                await m.ack()
        assert order[b"g1"] == [b"g1-0", b"g1-1", b"g1-2", b"g1-3"]
        assert order[b"g3"] == [b"g3-0", b"g3-1", b"g3-2", b"g3-3"]
        assert order[b"g2"] == [b"g2-1", b"g2-2", b"g2-3"]  # g2-0 went to the DLQ
        await c.close()

    try:
        loop.run(after())
    finally:
        loop.run(restarted.stop())


def test_fifo_suspend_holds_the_group_until_resumed(loop: Loop, start_broker: StartBroker) -> None:
    env = start_broker(service_checkpoint_interval_ms=100)

    async def before() -> str:
        async with aio.Admin(env.address) as admin:
            await admin.create_topic("fifo", 1, message_type="FIFO")
        async with aio.Producer(env.address) as producer:
            for i in range(3):
                for g in (b"g1", b"g2"):
                    await producer.send("fifo", g + b"-%d" % i, key=g, queue=0)
        c = _consumer(
            env.address, subscriptions={"fifo": "*"}, max_attempts=2, on_exhausted="suspend"
        )
        for attempt in (1, 2):  # g1-0 fails twice; g2 goes on meanwhile
            batch = await c.receive(10)
            by = {m.key: m for m in batch}
            assert by[b"g1"].value == b"g1-0"
            assert by[b"g1"].delivery_attempt == attempt
            await by[b"g1"].nack(reason=f"bad row {attempt}")
            await by[b"g2"].ack()
        # g1-0 is suspended: neither it nor the rest of g1 comes, g2 finishes.
        rest = await _drain(c)
        assert [m.value for m in rest] == [b"g2-2"]
        async with aio.Admin(env.address) as admin:
            (status,) = await admin.pop_status("workers")
        assert status.topic == "fifo"
        (suspended,) = status.suspended
        assert (suspended.offset, suspended.attempts, suspended.error) == (0, 2, "bad row 2")
        assert status.dead_lettered == 0
        await c.close()
        return suspended.message_id

    message_id = loop.run(before())
    loop.run(env.broker.stop())  # suspension survives a restart
    restarted = Broker(env.broker.config, embedded_nameserver=True)
    address = loop.run(restarted.start())

    async def after() -> None:
        c = _consumer(address, subscriptions={"fifo": "*"}, max_attempts=2, on_exhausted="suspend")
        assert await c.receive(10) == []  # still suspended
        async with aio.Admin(address) as admin:
            (status,) = await admin.pop_status("workers")
            assert [s.message_id for s in status.suspended] == [message_id]
            with pytest.raises(ValueError, match="action"):
                await admin.resume("workers", message_id, action="skip")
            with pytest.raises(InvalidRequest, match="no suspended message"):
                await admin.resume("other-group", message_id)
            done = await admin.resume("workers", message_id)  # retry, attempts from zero
            assert (done.topic, done.queue, done.offset) == ("fifo", 0, 0)
            with pytest.raises(InvalidRequest, match="no suspended message"):
                await admin.resume("workers", message_id)  # not suspended any more
            (again,) = await c.receive(10)
            assert (again.value, again.delivery_attempt) == (b"g1-0", 1)
            await again.nack(reason="still bad")
            (again,) = await c.receive(10)
            await again.nack(reason="still bad")
            assert await c.receive(10) == []  # suspended a second time
            await admin.resume("workers", message_id, action="dead-letter")
            rest = await _drain(c)  # g1 moves on without g1-0
            assert [m.value for m in rest] == [b"g1-1", b"g1-2"]
            (status,) = await admin.pop_status("workers")
            assert (status.dead_lettered, status.suspended) == (1, ())
        await c.close()

    try:
        loop.run(after())
    finally:
        loop.run(restarted.stop())


def test_on_exhausted_is_checked(loop: Loop, broker: BrokerEnv) -> None:
    with pytest.raises(ValueError, match="on_exhausted"):
        _consumer(broker.address, on_exhausted="drop")
