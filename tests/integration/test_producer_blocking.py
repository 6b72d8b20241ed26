"""The sync `Producer.send` written and answered on the caller's thread
(`client/blocking_send.py`): used when nothing of the producer is on its way, it must keep
what the loop's paths guarantee. Per queue, the stored order is the send order whatever
the mix of blocking sends, `send_async` and batches; an answer lost after the write is
resent by the loop's sender under the same stamp, and stored once; a refusal for good
raises at the call, and the producer keeps working."""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import TYPE_CHECKING

import pytest

import tidemq
from tidemq.core.errors import BatchTooLarge

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.integration.conftest import ThreadedBroker

pytestmark = pytest.mark.timeout(120)

TOPIC = "blocking"


def _read_all(address: str, count: int, queue: int = 0) -> list[tidemq.Message]:
    """Every message of the queue, once `count` arrived (and a little longer for extras)."""
    with tidemq.StreamConsumer(address, start="earliest") as consumer:
        consumer.assign([(TOPIC, queue)])
        out: list[tidemq.Message] = []
        deadline = time.monotonic() + 20
        while len(out) < count:
            assert time.monotonic() < deadline, f"got {len(out)} of {count} messages"
            out.extend(consumer.poll(500))
        out.extend(consumer.poll(200))
        return out


def _links(producer: tidemq.Producer) -> dict[str, object]:
    return producer._blocking._links  # type: ignore[return-value]


def test_blocking_sends_keep_order_with_every_other_path(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    with tidemq.Admin(address) as admin:
        admin.create_topic(TOPIC, 2)
    values: list[bytes] = []
    with tidemq.Producer(address) as producer:

        def send(value: bytes) -> tidemq.Receipt:
            values.append(value)
            return producer.send(TOPIC, value, queue=0)

        # The first sends look the route up on the loop; then the caller's thread sends.
        offsets = [send(b"s-%d" % i).offset for i in range(20)]
        assert offsets == list(range(20))
        assert _links(producer), "no send took the blocking path"
        # Sends handed to the loop are still on their way: the next sync sends go after
        # them (through the loop), then the blocking path takes over again.
        futures = []
        for i in range(30):
            values.append(b"a-%d" % i)
            futures.append(producer.send_async(TOPIC, b"a-%d" % i, queue=0))
        values.append(b"b-0")
        batch = producer.send_batch_async(TOPIC, [b"b-0"], queue=0)
        after = [send(b"t-%d" % i).offset for i in range(10)]
        assert [f.result(30).offset for f in futures] == list(range(20, 50))
        assert [r.offset for r in batch.result(30)] == [50]
        assert after == list(range(51, 61))
        assert [send(b"u-%d" % i).offset for i in range(5)] == list(range(61, 66))
    got = _read_all(address, len(values))
    assert [m.value for m in got] == values


def test_threads_share_the_blocking_path(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    with tidemq.Admin(address) as admin:
        admin.create_topic(TOPIC, 1)
    results: list[int] = []
    lock = threading.Lock()
    with tidemq.Producer(address) as producer:
        producer.send(TOPIC, b"first", queue=0)

        def worker(n: int) -> None:
            for i in range(40):
                r = producer.send(TOPIC, b"t-%d-%d" % (n, i), queue=0)
                with lock:
                    results.append(r.offset)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert sorted(results) == list(range(1, 161))
    got = _read_all(address, 161)
    assert len(got) == 161
    # Each thread's messages are stored in the order it sent them.
    for n in range(4):
        mine = [m.value for m in got if (m.value or b"").startswith(b"t-%d-" % n)]
        assert mine == [b"t-%d-%d" % (n, i) for i in range(40)]


def test_an_answer_lost_after_the_write_is_resent_and_stored_once(
    sync_broker: ThreadedBroker,
) -> None:
    """The link stops reading right before a send: the request reaches the broker (which
    stores it), the answer never arrives. The loop's sender resends it with the same
    producer id and sequence, and the broker answers with the offset it gave."""
    address = sync_broker.address
    with tidemq.Admin(address) as admin:
        admin.create_topic(TOPIC, 1)
    with tidemq.Producer(address) as producer:
        for i in range(3):
            assert producer.send(TOPIC, b"m-%d" % i, queue=0).offset == i
        expected = 3
        for i in range(3, 8):
            links = _links(producer)
            assert len(links) == 1
            (link,) = links.values()
            link.sock.shutdown(socket.SHUT_RD)  # type: ignore[attr-defined]
            assert producer.send(TOPIC, b"m-%d" % i, queue=0).offset == expected
            # A link whose outcome was unknown is not used again; the next blocking send
            # opens another, with a producer id of its own.
            assert link not in _links(producer).values()
            assert producer.send(TOPIC, b"n-%d" % i, queue=0).offset == expected + 1
            expected += 2
    got = _read_all(address, 13)
    values = [m.value for m in got]
    assert len(values) == len(set(values)) == 13
    assert [v for v in values if (v or b"").startswith(b"m-")] == [b"m-%d" % i for i in range(8)]


def test_a_refusal_raises_at_the_call_and_the_producer_goes_on(
    start_sync_broker: Callable[..., ThreadedBroker],
) -> None:
    broker = start_sync_broker(max_message_bytes=64 << 10)
    address = broker.address
    with tidemq.Admin(address) as admin:
        admin.create_topic(TOPIC, 1)
    with tidemq.Producer(address) as producer:
        # The first send looks the route up on the loop; the second is a blocking one.
        assert [producer.send(TOPIC, b"ok-%d" % i, queue=0).offset for i in (0, 1)] == [0, 1]
        assert _links(producer)
        with pytest.raises(BatchTooLarge):
            producer.send(TOPIC, b"x" * (128 << 10), queue=0)
        assert [producer.send(TOPIC, b"ok-%d" % i, queue=0).offset for i in (2, 3)] == [2, 3]
    got = _read_all(address, 4)
    assert [m.value for m in got] == [b"ok-%d" % i for i in range(4)]


def test_a_link_the_broker_closed_is_replaced_before_a_send(sync_broker: ThreadedBroker) -> None:
    """The broker closes an idle link (its idle timeout): the next blocking send sees the
    close (one peek, for a link unused a while) and opens another, rather than writing
    into the closed one and handing the message over with an unknown outcome."""
    address = sync_broker.address
    with tidemq.Admin(address) as admin:
        admin.create_topic(TOPIC, 1)
    with tidemq.Producer(address) as producer:
        assert [producer.send(TOPIC, b"m-%d" % i, queue=0).offset for i in (0, 1)] == [0, 1]
        (link,) = _links(producer).values()
        local = link.sock.getsockname()  # type: ignore[attr-defined]
        server = sync_broker.broker._server

        def close_it() -> None:
            for conn in list(server._conns):
                if conn.peer == f"{local[0]}:{local[1]}":
                    conn.close()

        sync_broker._loop.call_soon_threadsafe(close_it)
        readable, _, _ = select.select([link.sock], [], [], 10)  # type: ignore[attr-defined]
        assert readable  # the close arrived
        link.used -= 10  # type: ignore[attr-defined]  # as if unused for 10 s
        assert producer.send(TOPIC, b"m-2", queue=0).offset == 2
        (again,) = _links(producer).values()  # sent on a new link, not handed over
        assert again is not link
    got = _read_all(address, 3)
    assert [m.value for m in got] == [b"m-0", b"m-1", b"m-2"]
