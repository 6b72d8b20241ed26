"""Produces answered from the broker's protocol callback, with no task (async flush:
`Broker._answer_now`, `DataHandlers.produce_now`): they must keep what the task path
guarantees. Pipelined batches of one connection are stored in the order sent, whatever
mix of answered-at-once and task-served requests; refusals carry the same errors;
idempotent resends are answered as duplicates; delayed and transactional sends and
fetches on the same connection still go their way."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from tidemq import aio
from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.core.errors import BatchTooLarge, InvalidRequest, QueueNotFound
from tidemq.net.client import ClientConnection
from tidemq.protocol.commands import (
    FetchRequest,
    FetchResponse,
    InitProducerRequest,
    InitProducerResponse,
    ProduceRequest,
    ProduceResponse,
)
from tidemq.store.config import FlushMode

if TYPE_CHECKING:
    from tests.integration.conftest import Loop, StartBroker

pytestmark = pytest.mark.timeout(120)

TOPIC = "now"
ASYNC_FLUSH = {"store_overrides": {"flush_mode": FlushMode.ASYNC}}


def _payload(value: bytes) -> bytes:
    return encode_batch([MessageRecord(value=value)])


async def _read_all(address: str, count: int, queue: int = 0) -> list[aio.Message]:
    consumer = aio.StreamConsumer(address, start="earliest")
    try:
        consumer.assign([(TOPIC, queue)])
        out: list[aio.Message] = []
        for _ in range(100):
            if len(out) >= count:
                break
            out.extend(await consumer.poll(300))
        out.extend(await consumer.poll(100))
        return out
    finally:
        await consumer.close()


def test_pipelined_produces_keep_their_order_and_errors(
    loop: Loop, start_broker: StartBroker
) -> None:
    env = start_broker(**ASYNC_FLUSH)

    async def main() -> None:
        async with aio.Admin(env.address) as admin:
            await admin.create_topic(TOPIC, 2)
        conn = await ClientConnection.open(env.address, max_frame_bytes=1 << 24)
        try:
            init, _ = await conn.request(InitProducerRequest(), InitProducerResponse, timeout_s=10)
            pid, epoch = init.producer_id, init.epoch

            def produce(
                seq: int, value: bytes, queue: int = 0
            ) -> asyncio.Future[tuple[ProduceResponse, bytes]]:
                req = ProduceRequest(
                    topic=TOPIC, queue=queue, producer_id=pid, epoch=epoch, base_sequence=seq
                )
                return asyncio.ensure_future(
                    conn.request(req, ProduceResponse, _payload(value), timeout_s=10)
                )

            # Pipelined, with a fetch that parks (a task) in the middle: what comes after
            # it goes through tasks too, and the stored order is the sent order.
            first = [produce(i, b"m-%d" % i) for i in range(5)]
            fetch = asyncio.ensure_future(
                conn.request(
                    FetchRequest(
                        topic=TOPIC, queue=1, offset=0, max_bytes=1 << 20, max_wait_ms=300
                    ),
                    FetchResponse,
                    timeout_s=10,
                )
            )
            second = [produce(i, b"m-%d" % i) for i in range(5, 10)]
            answers = [a for a, _ in await asyncio.gather(*first, *second)]
            assert [a.base_offset for a in answers] == list(range(10))
            await fetch
            # A resend of stored batches: duplicates, with the offsets first given.
            again = [a for a, _ in await asyncio.gather(*(produce(i, b"x") for i in (8, 9)))]
            assert [(a.base_offset, a.duplicate) for a in again] == [(8, True), (9, True)]
            # Refusals, answered at once with the task path's errors.
            with pytest.raises(QueueNotFound):
                await conn.request(
                    ProduceRequest(topic=TOPIC, queue=9), ProduceResponse, _payload(b"q"),
                    timeout_s=10,
                )  # fmt: skip
            with pytest.raises(InvalidRequest, match="epoch"):
                await conn.request(
                    ProduceRequest(topic=TOPIC, queue=0, producer_id=pid), ProduceResponse,
                    _payload(b"e"), timeout_s=10,
                )  # fmt: skip
            with pytest.raises(BatchTooLarge):
                await conn.request(
                    ProduceRequest(topic=TOPIC, queue=0), ProduceResponse,
                    _payload(b"z" * (5 << 20)), timeout_s=10,
                )  # fmt: skip
            # The connection still works.
            last, _ = await produce(10, b"m-10")
            assert last.base_offset == 10
        finally:
            conn.close()
        got = await _read_all(env.address, 11)
        assert [m.value for m in got] == [b"m-%d" % i for i in range(11)]

    loop.run(main())


def test_every_kind_of_send_with_async_flush(loop: Loop, start_broker: StartBroker) -> None:
    env = start_broker(**ASYNC_FLUSH)

    async def main() -> None:
        async with aio.Admin(env.address) as admin:
            await admin.create_topic(TOPIC, 1)
        async with aio.Producer(env.address) as producer:
            plain = [await producer.send(TOPIC, b"p-%d" % i, queue=0) for i in range(20)]
            assert [r.offset for r in plain] == list(range(20))
            burst = [await producer.send_nowait(TOPIC, b"b-%d" % i, queue=0) for i in range(50)]
            assert [(await f).offset for f in burst] == list(range(20, 70))
            delayed = await producer.send(TOPIC, b"later", queue=0, delay=60)
            assert delayed.offset == -1
            txp = aio.TransactionProducer(env.address, "now-group")
            async with txp, txp.transaction() as tx:
                await tx.send(TOPIC, b"t-0", queue=0)
            after = await producer.send(TOPIC, b"p-last", queue=0)
            assert after.offset == 71  # after the committed transactional message
        got = await _read_all(env.address, 72)
        values = [m.value for m in got]
        assert values[:70] == [b"p-%d" % i for i in range(20)] + [b"b-%d" % i for i in range(50)]
        assert values[70:] == [b"t-0", b"p-last"]

    loop.run(main())


def test_a_produce_to_an_unknown_topic_is_auto_created_as_on_the_task_path(
    loop: Loop, start_broker: StartBroker
) -> None:
    """The answer-at-once path shares the task path's checks, and leaves it what it does
    not do: a topic unknown here is created (auto_create_topics) by the task path, not
    refused from the protocol callback."""
    env = start_broker(auto_create_topics=True, **ASYNC_FLUSH)

    async def main() -> None:
        conn = await ClientConnection.open(env.address, max_frame_bytes=1 << 24)
        try:
            first, _ = await conn.request(
                ProduceRequest(topic=TOPIC, queue=0), ProduceResponse, _payload(b"a"),
                timeout_s=10,
            )  # fmt: skip
            second, _ = await conn.request(
                ProduceRequest(topic=TOPIC, queue=0), ProduceResponse, _payload(b"b"),
                timeout_s=10,
            )  # fmt: skip
            assert (first.base_offset, second.base_offset) == (0, 1)
        finally:
            conn.close()
        got = await _read_all(env.address, 2)
        assert [m.value for m in got] == [b"a", b"b"]

    loop.run(main())
