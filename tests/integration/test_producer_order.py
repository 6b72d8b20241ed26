"""One producer's sends to one queue are stored in the order they were made, on every send
path, through route lookups, broker restarts and lost connections; with idempotence,
never twice.

A model-based test: hypothesis draws a program of sends (each through one of the paths:
the asyncio `send_nowait`, an awaited `send` in a task of its own, `send_batch_nowait`,
the sync `Producer.send_async` and `send_batch_async`, and the blocking sync `send`),
mixed with loop turns, waits for what was sent, first sends to topics whose route the
producer does not know yet, and restarts of the broker (same port and data, so every
connection drops and in-flight requests are retried). Then it reads every queue back and
checks, per producer and queue, that the sequence numbers are increasing, that nothing
acknowledged is missing, and that nothing is there twice. Issue 15: sends made while the
route was being looked up were overtaken by later sends that took the fast path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tidemq
from tidemq import aio
from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.core.message import Receipt
from tidemq.store.config import FlushMode, StoreConfig

if TYPE_CHECKING:
    from tests.integration.conftest import ThreadedBroker

TOPICS = ("o-a", "o-b", "o-c")
QUEUES = 4
KEYS: tuple[bytes | None, ...] = (b"k0", b"k1", b"k2", b"k3", b"k4", None)
PATHS = ("nowait", "task", "batch", "sync", "sync-batch")
T = TypeVar("T")
BURST = 150
EXAMPLES = 60 if os.environ.get("TIDEMQ_SOAK") == "1" else 8

_send = st.tuples(
    st.just("send"),
    st.sampled_from(TOPICS),
    st.sampled_from(KEYS),
    st.sampled_from(PATHS),
    st.integers(1, 4),  # messages (for the batch paths)
)
#: Many sends in a row, no await between them, keys taking turns (the issue's case).
_burst = st.tuples(st.just("burst"), st.sampled_from(TOPICS), st.sampled_from(PATHS))
_op = st.one_of(
    _burst,
    _send,
    _send,
    _send,
    # A sync `Producer.send` (on a thread of its own, awaited as its caller waits): it is
    # written on the caller's thread when nothing of the producer is on its way.
    st.tuples(st.just("blocking"), st.sampled_from(TOPICS), st.sampled_from(KEYS)),
    st.tuples(st.just("blocking"), st.sampled_from(TOPICS), st.sampled_from(KEYS)),
    st.tuples(st.just("yield"), st.integers(1, 3)),
    st.tuples(st.just("settle")),
    st.tuples(st.just("restart")),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _LoopBroker:
    """The same, on the program's own event loop (which keeps running after a stop, so
    that every connection the stopped broker had finishes closing)."""

    def __init__(self, data_dir: Path, port: int) -> None:
        store = StoreConfig(data_dir=data_dir, flush_mode=FlushMode.ASYNC)
        self._config = BrokerConfig(port=port, store=store, shutdown_timeout_ms=5_000)
        self._broker: Broker | None = None

    async def start(self) -> str:
        self._broker = Broker(self._config, embedded_nameserver=True)
        return await self._broker.start()

    async def stop(self) -> None:
        if self._broker is not None:
            broker, self._broker = self._broker, None
            await broker.stop()

    async def restart(self) -> None:
        await self.stop()
        await self.start()


@dataclass
class _Sent:
    """What each producer sent: (topic, sequence numbers) per future, in call order."""

    futures: list[tuple[str, list[int], Any]] = field(default_factory=list)
    next_seq: int = 0

    def take(self, n: int) -> list[int]:
        seqs = list(range(self.next_seq, self.next_seq + n))
        self.next_seq += n
        return seqs


def _value(producer: int, seq: int) -> bytes:
    return b"%d:%d" % (producer, seq)


async def _run_program(data_dir: Path, program: Sequence[tuple[Any, ...]]) -> None:
    broker = _LoopBroker(data_dir, _free_port())
    address = await broker.start()
    try:
        await _run_sends(address, program, broker)
    finally:
        await broker.stop()
        # A connection the kernel accepted just before the listener closed gets its
        # transport from a callback the loop has not run yet; `asyncio.run` closing the
        # loop right away would leave that transport unclosed (a ResourceWarning, seen
        # under load). A few turns of the loop run it: the stopped server aborts it.
        for _ in range(20):
            await asyncio.sleep(0)


async def _run_sends(address: str, program: Sequence[tuple[Any, ...]], broker: _LoopBroker) -> None:
    async with aio.Admin(address) as admin:
        for topic in TOPICS:
            await admin.create_topic(topic, QUEUES)
    loop = asyncio.get_running_loop()
    producer = aio.Producer(address)  # producer 0: asyncio
    sync_producer = tidemq.Producer(address)  # producer 1: sync, on the client loop
    sent = [_Sent(), _Sent()]
    tasks: list[asyncio.Task[Receipt]] = []
    try:
        for op in program:
            if op[0] == "send":
                _, topic, key, path, n = op
                _start(producer, sync_producer, sent, tasks, topic, key, path, n)
            elif op[0] == "burst":
                _, topic, path = op
                for i in range(BURST):
                    key = KEYS[i % len(KEYS)]
                    _start(producer, sync_producer, sent, tasks, topic, key, path, 1 + i % 3)
            elif op[0] == "blocking":
                _, topic, key = op
                seqs = sent[1].take(1)
                done = loop.run_in_executor(
                    None, functools.partial(sync_producer.send, topic, _value(1, seqs[0]), key=key)
                )
                sent[1].futures.append((topic, seqs, done))
                await asyncio.wait([done], timeout=60)
            elif op[0] == "yield":
                for _ in range(op[1]):
                    await asyncio.sleep(0)
            elif op[0] == "settle":
                await _settle(sent)
            elif op[0] == "restart":
                await broker.restart()
        await producer.flush()
        await loop.run_in_executor(None, sync_producer.flush)
        await _settle(sent)
    finally:
        await producer.close()
        await loop.run_in_executor(None, sync_producer.close)
    await _check(address, sent)


def _start(  # noqa: PLR0917
    producer: aio.Producer,
    sync_producer: tidemq.Producer,
    sent: list[_Sent],
    tasks: list[asyncio.Task[Receipt]],
    topic: str,
    key: bytes | None,
    path: str,
    n: int,
) -> None:
    if path in ("nowait", "task", "batch"):
        record, who = sent[0], 0
    else:
        record, who = sent[1], 1
    if path in ("batch", "sync-batch"):
        seqs = record.take(n)
        values = [_value(who, s) for s in seqs]
        keys = [key] * n if key is not None else None
        if path == "batch":
            fut: Any = asyncio.ensure_future(producer.send_batch_nowait(topic, values, keys=keys))
        else:
            fut = sync_producer.send_batch_async(topic, values, keys=keys)
        record.futures.append((topic, seqs, fut))
        return
    seqs = record.take(1)
    value = _value(who, seqs[0])
    if path == "nowait":
        fut = asyncio.ensure_future(producer.send_nowait(topic, value, key=key))
    elif path == "task":
        fut = asyncio.get_running_loop().create_task(producer.send(topic, value, key=key))
        tasks.append(fut)
    else:
        fut = sync_producer.send_async(topic, value, key=key)
    record.futures.append((topic, seqs, fut))


async def _result(fut: Any) -> Any:
    if isinstance(fut, concurrent.futures.Future):
        return await asyncio.wrap_future(fut)
    result = await fut
    if isinstance(result, asyncio.Future):  # send_nowait's coroutine gives a future
        return await result
    return result


async def _settle(sent: list[_Sent]) -> None:
    for record in sent:
        for _, _, fut in record.futures:
            await _result(fut)


async def _check(address: str, sent: list[_Sent]) -> None:
    acked: dict[tuple[int, int], tuple[str, int, int]] = {}  # (producer, seq) -> where
    for who, record in enumerate(sent):
        for topic, seqs, fut in record.futures:
            result = await _result(fut)
            receipts = [result] if isinstance(result, Receipt) else list(result)
            assert len(receipts) == len(seqs)
            for seq, receipt in zip(seqs, receipts, strict=True):
                assert receipt.topic == topic
                acked[(who, seq)] = (topic, receipt.queue, receipt.offset)
    consumer = aio.StreamConsumer(address, start="earliest")
    consumer.assign([(t, q) for t in TOPICS for q in range(QUEUES)])
    stored: dict[tuple[int, int], tuple[str, int, int]] = {}
    order: dict[tuple[str, int, int], list[int]] = {}  # (topic, queue, producer) -> seqs
    try:
        for _ in range(200):
            messages = await consumer.poll(timeout_ms=300)
            if not messages:
                break
            for m in messages:
                assert m.value is not None
                who, seq = (int(x) for x in m.value.split(b":"))
                assert (who, seq) not in stored, f"stored twice: {m.value!r}"
                stored[(who, seq)] = (m.topic, m.queue, m.offset)
                order.setdefault((m.topic, m.queue, who), []).append(seq)
    finally:
        await consumer.close()
    assert stored == acked  # every acknowledged message, where its receipt said, once
    for where, seqs in order.items():
        assert seqs == sorted(seqs), f"out of send order in {where}: {seqs}"


# Under load (2 of 3 full runs on 2026-11-27) a socket of the broker restarts this test
# makes is garbage-collected unclosed: a ResourceWarning, not an ordering failure. Its
# cause is not found yet (issue 22's closing note); this test checks order, so that
# warning alone is let through here, and only here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(program=st.lists(_op, min_size=5, max_size=60))
def test_each_queue_holds_a_producers_messages_in_send_order(
    program: list[tuple[Any, ...]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    data_dir = tmp_path_factory.mktemp("order")
    asyncio.run(asyncio.wait_for(_run_program(data_dir, program), 120))


def test_sends_made_while_the_route_is_looked_up_are_not_overtaken(
    sync_broker: ThreadedBroker,
) -> None:
    """The issue's case: 2,000 keyed `send_async` calls right after start, to a topic
    the producer has not seen; later calls must not overtake those waiting for the
    route (on the old code they did: queue 0 out of order, in 2 runs of 2)."""
    address = sync_broker.address
    tidemq.Admin(address).create_topic("burst", QUEUES)
    with tidemq.Producer(address) as producer:
        futures = []
        for i in range(2_000):
            futures.append(producer.send_async("burst", b"%d" % i, key=b"k%d" % (i % 50)))
            if i % 20 == 0:
                # Let the client loop run meanwhile, so the route arrives mid-burst: this
                # shapes the interleaving; the test passes or fails on order alone.
                time.sleep(0.0005)
        receipts = [f.result(60) for f in futures]
    by_queue: dict[int, list[int]] = {}
    for receipt in receipts:
        by_queue.setdefault(receipt.queue, []).append(receipt.offset)
    for queue, offsets in by_queue.items():
        assert offsets == sorted(offsets), f"queue {queue} stored sends out of order"
