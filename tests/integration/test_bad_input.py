"""Bad input and bad peers against a real broker: each is refused with the error the table
names, or (for bytes that break the framing) costs the sender its connection, and the
broker keeps serving everyone else. Also: a request that waits does not hold up others,
and a broker stops promptly with fetches parked."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

import pytest

from tidemq import aio
from tidemq.client.cluster import ClusterClient
from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.core.errors import (
    BatchTooLarge,
    ConfigError,
    ErrorCode,
    FencedProducer,
    InvalidBatch,
    InvalidRequest,
    QueueNotFound,
    TopicNotFound,
)
from tidemq.net.client import ClientConnection
from tidemq.protocol.codec import error_from_frame
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import (
    Empty,
    FetchRequest,
    FetchResponse,
    GetRoutesRequest,
    GetRoutesResponse,
    InitProducerRequest,
    InitProducerResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ProduceRequest,
    ProduceResponse,
    RegisterBrokerRequest,
    RegisterBrokerResponse,
    StatusRequest,
    StatusResponse,
    UnregisterBrokerRequest,
)
from tidemq.protocol.frame import PREFIX, FrameDecoder, FrameKind, encode_frame

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, ClusterEnv, Loop, StartBroker

pytestmark = pytest.mark.timeout(120)

TOPIC = "input"
MAGIC, VERSION = 0x54, 1


async def _topic(address: str, queues: int = 2, **config: str) -> None:
    async with aio.Admin(address) as admin:
        await admin.create_topic(TOPIC, queues, config=config)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def _closed_by_peer(reader: asyncio.StreamReader, timeout_s: float = 10.0) -> bool:
    """True once the peer closed the connection (EOF or reset) within `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


async def _still_serving(env: BrokerEnv) -> None:
    """A new client can produce and read back on the broker."""
    async with aio.Producer(env.address) as producer:
        receipt = await producer.send(TOPIC, b"still here", queue=0)
    client = ClusterClient(env.address)
    try:
        request = FetchRequest(topic=TOPIC, queue=0, offset=receipt.offset, max_bytes=1 << 16)
        response, _ = await client.request(env.address, request, FetchResponse)
    finally:
        await client.close()
    assert response.status == "found"


# ------------------------------------------------------------------ refused requests


def test_unknown_topic(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        async with aio.Producer(broker.address) as producer:
            with pytest.raises(TopicNotFound):
                await producer.send("nowhere", b"x")
            with pytest.raises(TopicNotFound):
                await producer.send_batch("nowhere", [b"x"], queue=0)
        consumer = aio.StreamConsumer(broker.address)
        try:
            consumer.assign([("nowhere", 0)])
            with pytest.raises(TopicNotFound):
                await consumer.poll(500)
        finally:
            await consumer.close()
        group = aio.GroupConsumer(broker.address, "g", ["nowhere"])
        try:
            with pytest.raises(TopicNotFound):
                await group.poll(500)
        finally:
            await group.close()
        # Straight to the broker, bypassing the client's routes.
        client = ClusterClient(broker.address)
        try:
            with pytest.raises(TopicNotFound, match="nowhere"):
                await client.call(
                    broker.address,
                    ListOffsetsRequest(topic="nowhere", queue=0),
                    ListOffsetsResponse,
                )
        finally:
            await client.close()

    loop.run(main())


def test_unknown_queue(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _topic(broker.address, queues=2)
        async with aio.Producer(broker.address) as producer:
            with pytest.raises(QueueNotFound):
                await producer.send(TOPIC, b"x", queue=2)
            with pytest.raises(ValueError, match="queue"):
                await producer.send(TOPIC, b"x", queue=-1)
        consumer = aio.StreamConsumer(broker.address)
        try:
            consumer.assign([(TOPIC, 7)])
            with pytest.raises(QueueNotFound):
                await consumer.poll(500)
        finally:
            await consumer.close()
        client = ClusterClient(broker.address)
        try:
            with pytest.raises(QueueNotFound, match="queue 5"):
                await client.call(
                    broker.address,
                    FetchRequest(topic=TOPIC, queue=5, offset=0, max_bytes=1024),
                    FetchResponse,
                )
        finally:
            await client.close()

    loop.run(main())


def test_message_too_large(loop: Loop, start_broker: StartBroker) -> None:
    env = start_broker(max_message_bytes=1 << 20)

    async def main() -> None:
        await _topic(env.address, queues=1, **{"max.message.bytes": "10000"})
        async with aio.Admin(env.address) as admin:
            await admin.create_topic("roomy", 1)
        async with aio.Producer(env.address) as producer:
            # Over the topic's max.message.bytes.
            with pytest.raises(BatchTooLarge, match=r"max\.message\.bytes"):
                await producer.send(TOPIC, b"x" * 20_000)
            with pytest.raises(BatchTooLarge):
                await producer.send_batch(TOPIC, [b"y" * 4_000] * 3)
            # Over the broker's max_message_bytes (1 MiB here).
            with pytest.raises(BatchTooLarge):
                await producer.send("roomy", b"z" * (2 << 20))
            # Over the broker's frame limit: refused by the producer before it is sent
            # (the broker would only close the connection).
            started = time.monotonic()
            with pytest.raises(BatchTooLarge):
                await producer.send("roomy", b"w" * (20 << 20))
            assert time.monotonic() - started < 5
            # Small messages still go through, on the same queues.
            assert (await producer.send(TOPIC, b"fits")).offset == 0
            assert (await producer.send("roomy", b"fits")).offset == 0
        async with aio.Producer(env.address, max_request_bytes=1_000) as small:
            with pytest.raises(BatchTooLarge):
                await small.send("roomy", b"v" * 2_000)
            # Sent together in one tick: the small one is not failed by its big neighbour.
            ok = await small.send_nowait("roomy", b"tiny")
            too_big = await small.send_nowait("roomy", b"u" * 2_000)
            await small.flush()
            assert (await ok).offset == 1
            with pytest.raises(BatchTooLarge):
                await too_big

    loop.run(main())


def test_producer_keeps_its_queue_after_a_refused_batch(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _topic(broker.address, queues=1, **{"max.message.bytes": "10000"})
        async with aio.Producer(broker.address) as producer:
            for round_ in range(3):
                # A refused batch between accepted ones, the later ones possibly in flight
                # when it is refused: they must still be stored, once each, in order.
                before = await producer.send_nowait(TOPIC, b"before-%d" % round_)
                await asyncio.sleep(0)  # its own batch
                refused = await producer.send_batch_nowait(TOPIC, [b"x" * 20_000])
                after = []
                for i in range(4):
                    after.append(await producer.send_nowait(TOPIC, b"after-%d-%d" % (round_, i)))
                    await asyncio.sleep(0)
                await producer.flush()
                with pytest.raises(BatchTooLarge):
                    await refused
                offsets = [(await before).offset] + [(await f).offset for f in after]
                assert offsets == list(range(offsets[0], offsets[0] + 5))
            # A refused batch with nothing behind it, then a plain send.
            with pytest.raises(BatchTooLarge):
                await producer.send(TOPIC, b"y" * 20_000)
            assert (await producer.send(TOPIC, b"last")).offset == 15
        consumer = aio.StreamConsumer(broker.address, start="earliest")
        try:
            consumer.assign([(TOPIC, 0)])
            got: list[aio.Message] = []
            deadline = time.monotonic() + 20
            while len(got) < 16:
                assert time.monotonic() < deadline
                got.extend(await consumer.poll(300))
        finally:
            await consumer.close()
        assert [m.offset for m in got] == list(range(16))
        assert len({m.value for m in got}) == 16  # no duplicates

    loop.run(main())


def test_invalid_topic_config_names_the_key(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            cases = {
                "retention.msx": "1000",  # unknown key (a typo)
                "retention.ms": "soon",
                "retention.bytes": "-7",
                "cleanup.policy": "sometimes",
                "max.message.bytes": "0",
                "message.timestamp.type": "WallClock",
            }
            for key, value in cases.items():
                with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
                    await admin.create_topic("configured", 1, config={key: value})
            assert await admin.list_topics() == []
            await admin.create_topic("configured", 1)
            with pytest.raises(ConfigError, match=r"retention\.ms"):
                await admin.alter_topic("configured", config={"retention.ms": "-2"})
            with pytest.raises(ConfigError, match="queues"):
                await admin.alter_topic("configured", queues=0)

    loop.run(main())


def test_malformed_requests(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _topic(broker.address, queues=1)
        good = encode_batch([MessageRecord(b"v", None, None, (), (), 1)])
        corrupt = bytearray(good)
        corrupt[-1] ^= 0xFF
        client = ClusterClient(broker.address)
        address = broker.address
        try:
            for body in (b"", b"garbage", bytes(corrupt), good[:-3]):
                with pytest.raises(InvalidBatch):
                    await client.call(
                        address, ProduceRequest(topic=TOPIC, queue=0), ProduceResponse, body
                    )
            with pytest.raises(InvalidRequest, match="epoch"):
                await client.call(
                    address,
                    ProduceRequest(topic=TOPIC, queue=0, producer_id=3),
                    ProduceResponse,
                    good,
                )
            for request, match in (
                (FetchRequest(topic=TOPIC, queue=0, offset=0, max_bytes=0), "max_bytes"),
                (
                    FetchRequest(topic=TOPIC, queue=0, offset=0, max_bytes=9, max_wait_ms=10**9),
                    "max_wait_ms",
                ),
                (FetchRequest(topic=TOPIC, queue=0, offset=-1, max_bytes=9), "offset"),
            ):
                with pytest.raises(InvalidRequest, match=match):
                    await client.call(address, request, FetchResponse)
            # Nothing was stored by any of them.
            bounds = await client.call(
                address, ListOffsetsRequest(topic=TOPIC, queue=0), ListOffsetsResponse
            )
            assert (bounds.min_offset, bounds.max_offset) == (0, 0)
            beyond = await client.call(
                address, FetchRequest(topic=TOPIC, queue=0, offset=99, max_bytes=9), FetchResponse
            )
            assert beyond.status == "offset_out_of_range"
        finally:
            await client.close()

    loop.run(main())


def test_undecodable_header_keeps_the_connection(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        reader, writer = await asyncio.open_connection(*_split(broker.address))
        decoder = FrameDecoder(1 << 20)

        async def answer(code: int, header: bytes, correlation_id: int) -> tuple[int, int]:
            """(error code or 0, correlation id) of the answer."""
            writer.writelines(encode_frame(FrameKind.REQUEST, code, correlation_id, header))
            await writer.drain()
            async with asyncio.timeout(10):
                while True:
                    frames = decoder.feed(await reader.read(65536))
                    if frames:
                        (frame,) = frames
                        if not frame.is_error:
                            return 0, frame.correlation_id
                        return int(error_from_frame(frame).code), frame.correlation_id

        invalid = int(ErrorCode.INVALID_REQUEST)
        try:
            # Garbage msgpack for a known code, an unknown code, a header of the wrong
            # shape, a topic name that is not UTF-8: each gets an INVALID_REQUEST answer
            # (not an internal error), and the connection stays usable.
            assert await answer(RequestCode.FETCH, b"\xc1garbage", 1) == (invalid, 1)
            assert await answer(999, b"\x80", 2) == (invalid, 2)
            assert await answer(RequestCode.PRODUCE, b"\x81\xa5topic\x07", 3) == (invalid, 3)
            not_utf8 = b"\x81\xa4name\xa2\xff\xfe"
            assert await answer(RequestCode.DESCRIBE_TOPIC, not_utf8, 4) == (invalid, 4)
            assert await answer(RequestCode.STATUS, b"\x80", 5) == (0, 5)
        finally:
            writer.close()
            await writer.wait_closed()

    loop.run(main())


def test_requests_to_the_wrong_kind_of_server(loop: Loop, cluster: ClusterEnv) -> None:
    async def main() -> None:
        client = ClusterClient(cluster.bootstrap)
        try:
            # A broker request to a name server, a name-server request to a broker that
            # runs without one.
            with pytest.raises(InvalidRequest, match="name server"):
                await client.call(cluster.bootstrap, StatusRequest(), StatusResponse)
            with pytest.raises(InvalidRequest, match="name server"):
                await client.call(cluster.addresses[0], GetRoutesRequest(), GetRoutesResponse)
        finally:
            await client.close()

    loop.run(main())


# ------------------------------------------------------------------ bad peers


def test_client_disconnecting_mid_frame(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _topic(broker.address)
        server = broker.broker._server
        # A producer connected before the bad peers, to check it keeps working after.
        async with aio.Producer(broker.address) as producer:
            await producer.send(TOPIC, b"before", queue=1)
            baseline = server.connections
            frame = b"".join(
                bytes(b)
                for b in encode_frame(FrameKind.REQUEST, RequestCode.STATUS, 1, b"\x80" * 40)
            )
            for cut in (1, 5, PREFIX.size, PREFIX.size + 10):
                _, writer = await asyncio.open_connection(*_split(broker.address))
                writer.write(frame[:cut])
                await writer.drain()
                writer.close()
                await writer.wait_closed()
            # A request sent whole, then the client goes away before the answer (a
            # fetch that parks): the answer has nowhere to go, and that is fine.
            _, writer = await asyncio.open_connection(*_split(broker.address))
            fetch = ClusterClient(broker.address)
            try:
                connection = await fetch.connection(broker.address)
                parked = asyncio.create_task(
                    connection.request(
                        FetchRequest(
                            topic=TOPIC, queue=0, offset=1_000_000, max_bytes=10, max_wait_ms=3_000
                        ),
                        FetchResponse,
                        timeout_s=10,
                    )
                )
                await asyncio.sleep(0)
            finally:
                await fetch.close()
            with contextlib.suppress(Exception):
                await parked
            writer.close()
            await writer.wait_closed()
            await loop.wait_until(
                lambda: server.connections <= baseline, what="the server to drop the dead peers"
            )
            assert (await producer.send(TOPIC, b"after", queue=1)).offset == 1
        await _still_serving(broker)

    loop.run(main())


@pytest.mark.parametrize(
    "prefix",
    [
        PREFIX.pack(1 << 31, MAGIC, VERSION, 0, 0, RequestCode.STATUS, 0, 1),  # 2 GiB announced
        PREFIX.pack(0xFFFFFFFF, MAGIC, VERSION, 0, 0, RequestCode.STATUS, 0, 1),
        PREFIX.pack(12, 0x00, VERSION, 0, 0, RequestCode.STATUS, 0, 1),  # bad magic
        PREFIX.pack(12, MAGIC, 9, 0, 0, RequestCode.STATUS, 0, 1),  # unknown version
        PREFIX.pack(12, MAGIC, VERSION, 0, 0, RequestCode.STATUS, 100, 1),  # header > frame
        PREFIX.pack(12, MAGIC, VERSION, 77, 0, RequestCode.STATUS, 0, 1),  # unknown kind
    ],
    ids=["2GiB", "4GiB", "magic", "version", "header-size", "kind"],
)
def test_protocol_violation_closes_only_that_connection(
    loop: Loop, broker: BrokerEnv, prefix: bytes
) -> None:
    async def main() -> None:
        await _topic(broker.address)
        other = await ClientConnection.open(broker.address, max_frame_bytes=1 << 20)
        try:
            reader, writer = await asyncio.open_connection(*_split(broker.address))
            writer.write(prefix)
            await writer.drain()
            started = time.monotonic()
            assert await _closed_by_peer(reader), (
                "the broker kept a connection that broke the protocol"
            )
            assert time.monotonic() - started < 5
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            # The connection opened before is unaffected, and new ones are served.
            status, _ = await other.request(StatusRequest(), StatusResponse, timeout_s=10)
            assert status.broker_name == "broker-0"
            await _still_serving(broker)
        finally:
            other.close()

    loop.run(main())


def test_parked_fetch_does_not_block_others(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _topic(broker.address)
        waiting = ClusterClient(broker.address)
        others = ClusterClient(broker.address)
        try:
            connection = await waiting.connection(broker.address)
            parked = asyncio.create_task(
                connection.request(
                    FetchRequest(
                        topic=TOPIC, queue=1, offset=0, max_bytes=1024, max_wait_ms=25_000
                    ),
                    FetchResponse,
                    timeout_s=40,
                )
            )
            await loop.wait_until(lambda: broker.broker._polling.parked == 1, what="the park")
            started = time.monotonic()
            # Other requests on the same connection (pipelined)...
            bounds, _ = await connection.request(
                ListOffsetsRequest(topic=TOPIC, queue=1), ListOffsetsResponse, timeout_s=10
            )
            assert bounds.max_offset == 0
            # ...and on other connections, a produce to another queue and a fetch of it.
            async with aio.Producer(broker.address) as producer:
                receipt = await producer.send(TOPIC, b"meanwhile", queue=0)
            fetched, _ = await others.request(
                broker.address,
                FetchRequest(topic=TOPIC, queue=0, offset=receipt.offset, max_bytes=1024),
                FetchResponse,
            )
            assert fetched.status == "found"
            assert time.monotonic() - started < 5, "other requests waited for the parked fetch"
            assert not parked.done()
            # Data for its queue answers the parked fetch.
            async with aio.Producer(broker.address) as producer:
                await producer.send(TOPIC, b"for the waiter", queue=1)
            response, _ = await asyncio.wait_for(parked, 10)
            assert response.status == "found"
        finally:
            await waiting.close()
            await others.close()

    loop.run(main())


def test_stop_with_parked_fetches_is_prompt(loop: Loop, start_broker: StartBroker) -> None:
    env = start_broker(shutdown_timeout_ms=30_000)

    async def main() -> None:
        await _topic(env.address)
        client = ClusterClient(env.address)
        consumer = aio.StreamConsumer(env.address, fetch_wait_ms=25_000)
        try:
            connection = await client.connection(env.address)
            parked = [
                asyncio.create_task(
                    connection.request(
                        FetchRequest(
                            topic=TOPIC, queue=q, offset=0, max_bytes=1024, max_wait_ms=25_000
                        ),
                        FetchResponse,
                        timeout_s=40,
                    )
                )
                for q in (0, 1)
            ]
            consumer.assign([(TOPIC, 0), (TOPIC, 1)])
            polling = asyncio.create_task(consumer.poll(timeout_ms=25_000))
            await loop.wait_until(lambda: env.broker._polling.parked == 4, what="four parks")
            started = time.monotonic()
            await env.broker.stop()
            stopped_in = time.monotonic() - started
            assert stopped_in < 5, f"stop took {stopped_in:.1f} s with fetches parked"
            # The parked fetches were answered (no data), not cut off.
            for task in parked:
                response, _ = await asyncio.wait_for(task, 5)
                assert response.status == "no_new_message"
            polling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await polling
            # And the broker is gone.
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection(*_split(env.address))
        finally:
            await consumer.close()
            await client.close()

    loop.run(main())


def test_route_hijack_and_made_up_producer_ids_are_refused(loop: Loop, broker: BrokerEnv) -> None:
    """Issue 16: a RegisterBrokerRequest for `broker-0` with another address, sent to a
    lone server's client port, made new producers connect to the attacker, and an
    UnregisterBrokerRequest made a topic vanish; a PRODUCE with a producer id the broker
    never issued was accepted. All refused now, and the routes are untouched."""

    async def main() -> None:
        await _topic(broker.address, queues=1)
        client = ClusterClient(broker.address)
        address = broker.address
        try:
            before = await client.call(address, GetRoutesRequest(), GetRoutesResponse)
            hijack = RegisterBrokerRequest(
                broker_name=broker.broker.config.broker_name,
                address="127.0.0.1:1",
                topics=[(TOPIC, 1, "MIXED", [0])],
            )
            with pytest.raises(InvalidRequest, match="REGISTER_BROKER refused"):
                await client.call(address, hijack, RegisterBrokerResponse)
            gone = UnregisterBrokerRequest(broker_name=broker.broker.config.broker_name)
            with pytest.raises(InvalidRequest, match="UNREGISTER_BROKER refused"):
                await client.call(address, gone, Empty)
            after = await client.call(address, GetRoutesRequest(), GetRoutesResponse)
            assert after.brokers == before.brokers
            assert after.routes == before.routes
            good = encode_batch([MessageRecord(b"v", None, None, (), (), 1)])
            made_up = ProduceRequest(
                topic=TOPIC, queue=0, producer_id=10**6, epoch=0, base_sequence=0
            )
            with pytest.raises(FencedProducer, match="never issued"):
                await client.call(address, made_up, ProduceResponse, good)
            issued = await client.call(address, InitProducerRequest(), InitProducerResponse)
            real = ProduceRequest(
                topic=TOPIC, queue=0, producer_id=issued.producer_id, epoch=0, base_sequence=0
            )
            stored = await client.call(address, real, ProduceResponse, good)
            assert stored.base_offset == 0
        finally:
            await client.close()

    loop.run(main())
