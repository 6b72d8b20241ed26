"""No send hangs: a wrong argument raises at the call (and the producer keeps working), and
every send ends, in a receipt or an error, within its delivery timeout, whatever the
broker does: killed mid-send (one broker, or one of two), out of disk, gone for good.

Issue 15: `send(tag=b"paid")` raised inside a loop callback and every later send hung; a
send to a killed broker's queue was still pending 190 s later; an idempotent producer hung
on a full disk (the batch was taken off the queue before INIT_PRODUCER, and lost when that
failed).
"""

from __future__ import annotations

import asyncio
import math
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest

import tidemq
from tidemq import aio
from tidemq.core.errors import TidemqError

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, ClusterEnv, Loop, StartBroker, ThreadedBroker

DELIVERY_TIMEOUT_MS = 3_000
#: What a send may take past its delivery timeout: one attempt's grace (1 s) and room for
#: a loaded machine.
SLACK_S = 4.0

#: (arguments to `send` after topic and value, what the error must say)
WRONG_SEND: list[tuple[dict[str, Any], str]] = [
    ({"tag": b"paid"}, "tag"),
    ({"tag": 5}, "tag"),
    ({"tag": "a||b"}, "tag"),
    ({"tag": "has space"}, "tag"),
    ({"keys": [1]}, "keys"),
    ({"keys": "abc"}, "keys"),
    ({"headers": {"h": "str"}}, "headers"),
    ({"headers": [("h", b"v")]}, "headers"),
    ({"timestamp": time.time() * 1000}, "milliseconds"),
    ({"timestamp": math.nan}, "timestamp"),
    ({"timestamp": 1e15}, "timestamp"),
    ({"timestamp": datetime(1, 1, 1, tzinfo=UTC)}, "timestamp"),
    ({"timestamp": datetime(2030, 1, 1)}, "timestamp"),
    ({"delay": math.inf}, "delay"),
    ({"delay": math.nan}, "delay"),
    ({"delay": -1}, "delay"),
    ({"delay": 1.0, "deliver_at": time.time()}, "not both"),
    ({"queue": -1}, "queue"),
    ({"queue": "0"}, "queue"),
    ({"queue": True}, "queue"),
    ({"queue": 2**64}, "queue"),
    ({"key": "text"}, "key"),
]


def _wrong_value_cases() -> list[tuple[Any, Any, str]]:
    return [
        ("t", "text", "value"),
        ("t", 5, "value"),
        (5, b"v", "topic"),
        ("..", b"v", "topic"),
        ("-rf", b"v", "topic"),
        ("", b"v", "topic"),
    ]


def test_wrong_arguments_raise_at_the_call_and_the_producer_keeps_working(
    sync_broker: ThreadedBroker,
) -> None:
    address = sync_broker.address
    tidemq.Admin(address).create_topic("t", 2)
    with tidemq.Producer(address) as producer:
        for kwargs, says in WRONG_SEND:
            started = time.monotonic()
            with pytest.raises((TypeError, ValueError), match=says):
                producer.send_async("t", b"v", **kwargs)
            assert time.monotonic() - started < 1.0, kwargs
        for topic, value, says in _wrong_value_cases():
            with pytest.raises((TypeError, ValueError), match=says):
                producer.send(topic, value)
        with pytest.raises(TypeError, match="values"):
            producer.send_batch("t", b"abc")
        with pytest.raises(ValueError, match="values"):
            producer.send_batch("t", [])
        with pytest.raises(ValueError, match="keys"):
            producer.send_batch("t", [b"a", b"b"], keys=[b"k"])
        with pytest.raises(TypeError, match=r"tags\[1\]"):
            producer.send_batch("t", [b"a", b"b"], tags=["x", 5])  # type: ignore[list-item]
        # Nothing was sent, nothing is stuck: the next sends go through, in order.
        receipts = [producer.send("t", b"ok-%d" % i, queue=0) for i in range(3)]
        assert [r.offset for r in receipts] == [0, 1, 2]


def test_wrong_arguments_raise_at_the_call_asyncio(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            await admin.create_topic("t", 2)
        async with aio.Producer(broker.address) as producer:
            for kwargs, says in WRONG_SEND:
                with pytest.raises((TypeError, ValueError), match=says):
                    await producer.send("t", b"v", **kwargs)
                with pytest.raises((TypeError, ValueError), match=says):
                    await producer.send_nowait("t", b"v", **kwargs)
            receipt = await producer.send("t", b"ok", queue=1)
            assert receipt.offset == 0

    loop.run(main())


def test_wrong_producer_settings_name_the_argument() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"linger_ms": -1}, "linger_ms"),
        ({"linger_ms": math.nan}, "linger_ms"),
        ({"batch_bytes": 0}, "batch_bytes"),
        ({"batch_messages": "10"}, "batch_messages"),
        ({"delivery_timeout_ms": 0}, "delivery_timeout_ms"),
        ({"compression": "gzip"}, "compression"),
        ({"acks": 1}, "acks"),
        ({"acks": 0}, "idempotent=False"),
        ({"max_in_flight_per_queue": 33}, "max_in_flight_per_queue"),
    ]
    for kwargs, says in cases:
        with pytest.raises((TypeError, ValueError), match=says):
            aio.Producer("127.0.0.1:9", **kwargs)


def test_a_killed_broker_ends_every_send_within_the_delivery_timeout(
    loop: Loop, start_broker: StartBroker
) -> None:
    """Kill the broker with sends in flight and more coming: each ends in a receipt or an
    error within the delivery timeout; once it is back, sends succeed again."""
    env = start_broker()

    async def main() -> None:
        async with aio.Admin(env.address) as admin:
            await admin.create_topic("k", 2)
        producer = aio.Producer(env.address, delivery_timeout_ms=DELIVERY_TIMEOUT_MS)
        try:
            first = [await producer.send_nowait("k", b"%d" % i, key=b"a") for i in range(50)]
            await env.broker.stop()
            started = time.monotonic()
            later = [await producer.send_nowait("k", b"x%d" % i, key=b"a") for i in range(50)]
            outcomes = await asyncio.gather(*first, *later, return_exceptions=True)
            elapsed = time.monotonic() - started
            assert elapsed < DELIVERY_TIMEOUT_MS / 1000 + SLACK_S, elapsed
            failures = [o for o in outcomes if isinstance(o, BaseException)]
            assert failures, "sends to a stopped broker cannot all succeed"
            assert all(isinstance(f, TidemqError) for f in failures), failures[:3]
        finally:
            await producer.close()

    loop.run(main())


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "no-producer-id-yet"])
def test_one_of_two_brokers_killed(loop: Loop, cluster: ClusterEnv, warm: bool) -> None:
    """With two brokers, sends to the killed one's queues end within the delivery timeout
    (in a receipt or an error); sends to the other's keep working meanwhile. Not warm:
    the producer never had an id from the killed broker, so its first step, InitProducer,
    fails (the issue's hang: the batch was taken off the queue before that call)."""

    async def main() -> None:
        async with aio.Admin(cluster.bootstrap) as admin:
            await admin.create_topic("two", 4)
        producer = aio.Producer(cluster.bootstrap, delivery_timeout_ms=DELIVERY_TIMEOUT_MS)
        try:
            routes = await producer.cluster.refresh_routes(force=True)
            killed = cluster.addresses[0]
            dead = [q for q in range(4) if routes.broker_for("two", q) == killed]
            alive = [q for q in range(4) if q not in dead]
            assert dead
            assert alive
            for q in range(4) if warm else alive:
                await producer.send("two", b"warm", queue=q)
            await cluster.brokers[0].stop()
            started = time.monotonic()
            to_dead = [await producer.send_nowait("two", b"d", queue=q) for q in dead * 5]
            to_alive = [await producer.send_nowait("two", b"a", queue=q) for q in alive * 5]
            alive_receipts = await asyncio.gather(*to_alive)
            assert all(r.offset >= 1 for r in alive_receipts)
            outcomes = await asyncio.gather(*to_dead, return_exceptions=True)
            elapsed = time.monotonic() - started
            assert elapsed < DELIVERY_TIMEOUT_MS / 1000 + SLACK_S, elapsed
            assert all(isinstance(o, TidemqError) for o in outcomes), outcomes[:3]
        finally:
            await producer.close()

    loop.run(main())


def test_a_full_disk_ends_idempotent_sends_within_the_delivery_timeout(
    loop: Loop, start_broker: StartBroker
) -> None:
    """Writes refused for a full disk (the watermark set below the disk's use): the
    default, idempotent producer gets an error within its delivery timeout, not a hang."""
    env = start_broker(store_overrides={"disk_reject_ratio": 1e-6})

    async def main() -> None:
        async with aio.Admin(env.address) as admin:
            await admin.create_topic("full", 1)
        producer = aio.Producer(env.address, delivery_timeout_ms=DELIVERY_TIMEOUT_MS)
        try:
            started = time.monotonic()
            futures = [await producer.send_nowait("full", b"v%d" % i) for i in range(20)]
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
            elapsed = time.monotonic() - started
            assert elapsed < DELIVERY_TIMEOUT_MS / 1000 + SLACK_S, elapsed
            assert all(isinstance(o, TidemqError) for o in outcomes), outcomes[:3]
        finally:
            await producer.close()

    loop.run(main())
