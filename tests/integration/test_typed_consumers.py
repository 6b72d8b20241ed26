"""Consumers with `value_deserializer=` (every kind, against a real broker): values come
deserialized, tombstones stay None, and a value the deserializer cannot turn is never
handed out as if it were fine: stream and group consumers raise DeserializationFailed
naming it and stay at it until a seek skips it; pop consumers nack it until it ends in
the dead-letter topic."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest

from tidemq import aio
from tidemq.core.errors import DeserializationFailed

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop

pytestmark = pytest.mark.timeout(120)

TOPIC = "typed"


def from_json(data: bytes) -> dict[str, Any]:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


async def _poll_until_failure(consumer: Any, got: list[Any]) -> None:
    """Poll (collecting what comes) until a poll raises; bounded."""
    for _ in range(50):
        got += await consumer.poll(200)
    pytest.fail("no poll raised")


async def _fill(address: str, values: list[bytes | None]) -> None:
    async with aio.Admin(address) as admin:
        await admin.create_topic(TOPIC, 1)
    async with aio.Producer(address) as producer:
        for value in values:
            await producer.send(TOPIC, value, queue=0)


def test_a_stream_consumer_deserializes_and_stops_at_a_bad_value(
    loop: Loop, broker: BrokerEnv
) -> None:
    async def main() -> None:
        await _fill(broker.address, [b'{"n": 0}', None, b'{"n": 2}', b"not json", b'{"n": 4}'])
        consumer: aio.StreamConsumer[dict[str, Any]] = aio.StreamConsumer(
            broker.address, start="earliest", value_deserializer=from_json
        )
        try:
            consumer.assign([(TOPIC, 0)])
            got: list[aio.Message[dict[str, Any] | None]] = []
            for _ in range(50):
                got += await consumer.poll(200)
                if len(got) >= 3:
                    break
            assert [m.value for m in got] == [{"n": 0}, None, {"n": 2}]
            # The bad one: raised, again and again, until skipped.
            for _ in range(2):
                with pytest.raises(DeserializationFailed, match="typed/0@3") as failed:
                    await _poll_until_failure(consumer, [])
                assert (failed.value.offset, failed.value.value) == (3, b"not json")
                assert consumer.position(TOPIC, 0) == 3
            consumer.seek(TOPIC, 0, 4)
            rest = await consumer.poll(2000)
            assert [(m.offset, m.value) for m in rest] == [(4, {"n": 4})]
        finally:
            await consumer.close()

    loop.run(main())


def test_a_group_consumer_commits_only_what_it_handed_out(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _fill(broker.address, [b'{"n": 0}', b"[1]", b'{"n": 2}'])
        consumer = aio.GroupConsumer(
            broker.address, "g-typed", [TOPIC], start="earliest", value_deserializer=from_json
        )
        try:
            got: list[aio.Message[dict[str, Any] | None]] = []
            with pytest.raises(DeserializationFailed, match="expected a JSON object"):
                await _poll_until_failure(consumer, got)
            assert [m.value for m in got] == [{"n": 0}]
            await consumer.commit()
        finally:
            await consumer.close()
        async with aio.Admin(broker.address) as admin:
            lag = await admin.describe_group("g-typed")
        assert [(q.queue, q.committed) for q in lag.offsets] == [(0, 1)]

    loop.run(main())


def test_pop_consumers_deserialize_and_dead_letter_a_bad_value(
    loop: Loop, broker: BrokerEnv
) -> None:
    async def main() -> None:
        await _fill(broker.address, [b'{"n": 0}', b"oops", b'{"n": 2}'])
        simple = aio.SimpleConsumer(
            broker.address,
            "g-pop-typed",
            {TOPIC: "*"},
            max_attempts=2,
            await_duration=0.2,
            value_deserializer=from_json,
        )
        seen: list[Any] = []
        try:
            for _ in range(50):
                batch = await simple.receive(16)
                seen += [m.value for m in batch]
                await simple.ack_many(batch)
                if len(seen) >= 2:
                    break
        finally:
            await simple.close()
        assert sorted(v["n"] for v in seen) == [0, 2]
        async with aio.Admin(broker.address) as admin:
            letters: list[aio.Message] = []
            for _ in range(50):
                letters = await admin.dead_letters("g-pop-typed")
                if letters:
                    break
                simple = aio.SimpleConsumer(
                    broker.address, "g-pop-typed", {TOPIC: "*"}, max_attempts=2,
                    await_duration=0.2, value_deserializer=from_json,
                )  # fmt: skip
                try:  # deliveries of the bad one count up to max_attempts
                    assert await simple.receive(16) == []
                finally:
                    await simple.close()
        assert [m.value for m in letters] == [b"oops"]

        # A push consumer's handler gets the values deserialized too.
        handled: asyncio.Queue[Any] = asyncio.Queue()

        async def handler(m: aio.ReceivedMessage[Any]) -> None:
            await handled.put(m.value)

        async with aio.Producer(broker.address) as producer:
            await producer.send(TOPIC, b'{"n": 5}', queue=0)
        push = aio.PushConsumer(
            broker.address, "g-push-typed", {TOPIC: "*"}, handler, value_deserializer=from_json,
            await_duration=0.2,
        )  # fmt: skip
        async with push:
            values = [await asyncio.wait_for(handled.get(), 30) for _ in range(3)]
        assert sorted(v["n"] for v in values) == [0, 2, 5]

    loop.run(main())


def test_a_broadcast_member_gets_deserialized_values(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _fill(broker.address, [b'{"n": 0}', b'{"n": 1}'])
        member = aio.BroadcastConsumer(
            broker.address, "g-bc", [TOPIC], member="m1", start="earliest",
            value_deserializer=from_json,
        )  # fmt: skip
        try:
            got: list[Any] = []
            for _ in range(50):
                got += [m.value for m in await member.poll(200)]
                if len(got) >= 2:
                    break
        finally:
            await member.close()
        assert got == [{"n": 0}, {"n": 1}]

    loop.run(main())
