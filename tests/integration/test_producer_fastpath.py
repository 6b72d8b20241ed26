"""The producer's one-message fast path (`send` and the sync `Producer.send` when nothing
else is on its way to the queue): it must keep what the accumulator and the sender task
guarantee. Per queue, the send order is the stored order, whatever mix of fast sends,
accumulated sends and batches; a failed fast send is retried (idempotently: stored once)
or failed exactly as any batch; flush and close wait for it; errors are the same."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import TYPE_CHECKING

import pytest

import tidemq
from tidemq import aio
from tidemq.client import _loop
from tidemq.client.cluster import ClientConfig
from tidemq.core.errors import (
    BatchTooLarge,
    BrokerNotAvailable,
    QueueNotFound,
    RequestTimeout,
    TopicNotFound,
)
from tidemq.net.client import ClientConnection
from tidemq.protocol.codec import decode_request, encode_response
from tidemq.protocol.commands import GetRoutesRequest, GetRoutesResponse
from tidemq.protocol.frame import Frame, FrameDecoder

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop, ThreadedBroker

pytestmark = pytest.mark.timeout(120)

TOPIC = "fast"


async def _create(address: str, queues: int = 1, config: dict[str, str] | None = None) -> None:
    async with aio.Admin(address) as admin:
        await admin.create_topic(TOPIC, queues, config=config)


async def _read_all(address: str, count: int, queue: int = 0) -> list[aio.Message]:
    """Every message of the queue, once `count` arrived (and a little longer for extras)."""
    consumer = aio.StreamConsumer(address, start="earliest")
    try:
        consumer.assign([(TOPIC, queue)])
        out: list[aio.Message] = []
        deadline = time.monotonic() + 20
        while len(out) < count:
            assert time.monotonic() < deadline, f"got {len(out)} of {count} messages"
            out.extend(await consumer.poll(500))
        out.extend(await consumer.poll(200))
        return out
    finally:
        await consumer.close()


def _sender_task(producer: aio.Producer, queue: int = 0) -> object:
    return producer._senders[(TOPIC, queue)]._task


def test_sequential_sends_take_the_fast_path_in_order(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, queues=2)
        async with aio.Producer(broker.address) as producer:
            first = await producer.send(TOPIC, b"m-0", queue=0)  # the accumulator's way
            task = _sender_task(producer)
            receipts = [first] + [
                await producer.send(TOPIC, b"m-%d" % i, queue=0) for i in range(1, 50)
            ]
            # No sender task was needed after the first send: the answers settled them.
            assert _sender_task(producer) is task
            # Without an explicit queue (round robin over the routes), alike.
            spread = [await producer.send(TOPIC, b"rr-%d" % i) for i in range(10)]
        assert [r.offset for r in receipts] == list(range(50))
        assert all(isinstance(r, aio.Receipt) and r.queue == 0 for r in receipts)
        assert {r.queue for r in spread} == {0, 1}
        got = await _read_all(broker.address, 55)
        assert [m.value for m in got if m.value.startswith(b"m-")] == [  # type: ignore[union-attr]
            b"m-%d" % i for i in range(50)
        ]
        assert [m.offset for m in got] == list(range(len(got)))

    loop.run(main())


def test_fast_send_in_flight_keeps_order_with_everything_after_it(
    loop: Loop, broker: BrokerEnv
) -> None:
    async def main() -> None:
        await _create(broker.address)
        async with aio.Producer(broker.address) as producer:
            await producer.send(TOPIC, b"warm-up", queue=0)
            for round_ in range(5):
                # A fast send, then while it is in flight: sends, accumulated sends and a
                # batch, which the sender task sends after it.
                fast = asyncio.ensure_future(producer.send(TOPIC, b"%d-fast" % round_, queue=0))
                await asyncio.sleep(0)  # it has left
                assert producer._senders[(TOPIC, 0)]._inflight
                more = [
                    asyncio.ensure_future(producer.send(TOPIC, b"%d-send-%d" % (round_, i)))
                    for i in range(3)
                ]
                nowait = await producer.send_nowait(TOPIC, b"%d-nowait" % round_, queue=0)
                batch = await producer.send_batch_nowait(
                    TOPIC, [b"%d-batch-%d" % (round_, i) for i in range(3)], queue=0
                )
                # Stored in the order the calls reached the producer: the tasks of `more`
                # start after this task's send_nowait and send_batch_nowait.
                offsets = [
                    (await fast).offset,
                    (await nowait).offset,
                    *(r.offset for r in await batch),
                    *(r.offset for r in await asyncio.gather(*more)),
                ]
                assert offsets == list(range(offsets[0], offsets[0] + 8))
            # Fast again once the queue is idle.
            task = _sender_task(producer)
            last = await producer.send(TOPIC, b"last", queue=0)
            assert _sender_task(producer) is task
        assert last.offset == 41
        got = await _read_all(broker.address, 42)
        assert [m.offset for m in got] == list(range(42))
        assert len({m.value for m in got}) == 42

    loop.run(main())


def test_gathered_sends_keep_their_call_order(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address)
        async with aio.Producer(broker.address) as producer:
            await producer.send(TOPIC, b"warm-up", queue=0)
            for _ in range(3):
                receipts = await asyncio.gather(
                    *(producer.send(TOPIC, b"x", queue=0) for _ in range(40))
                )
                offsets = [r.offset for r in receipts]
                assert offsets == list(range(offsets[0], offsets[0] + 40))

    loop.run(main())


def test_a_lost_connection_is_retried_and_stored_once(loop: Loop, broker: BrokerEnv) -> None:
    """The connection drops right after a fast send left: the sender task resends it with
    the same sequence number, and the broker answers with the offset it already gave."""

    async def main() -> None:
        await _create(broker.address)
        async with aio.Producer(broker.address) as producer:
            await producer.send(TOPIC, b"m-0", queue=0)
            for i in range(1, 6):
                sending = asyncio.ensure_future(producer.send(TOPIC, b"m-%d" % i, queue=0))
                await asyncio.sleep(0)
                sender = producer._senders[(TOPIC, 0)]
                assert sender._inflight  # it left by the fast path
                conn = sender._conn
                assert conn is not None
                conn.close()  # before the answer: the request was written, the answer is lost
                receipt = await asyncio.wait_for(sending, 30)
                assert receipt.offset == i
                assert sender._conn is not conn  # resent on a new connection
            assert (await producer.send(TOPIC, b"m-6", queue=0)).offset == 6
        got = await _read_all(broker.address, 7)
        assert [m.value for m in got] == [b"m-%d" % i for i in range(7)]

    loop.run(main())


def test_a_timeout_is_retried_and_out_of_retries_fails(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address)
        config = ClientConfig(request_timeout_ms=300, retries=2, retry_backoff_ms=10)
        async with aio.Producer(broker.address, client_config=config) as producer:
            await producer.send(TOPIC, b"m-0", queue=0)
            # The broker's connection stops reading: no answer ever comes.
            conn = producer._senders[(TOPIC, 0)]._conn
            assert conn is not None
            assert conn._transport is not None
            conn._transport.pause_reading()
            started = time.monotonic()
            with pytest.raises(RequestTimeout, match="no answer"):
                await producer.send(TOPIC, b"m-1", queue=0)
            assert time.monotonic() - started < 20
            conn._transport.resume_reading()
            # The queue keeps working (a fresh producer id: the timed-out one may be stored).
            receipt = await producer.send(TOPIC, b"m-2", queue=0)
            assert receipt.offset in (1, 2)

    loop.run(main())


def test_a_refused_fast_send_fails_alone(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, config={"max.message.bytes": "10000"})
        async with aio.Producer(broker.address, max_request_bytes=100_000) as producer:
            offsets = [(await producer.send(TOPIC, b"ok-0", queue=0)).offset]
            for i in range(1, 4):
                with pytest.raises(BatchTooLarge, match=r"max\.message\.bytes"):
                    await producer.send(TOPIC, b"x" * 20_000, queue=0)  # refused by the broker
                with pytest.raises(BatchTooLarge):
                    await producer.send(TOPIC, b"y" * 200_000, queue=0)  # refused here
                offsets.append((await producer.send(TOPIC, b"ok-%d" % i, queue=0)).offset)
                offsets.append((await producer.send(TOPIC, b"ok-%d+" % i, queue=0)).offset)
            with pytest.raises(TopicNotFound):
                await producer.send("nowhere", b"x")
            with pytest.raises(TypeError, match="bytes"):
                await producer.send(TOPIC, "text", queue=0)
        assert offsets == list(range(7))
        got = await _read_all(broker.address, 7)
        assert [m.offset for m in got] == list(range(7))

    loop.run(main())


def test_flush_close_and_cancel_with_a_fast_send_in_flight(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address)
        producer = aio.Producer(broker.address)
        await producer.send(TOPIC, b"m-0", queue=0)
        sending = asyncio.ensure_future(producer.send(TOPIC, b"m-1", queue=0))
        await asyncio.sleep(0)
        assert producer._senders[(TOPIC, 0)]._inflight
        await producer.flush()
        assert producer._senders[(TOPIC, 0)].idle.is_set()
        assert (await sending).offset == 1
        # A cancelled caller does not unsend its message, nor break the queue's sequence.
        cancelled = asyncio.ensure_future(producer.send(TOPIC, b"m-2", queue=0))
        await asyncio.sleep(0)
        cancelled.cancel()
        assert (await producer.send(TOPIC, b"m-3", queue=0)).offset == 3
        closing = asyncio.ensure_future(producer.send(TOPIC, b"m-4", queue=0))
        await asyncio.sleep(0)
        await producer.close()
        assert closing.done()
        assert closing.result().offset == 4
        with pytest.raises(RuntimeError, match="closed"):
            await producer.send(TOPIC, b"late", queue=0)
        got = await _read_all(broker.address, 5)
        assert [m.value for m in got] == [b"m-%d" % i for i in range(5)]

    loop.run(main())


def test_linger_and_acks_zero_keep_the_accumulator(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address)
        async with aio.Producer(broker.address, linger_ms=20) as producer:
            await producer.send(TOPIC, b"a", queue=0)
            # With a linger, a send waits for company, even when the queue is idle.
            receipts = await asyncio.gather(
                producer.send(TOPIC, b"b", queue=0),
                asyncio.sleep(0.005, result=None),
                producer.send(TOPIC, b"c", queue=0),
            )
            assert receipts[0] is not None
            assert receipts[2] is not None
            assert (receipts[0].offset, receipts[2].offset) == (1, 2)
        async with aio.Producer(broker.address, acks=0, idempotent=False) as producer:
            for _ in range(3):
                assert (await producer.send(TOPIC, b"d", queue=0)).offset == -1
        await _read_all(broker.address, 6)

    loop.run(main())


# ------------------------------------------------------------------ the sync API


def test_sync_producer_fast_path(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    with tidemq.Admin(address) as admin:
        admin.create_topic(TOPIC, 2)
    with tidemq.Producer(address) as producer:
        offsets = [producer.send(TOPIC, b"s-%d" % i, queue=0).offset for i in range(30)]
        assert offsets == list(range(30))
        # Sends from several threads at once: each queue's offsets stay dense.
        results: list[tidemq.Receipt] = []
        lock = threading.Lock()

        def worker(n: int) -> None:
            for i in range(20):
                r = producer.send(TOPIC, b"t-%d-%d" % (n, i), queue=1)
                with lock:
                    results.append(r)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(r.offset for r in results) == list(range(80))
        # A burst of send_async: offsets in call order.
        futures = [producer.send_async(TOPIC, b"a-%d" % i, queue=0) for i in range(50)]
        assert [f.result(30).offset for f in futures] == list(range(30, 80))
        # Round robin, delayed sends (the task's way) and errors, as before.
        assert {producer.send(TOPIC, b"rr").queue for _ in range(6)} == {0, 1}
        delayed = producer.send(TOPIC, b"later", queue=0, delay=60)
        assert delayed.offset == -1
        assert delayed.message_id
        with pytest.raises(TopicNotFound):
            producer.send("nowhere", b"x")
        with pytest.raises(TypeError, match="bytes"):
            producer.send(TOPIC, 5, queue=0)
        with pytest.raises(ValueError, match="queue"):
            producer.send(TOPIC, b"x", queue=-1)
        future = producer.send_async(TOPIC, b"x", queue=7)
        with pytest.raises(QueueNotFound):
            future.result(30)
    with pytest.raises(RuntimeError, match="closed"):
        producer.send(TOPIC, b"late", queue=0)


def test_sync_send_from_the_client_loop_is_refused(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    with tidemq.Admin(address) as admin:
        admin.create_topic(TOPIC, 1)
    with tidemq.Producer(address) as producer:
        producer.send(TOPIC, b"x", queue=0)
        outcome: concurrent.futures.Future[BaseException | None] = concurrent.futures.Future()

        async def from_the_loop() -> None:
            try:
                producer.send(TOPIC, b"y", queue=0)
            except RuntimeError as exc:
                outcome.set_result(exc)
            else:
                outcome.set_result(None)

        _loop.submit(from_the_loop())
        error = outcome.result(30)
        assert isinstance(error, RuntimeError)
        assert "deadlock" in str(error)


# ------------------------------------------------------------------ the connection


def test_connection_timeouts_slots_and_loss() -> None:
    """`request` and `request_nowait` against a server that reads and never answers."""

    async def main() -> None:
        accepted: list[asyncio.StreamWriter] = []

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)
            while await reader.read(1 << 16):
                pass

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conn = await ClientConnection.open(
            f"127.0.0.1:{port}", max_frame_bytes=1 << 20, max_in_flight=1
        )
        try:
            with pytest.raises(RequestTimeout, match=r"GetRoutesRequest to .* 0\.05 s"):
                await conn.request(GetRoutesRequest(), GetRoutesResponse, timeout_s=0.05)
            assert conn.has_free_slot  # the timed-out request gave its slot back
            answers: list[tuple[Frame | None, BaseException | None]] = []
            conn.request_nowait(
                GetRoutesRequest(),
                b"",
                timeout_s=0.05,
                callback=lambda f, e: answers.append((f, e)),
            )
            assert not answers  # never from within the call
            assert not conn.has_free_slot
            with pytest.raises(RuntimeError, match="slot"):
                conn.request_nowait(
                    GetRoutesRequest(), b"", timeout_s=1, callback=lambda f, e: None
                )
            # A coroutine request waits for the slot, then times out on its own.
            started = time.monotonic()
            with pytest.raises(RequestTimeout):
                await conn.request(GetRoutesRequest(), GetRoutesResponse, timeout_s=0.1)
            assert time.monotonic() - started >= 0.1
            assert len(answers) == 1
            assert answers[0][0] is None
            assert isinstance(answers[0][1], RequestTimeout)
            # A cancelled request frees its slot.
            waiting = asyncio.ensure_future(
                conn.request(GetRoutesRequest(), GetRoutesResponse, timeout_s=30)
            )
            await asyncio.sleep(0.01)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert conn.has_free_slot
            # Losing the connection answers every request with BrokerNotAvailable.
            conn.request_nowait(
                GetRoutesRequest(), b"", timeout_s=30, callback=lambda f, e: answers.append((f, e))
            )
            queued = asyncio.ensure_future(
                conn.request(GetRoutesRequest(), GetRoutesResponse, timeout_s=30)
            )
            await asyncio.sleep(0.01)
            for writer in accepted:
                writer.close()
            with pytest.raises(BrokerNotAvailable):
                await asyncio.wait_for(queued, 10)
            assert isinstance(answers[-1][1], BrokerNotAvailable)
            assert conn.has_free_slot
            with pytest.raises(BrokerNotAvailable, match="closed"):
                conn.request_nowait(GetRoutesRequest(), b"", timeout_s=1, callback=print)
        finally:
            conn.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_requests_leave_in_the_order_they_asked_for_a_slot() -> None:
    """Two slots free up in one read while a request waits: the slot handed to the waiting
    request is not taken by a later one, which would otherwise be written first (a
    producer's batches would then arrive out of sequence)."""

    async def main() -> None:
        seen: list[str] = []
        both = asyncio.Event()
        writers: list[asyncio.StreamWriter] = []

        async def server_side(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            decoder = FrameDecoder(1 << 20)
            held: list[bytes | memoryview] = []
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                for frame in decoder.feed(data):
                    _, req = decode_request(frame)
                    seen.append(req.topics[0])
                    answer = encode_response(frame.code, frame.correlation_id, _ROUTES)
                    if len(seen) > 2:
                        writer.writelines(answer)
                        continue
                    held.extend(answer)  # hold the first two, then answer both at once
                    if len(seen) == 2:
                        both.set()
                        writer.writelines(held)

        server = await asyncio.start_server(server_side, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conn = await ClientConnection.open(
            f"127.0.0.1:{port}", max_frame_bytes=1 << 20, max_in_flight=2
        )
        later: list[asyncio.Future[object]] = []

        free_after_second: list[bool] = []

        def after_second(frame: Frame | None, error: BaseException | None) -> None:
            # Both slots are free again here, but one is promised to "b", still waiting.
            free_after_second.append(conn.has_free_slot)
            later.append(
                asyncio.ensure_future(
                    conn.request(GetRoutesRequest(topics=["c"]), GetRoutesResponse, timeout_s=5)
                )
            )

        try:
            conn.request_nowait(
                GetRoutesRequest(topics=["a1"]), b"", timeout_s=5, callback=lambda f, e: None
            )
            conn.request_nowait(
                GetRoutesRequest(topics=["a2"]), b"", timeout_s=5, callback=after_second
            )
            waiting = asyncio.ensure_future(
                conn.request(GetRoutesRequest(topics=["b"]), GetRoutesResponse, timeout_s=5)
            )
            await asyncio.wait_for(both.wait(), 5)
            await asyncio.wait_for(waiting, 5)
            deadline = time.monotonic() + 5
            while not later and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert later, "the second answer never came"
            await asyncio.wait_for(later[0], 5)
            assert free_after_second == [False]
            assert seen == ["a1", "a2", "b", "c"]
        finally:
            conn.close()
            for writer in writers:
                writer.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


_ROUTES = GetRoutesResponse(routes=[], brokers={})
