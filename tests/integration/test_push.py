"""Push consumption (`PushConsumer`), the sync `SimpleConsumer`, and dead letters (list
and redrive through `Admin`) against a real broker: bounded concurrency, retries with
backoff, dead letters once each with the error, lease extension for slow handlers,
handler timeouts."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from typing import TYPE_CHECKING

import pytest

import tidemq
from tidemq import aio
from tidemq.client.admin import REDRIVEN_FROM_HEADER, dlq_topic

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, ClusterEnv, Loop, ThreadedBroker

pytestmark = pytest.mark.timeout(60)

TOPIC = "work"
FAST = aio.RetryPolicy.fixed(0.1)


async def _setup(address: str, values: list[bytes], queues: int = 2, **send: object) -> None:
    async with aio.Admin(address) as admin:
        await admin.create_topic(TOPIC, queues)
    async with aio.Producer(address) as producer:
        for i, v in enumerate(values):
            await producer.send(TOPIC, v, queue=i % queues, **send)  # type: ignore[arg-type]


async def _wait_for(predicate: object, timeout_s: float = 15.0, what: str = "condition") -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _push(address: str, handler: object, group: str = "g", **kw: object) -> aio.PushConsumer:
    options: dict[str, object] = {"await_duration": 0.2, "retry_policy": FAST, **kw}
    return aio.PushConsumer(address, group, {TOPIC: "*"}, handler, **options)  # type: ignore[arg-type]


async def _dead(address: str, group: str, count: int) -> list[aio.Message]:
    """Wait until `group` has `count` dead letters; return them."""
    async with aio.Admin(address) as admin:
        deadline = time.monotonic() + 15
        while True:
            letters = await admin.dead_letters(group)
            if len(letters) >= count or time.monotonic() > deadline:
                return letters
            await asyncio.sleep(0.05)


def test_every_message_once_and_never_more_than_max_concurrency(
    loop: Loop, broker: BrokerEnv
) -> None:
    async def main() -> None:
        values = [b"m-%d" % i for i in range(60)]
        await _setup(broker.address, values)
        seen: list[bytes] = []
        running = peak = 0

        async def handler(msg: aio.ReceivedMessage) -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.03)
            running -= 1
            seen.append(msg.value or b"")

        async with _push(broker.address, handler, max_concurrency=4):
            await _wait_for(lambda: len(seen) >= 60, what="60 messages")
            await asyncio.sleep(0.3)  # nothing more comes
        assert sorted(seen) == sorted(values)  # each once
        assert peak == 4  # the limit was reached and never passed
        check = aio.SimpleConsumer(broker.address, "g", {TOPIC: "*"}, await_duration=0.2)
        assert await check.receive(10) == []  # all acknowledged
        await check.close()

    loop.run(main())


def test_max_concurrency_holds_with_two_brokers(loop: Loop, cluster: ClusterEnv) -> None:
    """A receive asks every broker for at least one message, so with one free slot and two
    brokers it may bring two: the extra one is released, not handled."""

    async def main() -> None:
        values = [b"c-%d" % i for i in range(12)]
        await _setup(cluster.bootstrap, values)  # queue 0 on one broker, queue 1 on the other
        seen: list[bytes] = []
        running = peak = 0

        async def handler(msg: aio.ReceivedMessage) -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1
            seen.append(msg.value or b"")

        async with _push(cluster.bootstrap, handler, max_concurrency=1):
            await _wait_for(lambda: len(seen) >= 12, what="12 messages")
            await asyncio.sleep(0.3)
        assert sorted(seen) == sorted(values)
        assert peak == 1

    loop.run(main())


def test_failures_are_retried_with_the_policy_until_they_succeed(
    loop: Loop, broker: BrokerEnv
) -> None:
    async def main() -> None:
        await _setup(broker.address, [b"a", b"b", b"c"])
        attempts: dict[bytes, list[int]] = defaultdict(list)
        times: dict[bytes, list[float]] = defaultdict(list)

        async def handler(msg: aio.ReceivedMessage) -> None:
            attempts[msg.value or b""].append(msg.delivery_attempt)
            times[msg.value or b""].append(time.monotonic())
            if msg.delivery_attempt < 3:
                raise RuntimeError(f"not yet ({msg.delivery_attempt})")

        policy = aio.RetryPolicy.schedule([0.2, 0.4])
        async with _push(broker.address, handler, retry_policy=policy):
            await _wait_for(lambda: sum(map(len, attempts.values())) >= 9, what="9 deliveries")
            await asyncio.sleep(0.3)
        assert dict(attempts) == {b"a": [1, 2, 3], b"b": [1, 2, 3], b"c": [1, 2, 3]}
        for t in times.values():  # the backoff was waited (and not much more)
            assert 0.2 <= t[1] - t[0] < 2.2
            assert 0.4 <= t[2] - t[1] < 2.4
        assert await _dead(broker.address, "g", 0) == []

    loop.run(main())


def test_a_message_that_always_fails_is_dead_lettered_once_with_its_error(
    loop: Loop, broker: BrokerEnv
) -> None:
    async def main() -> None:
        values = [b"bad-%d" % i for i in range(4)]
        await _setup(broker.address, values)
        calls: dict[bytes, list[int]] = defaultdict(list)

        def handler(msg: aio.ReceivedMessage) -> None:  # a plain function: worker thread
            calls[msg.value or b""].append(msg.delivery_attempt)
            raise ValueError(f"cannot handle {msg.value!r}")

        async with _push(broker.address, handler, max_attempts=3):
            dead = await _dead(broker.address, "g", 4)
            await asyncio.sleep(0.5)  # no second copy, no more deliveries
            dead = await _dead(broker.address, "g", 4)
        assert sorted(m.value or b"" for m in dead) == sorted(values)  # once each
        assert dict(calls) == {v: [1, 2, 3] for v in values}
        for m in dead:
            h = m.headers
            assert h["tidemq.dlq.topic"] == TOPIC.encode()
            assert h["tidemq.dlq.attempts"] == b"3"
            assert h["tidemq.dlq.error"] == repr(ValueError(f"cannot handle {m.value!r}")).encode()
        assert {m.topic for m in dead} == {dlq_topic("g")}

    loop.run(main())


def test_a_slow_handler_keeps_its_lease(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _setup(broker.address, [b"slow"], queues=1)
        calls: list[int] = []
        done = asyncio.Event()

        async def handler(msg: aio.ReceivedMessage) -> None:
            calls.append(msg.delivery_attempt)
            await asyncio.sleep(2.5)  # 2.5 leases of 1 s
            done.set()

        # Two consumers of the group: had the lease run out, the other would get it.
        a = _push(broker.address, handler, invisible_duration=1.0)
        b = _push(broker.address, handler, invisible_duration=1.0)
        async with a, b:
            await asyncio.wait_for(done.wait(), 10)
            await asyncio.sleep(0.3)
        assert calls == [1]  # processed once, never redelivered
        check = aio.SimpleConsumer(broker.address, "g", {TOPIC: "*"}, await_duration=0.2)
        assert await check.receive(1) == []  # and acknowledged with the newest handle
        await check.close()

    loop.run(main())


def test_a_handler_timeout_counts_as_a_failure(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _setup(broker.address, [b"once-slow", b"always-slow"], queues=1)
        calls: dict[bytes, list[int]] = defaultdict(list)
        cancelled: list[bytes] = []

        async def handler(msg: aio.ReceivedMessage) -> None:
            value = msg.value or b""
            calls[value].append(msg.delivery_attempt)
            if value == b"always-slow" or msg.delivery_attempt == 1:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    cancelled.append(value)
                    raise

        async with _push(broker.address, handler, handler_timeout=0.3, max_attempts=2):
            dead = await _dead(broker.address, "g", 1)
            await _wait_for(lambda: len(calls[b"once-slow"]) == 2, what="the retry")
            await asyncio.sleep(0.2)
        assert calls == {b"once-slow": [1, 2], b"always-slow": [1, 2]}
        assert sorted(cancelled) == [b"always-slow", b"always-slow", b"once-slow"]
        [letter] = dead
        assert letter.value == b"always-slow"
        error = letter.headers["tidemq.dlq.error"].decode()
        assert error.startswith("HandlerTimeout(")
        assert "0.3 s" in error

    loop.run(main())


def test_push_consumer_arguments_are_checked(loop: Loop, broker: BrokerEnv) -> None:
    async def handler(msg: aio.ReceivedMessage) -> None:
        pass

    a = broker.address
    with pytest.raises(ValueError, match="max_concurrency"):
        aio.PushConsumer(a, "g", {TOPIC: "*"}, handler, max_concurrency=0)
    with pytest.raises(ValueError, match="max_attempts"):
        aio.PushConsumer(a, "g", {TOPIC: "*"}, handler, max_attempts=0)
    with pytest.raises(ValueError, match="invisible_duration"):
        aio.PushConsumer(a, "g", {TOPIC: "*"}, handler, invisible_duration=0.5)
    with pytest.raises(ValueError, match="await_duration"):
        aio.PushConsumer(a, "g", {TOPIC: "*"}, handler, await_duration=0)
    with pytest.raises(ValueError, match="handler_timeout"):
        aio.PushConsumer(a, "g", {TOPIC: "*"}, handler, handler_timeout=0)
    with pytest.raises(ValueError, match="group"):
        aio.PushConsumer(a, "", {TOPIC: "*"}, handler)
    with pytest.raises(TypeError, match="handler"):
        aio.PushConsumer(a, "g", {TOPIC: "*"}, None)
    with pytest.raises(TypeError, match="retry_policy"):
        aio.PushConsumer(a, "g", {TOPIC: "*"}, handler, retry_policy=5.0)  # type: ignore[arg-type]

    async def unknown_topic() -> None:
        c = aio.PushConsumer(a, "g", {"nope": "*"}, handler)
        with pytest.raises(tidemq.TidemqError, match="nope"):
            await c.start()
        await c.close()

    loop.run(unknown_topic())


# ------------------------------------------------------------------ sync API


def test_sync_push_consumer(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    values = [b"s-%d" % i for i in range(30)]
    with tidemq.Admin(address) as admin:
        admin.create_topic(TOPIC, 2)
    with tidemq.Producer(address) as producer:
        for v in values:
            producer.send(TOPIC, v)
    lock = threading.Lock()
    seen: list[tuple[bytes, int]] = []
    running = peak = 0
    kinds: set[type] = set()
    threads: set[str] = set()

    def handler(msg: tidemq.ReceivedMessage) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            kinds.add(type(msg))
            threads.add(threading.current_thread().name)
        time.sleep(0.05)
        with lock:
            running -= 1
            seen.append((msg.value or b"", msg.delivery_attempt))
        if msg.value == b"s-7" and msg.delivery_attempt == 1:
            raise RuntimeError("first time fails")

    consumer = tidemq.PushConsumer(
        address, "sync", {TOPIC: "*"}, handler, max_concurrency=3, retry_policy=FAST,
        await_duration=0.2,
    )  # fmt: skip
    with consumer:
        assert consumer.running
        deadline = time.monotonic() + 15
        while len(seen) < 31 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert not consumer.running
    assert sorted(seen) == sorted([(v, 1) for v in values] + [(b"s-7", 2)])
    assert peak == 3
    assert kinds == {tidemq.ReceivedMessage}
    assert threading.current_thread().name not in threads

    async def coroutine(msg: tidemq.ReceivedMessage) -> None:
        pass

    with pytest.raises(TypeError, match=r"tidemq\.aio\.PushConsumer"):
        tidemq.PushConsumer(address, "sync", {TOPIC: "*"}, coroutine)


def test_sync_simple_consumer(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    with tidemq.Admin(address) as admin:
        admin.create_topic(TOPIC, 1)
    with tidemq.Producer(address) as producer:
        for i in range(4):
            producer.send(
                TOPIC, b"v%d" % i, key=b"k", tag="even" if i % 2 == 0 else "odd",
                headers={"n": b"%d" % i},
            )  # fmt: skip
    subs = {TOPIC: tidemq.Sql92("n >= 1")}
    with tidemq.SimpleConsumer(address, "jobs", subs, await_duration=0.2) as consumer:
        batch = consumer.receive(10, invisible_duration=30.0)
        assert [m.value for m in batch] == [b"v1", b"v2", b"v3"]  # the filter: not v0
        first = batch[0]
        assert isinstance(first, tidemq.ReceivedMessage)
        assert isinstance(first, tidemq.Message)
        assert (first.topic, first.key, first.tag, first.headers["n"]) == (TOPIC, b"k", "odd", b"1")
        assert first.delivery_attempt == 1
        assert first.handle
        assert first.invisible_until_ms > time.time() * 1000 + 20_000
        longer = first.change_invisible_duration(60.0)
        assert longer.handle != first.handle
        assert longer.value == first.value
        assert longer.invisible_until_ms > first.invisible_until_ms
        with pytest.raises(tidemq.TidemqError, match="stale handle"):
            first.ack()
        longer.ack()
        batch[1].release()  # back at once, not counted
        batch[2].nack(delay=0.0, reason="again")  # counted
        again = consumer.receive(10)
        deadline = time.monotonic() + 10
        while len(again) < 2 and time.monotonic() < deadline:
            again += consumer.receive(10)  # the nacked one comes from %RETRY%jobs
        assert sorted((m.value, m.delivery_attempt) for m in again) == [(b"v2", 1), (b"v3", 2)]
        consumer.ack_many(again)
        assert consumer.receive(10) == []
        assert consumer.group == "jobs"
    with pytest.raises(ValueError, match="invisible_duration"):
        tidemq.SimpleConsumer(address, "jobs", subs, invisible_duration=0.1)


# ------------------------------------------------------------------ dead letters


def test_dead_letters_list_and_redrive(loop: Loop, broker: BrokerEnv) -> None:
    async def fail_all(group: str, expected: int) -> None:
        """Receive `expected` messages and fail them: with max_attempts 1 the next receive
        moves them to the dead-letter topic."""
        c = aio.SimpleConsumer(
            broker.address, group, {TOPIC: "*"}, max_attempts=1, await_duration=0.2
        )
        failed = 0
        while failed < expected:
            for m in await c.receive(expected - failed):
                await m.nack(reason=f"bad {m.value!r}")
                failed += 1
        assert await c.receive(10) == []  # and that receive dead-letters them
        await c.close()

    async def main() -> None:
        values = [b"d-%d" % i for i in range(3)]
        await _setup(broker.address, values, key=b"k1", tag="t", headers={"h": b"1"})
        admin = aio.Admin(broker.address)
        assert await admin.dead_letters("dl") == []  # no DLQ topic yet
        assert await admin.redrive("dl") == 0
        await fail_all("dl", 3)
        dead = await admin.dead_letters("dl")
        assert sorted(m.value or b"" for m in dead) == values
        assert [m.value for m in await admin.dead_letters("dl", limit=2)] == [
            m.value for m in dead[:2]
        ]
        assert await admin.redrive_position("dl") == 0

        assert await admin.redrive("dl") == 3
        assert await admin.redrive_position("dl") == 3
        reader = aio.StreamConsumer(broker.address, start="earliest")
        reader.assign([(TOPIC, 0), (TOPIC, 1)])
        got: list[aio.Message] = []
        deadline = time.monotonic() + 10
        while len(got) < 6 and time.monotonic() < deadline:
            got += await reader.poll(200)
        redriven = [m for m in got if REDRIVEN_FROM_HEADER in m.headers]
        assert sorted(m.value or b"" for m in redriven) == values
        by_value = {m.value: m for m in dead}
        for m in redriven:
            letter = by_value[m.value]
            assert m.headers[REDRIVEN_FROM_HEADER] == letter.message_id.encode()
            assert dict(m.headers) == {"h": b"1", REDRIVEN_FROM_HEADER: letter.message_id.encode()}
            assert (m.key, m.tag) == (b"k1", "t")

        assert await admin.redrive("dl") == 0  # a second redrive sends nothing
        assert len(await admin.dead_letters("dl")) == 3  # the list still shows them

        # The redriven copies are new messages for the group: they fail again, and only
        # these new dead letters are redriven next time, `limit` at a time.
        await fail_all("dl", 3)
        assert len(await admin.dead_letters("dl")) == 6
        assert await admin.redrive("dl", limit=2) == 2
        assert await admin.redrive_position("dl") == 5
        assert await admin.redrive("dl", limit=2) == 1
        assert await admin.redrive("dl") == 0
        with pytest.raises(ValueError, match="limit"):
            await admin.redrive("dl", limit=0)
        with pytest.raises(ValueError, match="limit"):
            await admin.dead_letters("dl", limit=0)
        await reader.close()
        await admin.close()

    loop.run(main())


def test_sync_admin_dead_letters(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    with tidemq.Admin(address) as admin:
        admin.create_topic(TOPIC, 1)
    with tidemq.Producer(address) as producer:
        producer.send(TOPIC, b"poison")
    with tidemq.SimpleConsumer(
        address, "sg", {TOPIC: "*"}, max_attempts=1, await_duration=0.2
    ) as consumer:
        [m] = consumer.receive(1)
        m.nack(reason="no")
        assert consumer.receive(1) == []
    with tidemq.Admin(address) as admin:
        [letter] = admin.dead_letters("sg")
        assert letter.value == b"poison"
        assert letter.headers["tidemq.dlq.error"] == b"no"
        assert admin.redrive("sg") == 1
        assert admin.redrive("sg") == 0
        assert admin.redrive_position("sg") == 1
