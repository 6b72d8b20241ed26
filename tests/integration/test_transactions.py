"""Transactional messages against a real broker: invisible until commit, atomic over
queues and topics, rollback, the context manager, check-back (commit, rollback, unknown,
a checker that raises), the broker's own rollback after its checks, sink markers, bad
input, and a restart with transactions in every state."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest

from tidemq import aio
from tidemq.broker.broker import Broker
from tidemq.client.cluster import ClusterClient
from tidemq.core.errors import (
    InvalidRequest,
    MessageTypeMismatch,
    TransactionStateError,
    UnknownTransaction,
)
from tidemq.protocol.commands import EndTxnRequest, EndTxnResponse

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop, StartBroker

pytestmark = pytest.mark.timeout(120)

GROUP = "orders-tx"
#: Check-back settings short enough for tests.
FAST_CHECKS = {"txn_check_delay_ms": 200, "txn_check_interval_ms": 200, "txn_max_checks": 3}


async def _create(address: str, topic: str, queues: int = 2, message_type: str = "MIXED") -> None:
    async with aio.Admin(address) as admin:
        await admin.create_topic(topic, queues, message_type=message_type)


async def _visible(
    address: str, topic: str, queues: int = 2, wait_ms: int = 300
) -> list[aio.Message]:
    consumer = aio.StreamConsumer(address, start="earliest")
    consumer.assign([(topic, q) for q in range(queues)])
    out: list[aio.Message] = []
    try:
        while batch := await consumer.poll(wait_ms):
            out.extend(batch)
    finally:
        await consumer.close()
    return out


async def _wait_visible(
    address: str, topic: str, count: int, timeout_s: float = 15.0
) -> list[aio.Message]:
    deadline = time.monotonic() + timeout_s
    while True:
        got = await _visible(address, topic, wait_ms=100)
        if len(got) >= count or time.monotonic() > deadline:
            return got


def test_commit_publishes_all_queues_at_once(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, "orders")
        await _create(broker.address, "audit", 1)
        async with aio.TransactionProducer(broker.address, GROUP) as producer:
            tx = await producer.begin()
            half = [
                await tx.send("orders", b"o1", queue=0, key=b"k1"),
                await tx.send("orders", b"o2", queue=1),
            ]
            half += await tx.send_batch("audit", [b"a1", b"a2"], queue=0)
            assert {r.offset for r in half} == {-1}
            assert await _visible(broker.address, "orders") == []
            assert await _visible(broker.address, "audit", 1) == []
            receipts = await tx.commit()
        assert [r.message_id for r in receipts] == [r.message_id for r in half]
        orders = await _visible(broker.address, "orders")
        audit = await _visible(broker.address, "audit", 1)
        assert sorted(m.value or b"" for m in orders) == [b"o1", b"o2"]
        assert [m.value for m in audit] == [b"a1", b"a2"]
        by_value = {m.value: m for m in orders + audit}
        for r, value in zip(receipts, [b"o1", b"o2", b"a1", b"a2"], strict=True):
            m = by_value[value]
            assert (m.topic, m.queue, m.offset, m.message_id) == (
                r.topic, r.queue, r.offset, r.message_id,
            )  # fmt: skip
        assert by_value[b"o1"].key == b"k1"

    loop.run(main())


def test_rollback_and_context_manager(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, "orders")
        async with aio.TransactionProducer(broker.address, GROUP) as producer:
            tx = await producer.begin()
            await tx.send("orders", b"never", queue=0)
            await tx.rollback()
            with pytest.raises(TransactionStateError, match="rolled back"):
                await tx.send("orders", b"late", queue=0)
            async with producer.transaction() as tx2:
                await tx2.send("orders", b"kept", queue=1)

            async def failing_block() -> None:
                async with producer.transaction() as tx3:
                    await tx3.send("orders", b"undone", queue=1)
                    raise RuntimeError("local failure")

            with pytest.raises(RuntimeError, match="local failure"):
                await failing_block()
        got = await _visible(broker.address, "orders")
        assert [m.value for m in got] == [b"kept"]
        async with aio.Admin(broker.address) as admin:
            status = await admin.transaction_status()
        assert (status.committed, status.rolled_back, status.open) == (1, 2, ())

    loop.run(main())


def test_end_answers_for_every_state(loop: Loop, broker: BrokerEnv) -> None:
    """The state table's rows, through the wire: unknown id, second commit, commit after
    rollback, rollback after commit, a marker on a rollback."""

    async def main() -> None:
        await _create(broker.address, "orders")
        cluster = ClusterClient(broker.address)
        try:

            async def end(ids: list[str], commit: bool, **kw: object) -> EndTxnResponse:
                req = EndTxnRequest(txn_ids=ids, commit=commit, **kw)  # type: ignore[arg-type]
                return await cluster.call(broker.address, req, EndTxnResponse)

            with pytest.raises(UnknownTransaction, match="no transaction"):
                await end(["f" * 32], True)
            async with aio.TransactionProducer(broker.address, GROUP) as producer:
                tx = await producer.begin()
                await tx.send("orders", b"x", queue=0)
                [(_, txn_id)] = tx.refs
                first = await end([txn_id], True)
                again = await end([txn_id], True)
                assert (first.outcome, first.already, again.already) == ("committed", False, True)
                assert again.published == first.published  # a retried commit is a no-op
                with pytest.raises(TransactionStateError, match="it was committed"):
                    await end([txn_id], False)
                tx2 = await producer.begin()
                await tx2.send("orders", b"y", queue=0)
                [(_, txn2)] = tx2.refs
                await end([txn2], False)
                assert (await end([txn2], False)).already
                with pytest.raises(TransactionStateError, match="it was rolled back"):
                    await end([txn2], True)
                tx3 = await producer.begin()
                await tx3.send("orders", b"z", queue=0)
                with pytest.raises(TransactionStateError, match="end them separately"):
                    await end([txn_id, tx3.refs[0][1]], True)
                with pytest.raises(InvalidRequest, match="marker goes with a commit"):
                    await end([tx3.refs[0][1]], False, sink_id="s", batch_id=1)
                with pytest.raises(InvalidRequest, match="1-10000 ids"):
                    await end([], True)
        finally:
            await cluster.close()
        assert sorted(m.value or b"" for m in await _visible(broker.address, "orders")) == [b"x"]

    loop.run(main())


def test_transaction_topic_type(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, "tx-only", message_type="TRANSACTION")
        await _create(broker.address, "plain", message_type="NORMAL")
        async with aio.Producer(broker.address) as producer:
            with pytest.raises(MessageTypeMismatch, match="TRANSACTION; an ordinary"):
                await producer.send("tx-only", b"x", queue=0)
        txp = aio.TransactionProducer(broker.address, GROUP)
        async with txp, txp.transaction() as tx:
            await tx.send("tx-only", b"ok", queue=0)
            with pytest.raises(MessageTypeMismatch, match="NORMAL; a transactional"):
                await tx.send("plain", b"x", queue=0)
        assert [m.value for m in await _visible(broker.address, "tx-only")] == [b"ok"]

    loop.run(main())


def test_check_back_commits_and_rolls_back(loop: Loop, start_broker: StartBroker) -> None:
    env = start_broker(**FAST_CHECKS)
    asked: list[int] = []

    def checker(check: aio.TransactionCheck) -> str:
        asked.append(check.check)
        assert check.group == GROUP
        assert check.topics == ("orders",)
        return "commit" if check.messages == 2 else "rollback"

    async def main() -> None:
        await _create(env.address, "orders")
        # A producer that "crashes" after its sends: it never ends its transactions.
        crashed = aio.TransactionProducer(env.address, GROUP)
        tx = await crashed.begin()
        await tx.send_batch("orders", [b"c1", b"c2"], queue=0)
        tx2 = await crashed.begin()
        await tx2.send("orders", b"r1", queue=1)
        await crashed.close()
        async with aio.TransactionProducer(env.address, GROUP, checker=checker) as live:
            await live.begin()  # registers the checker with the broker
            got = await _wait_visible(env.address, "orders", 2)
            assert sorted(m.value or b"" for m in got) == [b"c1", b"c2"]
            async with aio.Admin(env.address) as admin:
                deadline = time.monotonic() + 10
                while (await admin.transaction_status()).open:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                status = await admin.transaction_status()
        assert (status.committed, status.rolled_back, status.discarded) == (1, 1, ())
        assert asked
        assert set(asked) == {1}

    loop.run(main())


def test_unknown_answers_end_in_a_listed_rollback(loop: Loop, start_broker: StartBroker) -> None:
    env = start_broker(**FAST_CHECKS)
    calls: list[str] = []

    async def raising(check: aio.TransactionCheck) -> str:
        calls.append(check.txn_id)
        if len(calls) % 2:
            raise RuntimeError("the checker's database is down")
        return "unknown"

    async def main() -> None:
        await _create(env.address, "orders")
        async with aio.TransactionProducer(env.address, GROUP, checker=raising) as producer:
            tx = await producer.begin()
            await tx.send("orders", b"orphan", queue=0)
            async with aio.Admin(env.address) as admin:
                deadline = time.monotonic() + 15
                while not (await admin.transaction_status()).discarded:
                    assert time.monotonic() < deadline, "never discarded"
                    await asyncio.sleep(0.05)
                status = await admin.transaction_status()
            [d] = status.discarded
            assert (d.txn_id, d.group, d.messages) == (tx.refs[0][1], GROUP, 1)
            assert d.reason == "no decision after 3 check-backs"
            assert len(calls) == 3
            with pytest.raises(TransactionStateError, match=r"rolled back \(no decision"):
                await tx.commit()
        assert await _visible(env.address, "orders") == []

    loop.run(main())


def test_sink_marker_is_committed_with_the_data(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _create(broker.address, "out")
        async with aio.TransactionProducer(broker.address, "spark-sink") as driver:
            assert await driver.sink_marker("job-1") == -1
            # Two "executors" write inside their own transactions and hand over refs.
            refs = []
            for part in range(2):
                async with aio.TransactionProducer(broker.address, "spark-sink") as executor:
                    tx = await executor.begin()
                    await tx.send_batch(
                        "out", [b"p%d-%d" % (part, i) for i in range(3)], queue=part
                    )
                    refs.extend(tx.refs)
            assert await _visible(broker.address, "out") == []
            receipts = await driver.commit_many(refs, sink_id="job-1", batch_id=7)
            assert len(receipts) == 6
            assert await driver.sink_marker("job-1") == 7
            # A marker-only commit (an empty micro-batch) moves the marker too.
            await driver.commit_many([], sink_id="job-1", batch_id=8)
            assert await driver.sink_marker("job-1") == 8
            assert await driver.sink_marker("job-2") == -1
        assert len(await _visible(broker.address, "out")) == 6

    loop.run(main())


def test_restart_keeps_every_transaction_state(loop: Loop, start_broker: StartBroker) -> None:
    env = start_broker(txn_check_delay_ms=300, txn_check_interval_ms=300, txn_max_checks=50)

    async def before() -> str:
        await _create(env.address, "orders")
        p = aio.TransactionProducer(env.address, GROUP)
        committed = await p.begin()
        await committed.send("orders", b"committed", queue=0)
        await committed.commit(sink_id="s", batch_id=3)
        rolled = await p.begin()
        await rolled.send("orders", b"rolled-back", queue=0)
        await rolled.rollback()
        undecided = await p.begin()
        await undecided.send("orders", b"undecided", queue=1)
        await p.close()
        return undecided.refs[0][1]

    undecided_id = loop.run(before())
    loop.run(env.broker.stop())
    restarted = Broker(env.broker.config, embedded_nameserver=True)
    address = loop.run(restarted.start())
    seen: list[str] = []

    def checker(check: aio.TransactionCheck) -> str:
        seen.append(check.txn_id)
        return "commit"

    async def after() -> None:
        assert [m.value for m in await _visible(address, "orders")] == [b"committed"]
        async with aio.TransactionProducer(address, GROUP, checker=checker) as p:
            assert await p.sink_marker("s") == 3
            await p.begin()
            got = await _wait_visible(address, "orders", 2)
        assert sorted(m.value or b"" for m in got) == [b"committed", b"undecided"]
        assert seen[0] == undecided_id

    try:
        loop.run(after())
    finally:
        loop.run(restarted.stop())


def test_a_checker_that_hangs_counts_as_unknown(loop: Loop, start_broker: StartBroker) -> None:
    env = start_broker(
        txn_check_delay_ms=100,
        txn_check_interval_ms=100,
        txn_max_checks=2,
        txn_check_timeout_ms=200,
    )

    async def hangs(check: aio.TransactionCheck) -> str:
        await asyncio.sleep(5)
        return "commit"

    async def main() -> None:
        await _create(env.address, "orders")
        async with aio.TransactionProducer(env.address, GROUP, checker=hangs) as producer:
            tx = await producer.begin()
            await tx.send("orders", b"stuck", queue=0)
            async with aio.Admin(env.address) as admin:
                deadline = time.monotonic() + 15
                while not (await admin.transaction_status()).discarded:
                    assert time.monotonic() < deadline, "never discarded"
                    await asyncio.sleep(0.05)
        assert await _visible(env.address, "orders") == []

    loop.run(main())
