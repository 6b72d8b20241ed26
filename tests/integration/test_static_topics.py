"""Static topics on three brokers behind a name server (in this process, real sockets):
create over two brokers, remap onto the third and back while keyed messages keep coming,
then read everything from offset 0: dense logical offsets, per-key order, every key in its
queue, nothing lost or duplicated; and the bad input a remap must refuse."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
from tests.integration.conftest import wait_until

from tidemq import aio
from tidemq.client.cluster import ClusterClient
from tidemq.cluster.route import queue_for_key
from tidemq.core.errors import (
    ConfigError,
    InvalidRequest,
    TopicAlreadyExists,
    UnknownMessage,
)
from tidemq.protocol.commands import AlterTopicRequest, TopicInfoMsg
from tidemq.protocol.static_messages import StaticChainsResponse, StaticSealRequest

if TYPE_CHECKING:
    from tests.integration.conftest import ClusterEnv, Loop

pytestmark = pytest.mark.timeout(120)

TOPIC = "orders"
QUEUES = 4
KEYS = 24


async def _send_round(producer: aio.Producer, round_no: int) -> list[tuple[bytes, bytes, int]]:
    """One message per key; (key, value, queue) of each acknowledged one."""
    sent = []
    for k in range(KEYS):
        key = f"k{k}".encode()
        value = f"{round_no}:{k}".encode()
        result = await producer.send(TOPIC, value, key=key)
        assert result.queue == queue_for_key(key, QUEUES)
        sent.append((key, value, result.queue))
    return sent


async def _read_all(bootstrap: str, expected: int) -> dict[int, list[tuple[int, bytes, bytes]]]:
    """Every message of the topic from offset 0: queue -> [(offset, key, value)]."""
    got: dict[int, list[tuple[int, bytes, bytes]]] = {q: [] for q in range(QUEUES)}
    consumer = aio.StreamConsumer(bootstrap, start="earliest", fetch_wait_ms=50)
    try:
        consumer.assign([(TOPIC, q) for q in range(QUEUES)])
        total = 0
        for _ in range(400):
            for m in await consumer.poll(200):
                assert m.value is not None
                got[m.queue].append((m.offset, m.key or b"", m.value))
                total += 1
            if total >= expected:
                break
    finally:
        await consumer.close()
    return got


async def _poll_committing(
    consumer: aio.GroupConsumer | aio.BroadcastConsumer, count: int
) -> list[bytes]:
    """Values polled (committing after each poll) until `count` came; closes `consumer`."""
    seen: list[bytes] = []
    try:
        for _ in range(600):
            for m in await consumer.poll(100):
                assert m.value is not None
                seen.append(m.value)
            await consumer.commit()
            if len(seen) >= count:
                break
    finally:
        await consumer.close()
    return seen


async def _expire_everything_on(cluster: ClusterEnv, n: int) -> None:
    """Retention removes every message of TOPIC on the n-th broker (retention.bytes 0
    there only), now."""
    client = ClusterClient(cluster.bootstrap)
    try:
        alter = AlterTopicRequest(name=TOPIC, config={"retention.bytes": "0"})
        await client.call(cluster.addresses[n], alter, TopicInfoMsg)
    finally:
        await client.close()
    await cluster.brokers[n]._gateway.call(lambda s: s.enforce_retention())


def test_remap_onto_another_broker_and_back_keeps_every_message(
    loop: Loop, cluster3: ClusterEnv
) -> None:
    async def main() -> None:
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            info = await admin.create_topic(
                TOPIC, QUEUES, static=True, brokers=["broker-a", "broker-b"]
            )
            assert info.static
            assert [c.links[0].broker for c in info.chains] == [
                "broker-a",
                "broker-b",
                "broker-a",
                "broker-b",
            ]
            sent = await _send_round(producer, 0)
            report = await admin.remap_topic(TOPIC, brokers=["broker-c"])
            assert sorted(s.queue for s in report.switches) == list(range(QUEUES))
            sent += await _send_round(producer, 1)
            back = await admin.remap_topic(TOPIC, brokers=["broker-a", "broker-b"])
            assert len(back.switches) == QUEUES
            sent += await _send_round(producer, 2)
            one = await admin.remap_topic(TOPIC, queue=0, to="broker-c")
            assert [(s.queue, s.target) for s in one.switches] == [(0, "broker-c")]
            sent += await _send_round(producer, 3)
            described = await admin.describe_topic(TOPIC)
            assert len(described.chains[0].links) == 4
            assert described.chains[0].epoch == 4
            assert [qi.max_offset for qi in described.queue_info] == [
                sum(1 for _, _, q in sent if q == queue) for queue in range(QUEUES)
            ]

        got = await _read_all(cluster3.bootstrap, len(sent))
        for queue, messages in got.items():
            offsets = [o for o, _, _ in messages]
            assert offsets == list(range(len(offsets))), f"queue {queue} not dense"
            wanted = [(k, v) for k, v, q in sent if q == queue]
            assert [(k, v) for _, k, v in messages] == wanted

    loop.run(main())


def test_reads_by_time_and_bounds_span_links(loop: Loop, cluster3: ClusterEnv) -> None:
    async def main() -> None:
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            await admin.create_topic(TOPIC, QUEUES, static=True, brokers=["broker-a"])
            await _send_round(producer, 0)
            await admin.remap_topic(TOPIC, brokers=["broker-b"])
            second = await producer.send(TOPIC, b"late", key=b"k0")
        consumer = aio.StreamConsumer(cluster3.bootstrap, start="earliest")
        try:
            tq = (TOPIC, second.queue)
            consumer.assign([tq])
            await consumer.seek_to_end(*tq)
            assert consumer.position(*tq) == second.offset + 1
            await consumer.seek_to_beginning(*tq)
            assert consumer.position(*tq) == 0
        finally:
            await consumer.close()

    loop.run(main())


def test_bad_remaps_are_refused_and_change_nothing(loop: Loop, cluster3: ClusterEnv) -> None:
    async def main() -> None:
        async with aio.Admin(cluster3.bootstrap) as admin:
            await admin.create_topic(TOPIC, QUEUES, static=True, brokers=["broker-a"])
            await admin.create_topic("plain", 2)
            with pytest.raises(ConfigError, match="no live broker named broker-x"):
                await admin.remap_topic(TOPIC, brokers=["broker-x"])
            with pytest.raises(InvalidRequest, match="holds the write end of queue 1 already"):
                await admin.remap_topic(TOPIC, queue=1, to="broker-a")
            with pytest.raises(InvalidRequest, match="is not static"):
                await admin.remap_topic("plain", brokers=["broker-b"])
            with pytest.raises(ConfigError, match="queues are fixed"):
                await admin.alter_topic(TOPIC, queues=8)
            with pytest.raises(TopicAlreadyExists):
                await admin.create_topic(TOPIC, 2, static=True)
            with pytest.raises(TopicAlreadyExists):
                await admin.create_topic("plain", 2, static=True)
            info = await admin.describe_topic(TOPIC)
            assert all(len(c.links) == 1 and c.epoch == 1 for c in info.chains)
            # Nothing to move: already where asked.
            report = await admin.remap_topic(TOPIC, brokers=["broker-a"])
            assert report.switches == ()

    loop.run(main())


def test_remap_half_done_is_repaired(loop: Loop, cluster3: ClusterEnv) -> None:
    """A seal whose open never came (the admin died between them) leaves the queue with no
    writable link; describe shows it, a remap refuses, repair finishes it."""

    async def main() -> None:
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            await admin.create_topic(TOPIC, QUEUES, static=True, brokers=["broker-a"])
            sent = await _send_round(producer, 0)
            a = cluster3.addresses[0]
            seal = StaticSealRequest(topic=TOPIC, queue=2, epoch=2, target="broker-b")
            client = ClusterClient(cluster3.bootstrap)
            try:
                await client.call(a, seal, StaticChainsResponse)
            finally:
                await client.close()
            info = await admin.describe_topic(TOPIC)
            assert info.chains[2].write_end is None
            assert info.chains[2].target == "broker-b"
            with pytest.raises(InvalidRequest, match="--repair"):
                await admin.remap_topic(TOPIC, brokers=["broker-c"])
            # A send to that queue waits and retries while the switch is unfinished.
            key = next(k for k, _, q in sent if q == 2)
            pending = asyncio.ensure_future(producer.send(TOPIC, b"during", key=key))
            # A bounded wait for what must not happen (load can only make it pass).
            done, _ = await asyncio.wait({pending}, timeout=0.3)
            assert not done
            report = await admin.remap_topic(TOPIC, repair=True)
            assert [(s.queue, s.target) for s in report.switches] == [(2, "broker-b")]
            result = await asyncio.wait_for(pending, 30)
            assert result.offset == sum(1 for _, _, q in sent if q == 2)
            info = await admin.describe_topic(TOPIC)
            assert info.chains[2].write_end is not None
            assert info.chains[2].write_end.broker == "broker-b"

    loop.run(main())


def test_group_consumer_reads_exactly_once_across_two_remaps(
    loop: Loop, cluster3: ClusterEnv
) -> None:
    """A group consumer commits logical offsets while the topic is remapped twice; a
    second consumer of the group resumes from the commits: every message once."""

    async def consume(count: int, seen: list[bytes]) -> None:
        consumer = aio.GroupConsumer(
            cluster3.bootstrap, "g-static", [TOPIC], start="earliest", auto_commit=False
        )
        seen += await _poll_committing(consumer, count - len(seen))

    async def main() -> None:
        seen: list[bytes] = []
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            await admin.create_topic(TOPIC, QUEUES, static=True, brokers=["broker-a"])
            sent = await _send_round(producer, 0)
            await consume(len(sent), seen)
            await admin.remap_topic(TOPIC, brokers=["broker-b", "broker-c"])
            sent += await _send_round(producer, 1)
            await admin.remap_topic(TOPIC, brokers=["broker-a"])
            sent += await _send_round(producer, 2)
        await consume(len(sent), seen)
        assert sorted(seen) == sorted(v for _, v, _ in sent)

    loop.run(main())


def test_a_broker_leaves_once_its_links_expired(loop: Loop, cluster3: ClusterEnv) -> None:
    async def main() -> None:
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            await admin.create_topic("plain", 3)
            await producer.send("plain", b"held", queue=0)  # queue 0 is on broker-a
            with pytest.raises(InvalidRequest, match="holds messages of topic 'plain'"):
                await admin.remove_broker("broker-a")
            await admin.delete_topic("plain")

            await admin.create_topic(TOPIC, QUEUES, static=True, brokers=["broker-a"])
            first = await _send_round(producer, 0)
            with pytest.raises(InvalidRequest, match="holds its write end"):
                await admin.remove_broker("broker-a")
            await admin.remap_topic(TOPIC, brokers=["broker-b"])
            second = await _send_round(producer, 1)
            with pytest.raises(InvalidRequest, match="still holds readable data"):
                await admin.remove_broker("broker-a")
            # Retention on broker-a removes everything it holds.
            await _expire_everything_on(cluster3, 0)
            pruned = await admin.remove_broker("broker-a")
            per_queue = {q: sum(1 for _, _, qq in first if qq == q) for q in range(QUEUES)}
            assert sorted((p.queue, p.links, p.starts_at) for p in pruned) == [
                (q, 1, per_queue[q]) for q in range(QUEUES)
            ]
            info = await admin.describe_topic(TOPIC)
            assert all(
                [link.broker for link in c.links] == ["broker-b"] and c.pruned == 1
                for c in info.chains
            )
        got = await _read_all(cluster3.bootstrap, len(second))
        for q, messages in got.items():
            assert [o for o, _, _ in messages] == list(
                range(per_queue[q], per_queue[q] + len(messages))
            )
            assert [(k, v) for _, k, v in messages] == [(k, v) for k, v, qq in second if qq == q]

    loop.run(main())


def test_broadcast_members_each_read_everything_across_a_remap(
    loop: Loop, cluster3: ClusterEnv
) -> None:
    async def read(member: str, count: int) -> list[bytes]:
        consumer = aio.BroadcastConsumer(
            cluster3.bootstrap, "g-bcast", [TOPIC], member=member, start="earliest"
        )
        return await _poll_committing(consumer, count)

    async def main() -> None:
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            await admin.create_topic(TOPIC, QUEUES, static=True, brokers=["broker-a"])
            sent = await _send_round(producer, 0)
            first = await read("m1", len(sent))
            await admin.remap_topic(TOPIC, brokers=["broker-c"])
            sent += await _send_round(producer, 1)
        first += await read("m1", len(sent) - len(first))
        second = await read("m2", len(sent))
        values = sorted(v for _, v, _ in sent)
        assert sorted(first) == values
        assert sorted(second) == values

    loop.run(main())


def test_transactions_publish_to_static_queues_and_a_seal_waits_for_them(
    loop: Loop, cluster3: ClusterEnv
) -> None:
    """A transaction holding a batch for a queue makes that queue's seal wait until it
    ends (its commit publishes there); the receipts carry logical offsets."""

    async def main() -> None:
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
            aio.TransactionProducer(cluster3.bootstrap, "g-txn") as txns,
        ):
            await admin.create_topic(TOPIC, QUEUES, static=True, brokers=["broker-a"])
            await admin.remap_topic(TOPIC, queue=0, to="broker-b")  # an empty first link
            before = await producer.send(TOPIC, b"plain", queue=0)
            txn = await txns.begin()
            await txn.send(TOPIC, b"t1", queue=0)
            await txn.send(TOPIC, b"t2", queue=0)
            remap = asyncio.ensure_future(admin.remap_topic(TOPIC, queue=0, to="broker-c"))
            sealing = cluster3.brokers[1]._static.sealing  # broker-b holds the write end
            await wait_until(lambda: (TOPIC, 0) in sealing, what="the seal waiting")
            assert not remap.done()  # it waits for the transaction
            receipts = await txn.commit()
            report = await asyncio.wait_for(remap, 30)
            assert [r.offset for r in receipts] == [before.offset + 1, before.offset + 2]
            assert report.switches[0].at == before.offset + 3
            after = await producer.send(TOPIC, b"after", queue=0)
            assert after.offset == before.offset + 3
            txn = await txns.begin()
            await txn.send(TOPIC, b"t3", queue=0)
            (late,) = await txn.commit()
            assert late.offset == after.offset + 1
        got = await _read_all(cluster3.bootstrap, 5)
        assert [(o, v) for o, _, v in got[0]] == [
            (0, b"plain"), (1, b"t1"), (2, b"t2"), (3, b"after"), (4, b"t3"),
        ]  # fmt: skip

    loop.run(main())


def test_pop_consumer_reads_every_message_across_two_remaps(
    loop: Loop, cluster3: ClusterEnv
) -> None:
    """Each broker pops its own links: messages left on a sealed link are still leased
    there; offsets and ids are logical, also for a message retried after a nack."""

    async def main() -> None:
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            await admin.create_topic(TOPIC, QUEUES, static=True, brokers=["broker-a"])
            sent = await _send_round(producer, 0)
            ids = {}
            consumer = aio.SimpleConsumer(
                cluster3.bootstrap, "g-pop", {TOPIC: "*"}, await_duration=0.2
            )
            try:
                got: dict[bytes, list[str]] = {}
                first = await consumer.receive(4)
                assert first
                nacked = first[0]
                await nacked.nack()  # back through the retry topic, due at once
                await admin.remap_topic(TOPIC, brokers=["broker-b"])
                sent += await _send_round(producer, 1)
                await admin.remap_topic(TOPIC, brokers=["broker-c"])
                sent += await _send_round(producer, 2)
                for m in first[1:]:
                    got.setdefault(m.value or b"", []).append(m.message_id)
                    await m.ack()
                for _ in range(300):
                    for m in await consumer.receive(16):
                        assert m.value is not None
                        got.setdefault(m.value, []).append(m.message_id)
                        ids[m.value] = (m.queue, m.offset)
                        await m.ack()
                    if len(got) >= len(sent):
                        break
            finally:
                await consumer.close()
        assert sorted(got) == sorted(v for _, v, _ in sent)
        assert all(len(v) == 1 for v in got.values())
        # The retried message kept its logical place and id.
        assert got[nacked.value or b""] == [nacked.message_id]
        reread = await _read_all(cluster3.bootstrap, len(sent))
        by_value = {v: (q, o) for q, ms in reread.items() for o, _, v in ms}
        assert all(by_value[v] == place for v, place in ids.items())

    loop.run(main())


def test_retention_prunes_expired_links_and_later_remaps_keep_them_out(
    loop: Loop, cluster3: ClusterEnv
) -> None:
    broker_a = cluster3.brokers[0]

    async def main() -> None:
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            await admin.create_topic(TOPIC, QUEUES, static=True, brokers=["broker-a"])
            first = await _send_round(producer, 0)
            await admin.remap_topic(TOPIC, brokers=["broker-b"])
            second = await _send_round(producer, 1)
            await _expire_everything_on(cluster3, 0)
            assert await broker_a._static.prune_expired() == QUEUES
            # Answered once the name server has the pruned chains.
            assert [c.pruned for c in (await admin.describe_topic(TOPIC)).chains] == [1] * QUEUES
            await admin.remap_topic(TOPIC, brokers=["broker-c"])
            info = await admin.describe_topic(TOPIC)
            assert all(
                [link.broker for link in c.links] == ["broker-b", "broker-c"] for c in info.chains
            )
            assert await admin.remove_broker("broker-a") == []
        per_queue = {q: sum(1 for _, _, qq in first if qq == q) for q in range(QUEUES)}
        got = await _read_all(cluster3.bootstrap, len(second))
        for q, messages in got.items():
            assert [o for o, _, _ in messages][:1] in ([per_queue[q]], [])
            assert [(k, v) for _, k, v in messages] == [(k, v) for k, v, qq in second if qq == q]

    loop.run(main())


def test_time_lookups_and_filters_work_across_links(loop: Loop, cluster3: ClusterEnv) -> None:
    """seek_to_time finds a message on an older link or on the write end; a tag filter
    evaluated on each link's broker returns the matching messages of every link."""

    async def main() -> None:
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            await admin.create_topic(TOPIC, 1, static=True, brokers=["broker-a"])
            for i in range(10):
                await producer.send(TOPIC, b"a%d" % i, tag="paid" if i % 2 else "new",
                                    timestamp=1_000.0 + i)  # fmt: skip
            await admin.remap_topic(TOPIC, brokers=["broker-b"])
            for i in range(10):
                await producer.send(TOPIC, b"b%d" % i, tag="paid" if i % 2 else "new",
                                    timestamp=2_000.0 + i)  # fmt: skip
        consumer = aio.StreamConsumer(cluster3.bootstrap, start="none")
        try:
            consumer.assign([(TOPIC, 0)])
            await consumer.seek_to_time(1_005.0, TOPIC, 0)
            assert consumer.position(TOPIC, 0) == 5
            await consumer.seek_to_time(1_500.0, TOPIC, 0)
            assert consumer.position(TOPIC, 0) == 10
            await consumer.seek_to_time(2_003.0, TOPIC, 0)
            assert consumer.position(TOPIC, 0) == 13
            await consumer.seek_to_time(9_999.0, TOPIC, 0)
            assert consumer.position(TOPIC, 0) == 20
        finally:
            await consumer.close()
        paid = aio.StreamConsumer(cluster3.bootstrap, start="earliest", tags=["paid"])
        try:
            paid.assign([(TOPIC, 0)])
            seen: list[tuple[int, bytes]] = []
            for _ in range(50):
                seen += [(m.offset, m.value or b"") for m in await paid.poll(200)]
                if len(seen) >= 10:
                    break
        finally:
            await paid.close()
        assert [o for o, _ in seen] == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19]
        assert [v for _, v in seen][4:6] == [b"a9", b"b1"]

    loop.run(main())


def test_push_consumer_handles_every_message_across_a_remap(
    loop: Loop, cluster3: ClusterEnv
) -> None:
    async def main() -> None:
        handled: list[bytes] = []
        enough = asyncio.Event()
        sent: list[tuple[bytes, bytes, int]] = []

        async def handler(msg: aio.ReceivedMessage) -> None:
            handled.append(msg.value or b"")
            if len(handled) >= len(sent) == 3 * KEYS:
                enough.set()

        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            await admin.create_topic(TOPIC, QUEUES, static=True, brokers=["broker-a"])
            sent += await _send_round(producer, 0)
            consumer = aio.PushConsumer(cluster3.bootstrap, "g-push", {TOPIC: "*"}, handler)
            await consumer.start()
            try:
                await admin.remap_topic(TOPIC, brokers=["broker-b"])
                sent += await _send_round(producer, 1)
                await admin.remap_topic(TOPIC, brokers=["broker-a", "broker-c"])
                sent += await _send_round(producer, 2)
                if len(handled) >= len(sent):
                    enough.set()
                await asyncio.wait_for(enough.wait(), 60)
            finally:
                await consumer.close()
        assert sorted(handled) == sorted(v for _, v, _ in sent)

    loop.run(main())


def test_messages_are_found_by_id_offset_and_time_after_a_remap(
    loop: Loop, cluster3: ClusterEnv
) -> None:
    async def main() -> None:
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            await admin.create_topic(TOPIC, 1, static=True, brokers=["broker-a"])
            old = await producer.send(TOPIC, b"old", key=b"k", timestamp=1_000.0)
            await admin.remap_topic(TOPIC, brokers=["broker-b"])
            new = await producer.send(TOPIC, b"new", key=b"k", timestamp=2_000.0)
            for receipt, value in ((old, b"old"), (new, b"new")):
                found = await admin.get_message(receipt.message_id)
                assert found is not None
                assert (found.value, found.offset) == (value, receipt.offset)
                at = await admin.message_at(TOPIC, 0, offset=receipt.offset)
                assert at is not None
                assert at.message_id == receipt.message_id
            later = await admin.message_at(TOPIC, 0, at=1_500.0)
            assert later is not None
            assert later.value == b"new"
            assert await admin.message_at(TOPIC, 0, offset=2) is None
            assert await admin.message_at(TOPIC, 0, at=3_000.0) is None
            with pytest.raises(UnknownMessage, match="topic hash"):
                await admin.get_message("FFFFFFFF" + "0000" + "0" * 16)
            with pytest.raises(InvalidRequest, match="28 hex digits"):
                await admin.get_message("nope")

    loop.run(main())
