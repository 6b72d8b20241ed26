"""Static topics with tiered storage: a broker whose sealed links are all in the object
store leaves the cluster (`remove-broker`), its data directory is deleted, and the other
brokers serve its links from its Parquet files: every message with its bytes and
offsets, the queue's start, lookups by time; the write end's broker expires those links
by retention afterwards, files included. Refused while data is on its disk only, or a pop
group has not finished it."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tests.integration.conftest import start_cluster, wait_until

from tidemq import aio
from tidemq.broker.broker import Broker
from tidemq.client.cluster import ClusterClient
from tidemq.core.errors import InvalidRequest, RequestTimeout
from tidemq.protocol.commands import AlterTopicRequest, TopicInfoMsg
from tidemq.testing.clock import ManualClock
from tidemq.tiered.config import TieredConfig

if TYPE_CHECKING:
    from tests.integration.conftest import ClusterEnv, Loop

pytestmark = pytest.mark.timeout(120)

TOPIC = "orders"
QUEUES = 2
HOUR_MS = 3_600_000


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_800_000_000_000)


@pytest.fixture
def tiered3(loop: Loop, tmp_path: Path, clock: ManualClock) -> Iterator[ClusterEnv]:
    """Three brokers sharing one directory tier; no background passes (the test offloads)."""
    tier = tmp_path / "tier"
    tier.mkdir()
    config = TieredConfig(
        url=f"file://{tier}",
        file_bytes=8 * 1024,
        row_group_bytes=2 * 1024,
        check_interval_ms=HOUR_MS,
    )
    names = ("broker-a", "broker-b", "broker-c")
    yield from start_cluster(loop, tmp_path, names, tiered=config, clock=clock)


async def _send(producer: aio.Producer, round_no: int, n: int) -> list[tuple[int, bytes, bytes]]:
    """(queue, key, value) of each acknowledged message."""
    sent = []
    for i in range(n):
        key = f"k{i % 16}".encode()
        value = f"r{round_no}-{i}-".encode() * (1 + i % 9)
        result = await producer.send(TOPIC, value, key=key, tag=f"t{i % 2}")
        sent.append((result.queue, key, value))
    return sent


async def _read(bootstrap: str, expected: int, tag: str | None = None) -> dict[int, list[Any]]:
    """queue -> [message] (with `tag`) from the earliest offset on, until `expected` came."""
    got: dict[int, list[Any]] = {q: [] for q in range(QUEUES)}
    consumer = aio.StreamConsumer(bootstrap, start="earliest", fetch_wait_ms=50, filter=tag)
    try:
        consumer.assign([(TOPIC, q) for q in range(QUEUES)])
        total = 0
        for _ in range(400):
            for m in await consumer.poll(200):
                got[m.queue].append(m)
                total += 1
            if total >= expected:
                break
    finally:
        await consumer.close()
    return got


def _files_of(tier: Path, broker: str) -> list[Path]:
    data = list((tier / f"topic={TOPIC}").glob(f"broker={broker}/**/*.parquet"))
    manifests = list((tier / "_tidemq" / "manifests" / f"broker={broker}").glob("**/*.json"))
    return data + manifests


def test_a_broker_whose_links_are_offloaded_leaves_and_they_are_read_from_the_bucket(
    loop: Loop, tiered3: ClusterEnv, tmp_path: Path, clock: ManualClock
) -> None:
    cluster = tiered3

    async def main() -> None:
        async with aio.Admin(cluster.bootstrap) as admin, aio.Producer(cluster.bootstrap) as p:
            await admin.create_topic(
                TOPIC,
                QUEUES,
                static=True,
                brokers=["broker-a"],
                config={"remote.storage.enable": "true"},
            )
            first = await _send(p, 0, 300)
            await admin.remap_topic(TOPIC, brokers=["broker-b"])
            chains = (await admin.describe_topic(TOPIC)).chains
            ends = {c.queue: c.links[0].logical_end or 0 for c in chains}
            assert all(ends.values())  # sealed, not empty

            # Nothing is in the bucket yet: broker-a is the only copy.
            with pytest.raises(InvalidRequest, match="not in the object store yet"):
                await admin.remove_broker("broker-a")
            await admin.tier_offload(TOPIC)
            # A pop group that leased a message of broker-a's link and has not finished it.
            consumer = aio.SimpleConsumer(
                cluster.bootstrap, "g-pop", {TOPIC: "*"}, await_duration=0.1
            )
            try:
                held = await consumer.receive(4)
                assert held
                with pytest.raises(InvalidRequest, match=r"pop group\(s\) g-pop"):
                    await admin.remove_broker("broker-a")
                for _ in range(200):
                    if not held:
                        break
                    await consumer.ack_many(held)
                    held = await consumer.receive(16)
            finally:
                await consumer.close()

            # (A refused call leaves the queues it finished before the refusal as done.)
            report = await admin.remove_broker("broker-a")
            assert report
            assert all((r.links, r.offloaded, r.starts_at) == (0, 1, 0) for r in report)
            chains = (await admin.describe_topic(TOPIC)).chains
            assert all(c.links[0].tiered and not c.links[1].tiered for c in chains)
            assert await admin.remove_broker("broker-a") == []  # nothing more to do

        # broker-a goes for good, its disk with it.
        await cluster.brokers[0].stop()
        shutil.rmtree(tmp_path / "broker-a")
        ns = cluster.nameserver.nameserver
        await wait_until(lambda: "broker-a" not in ns.brokers(), what="broker-a gone")

        async with aio.Producer(cluster.bootstrap) as p:
            clock.advance(2 * HOUR_MS)
            second = await _send(p, 1, 100)
        got = await _read(cluster.bootstrap, len(first) + len(second))
        for q, messages in got.items():
            assert [m.offset for m in messages] == list(range(len(messages)))
            assert [(m.key, m.value) for m in messages] == [
                (k, v) for qq, k, v in first + second if qq == q
            ]
            assert all(m.message_id for m in messages)
        tagged = [(q, k, v) for n, (q, k, v) in enumerate(first + second) if n % 2 == 1]
        filtered = await _read(cluster.bootstrap, len(tagged), tag="t1")
        for q, messages in filtered.items():
            assert [m.value for m in messages] == [v for qq, _, v in tagged if qq == q]

        async with aio.Admin(cluster.bootstrap) as admin:
            info = await admin.describe_topic(TOPIC)
            assert {qi.queue: qi.min_offset for qi in info.queue_info} == dict.fromkeys(
                range(QUEUES), 0
            )
            # A lookup by time finds broker-a's messages in the bucket.
            for q, messages in got.items():
                middle = messages[ends[q] // 2]
                found = await admin.message_at(TOPIC, q, at=middle.timestamp_ms / 1000)
                assert found is not None
                assert found.offset <= middle.offset < ends[q]
                assert found.timestamp_ms >= middle.timestamp_ms

        # Retention: broker-a's links (sealed two hours ago) expire, the newer data stays.
        client = ClusterClient(cluster.bootstrap)
        try:
            alter = AlterTopicRequest(name=TOPIC, config={"retention.ms": str(HOUR_MS)})
            await client.call(cluster.addresses[1], alter, TopicInfoMsg)
        finally:
            await client.close()
        assert await cluster.brokers[1]._static.prune_expired() == QUEUES
        assert _files_of(tmp_path / "tier", "broker-a") == []
        got = await _read(cluster.bootstrap, len(second))
        for q, messages in got.items():
            assert [m.offset for m in messages] == list(range(ends[q], ends[q] + len(messages)))
            assert [m.value for m in messages] == [v for qq, _, v in second if qq == q]
        async with aio.Admin(cluster.bootstrap) as admin:
            chains = (await admin.describe_topic(TOPIC)).chains
            assert all([link.broker for link in c.links] == ["broker-b"] for c in chains)

    loop.run(main())


def test_a_broker_rebuilt_from_the_bucket_serves_its_static_links_again(
    loop: Loop, tiered3: ClusterEnv, tmp_path: Path
) -> None:
    """broker-a holds the write end; its disk is lost after an offload. A new broker-a on
    an empty data directory restores the topic with its chains from the bucket: every
    offloaded message reads back with its offset; the write end stays closed (its
    chain may be stale, its tail is gone) until a remap opens it elsewhere."""
    cluster = tiered3
    old = cluster.brokers[0]

    async def main() -> None:
        async with aio.Admin(cluster.bootstrap) as admin, aio.Producer(cluster.bootstrap) as p:
            await admin.create_topic(
                TOPIC, QUEUES, static=True, brokers=["broker-a"],
                config={"remote.storage.enable": "true"},
            )  # fmt: skip
            first = await _send(p, 0, 200)
            await admin.tier_offload(TOPIC)
        await old.stop()
        shutil.rmtree(tmp_path / "broker-a")
        store = dataclasses.replace(old.config.store, data_dir=tmp_path / "broker-a2")
        config = dataclasses.replace(old.config, port=0, store=store)
        fresh = Broker(config, clock=old._clock)
        cluster.brokers.append(fresh)
        await fresh.start()
        assert fresh.tier is not None
        tier = fresh.tier
        await wait_until(lambda: TOPIC in tier.catalog.restored, what="the restore")

        got = await _read(cluster.bootstrap, len(first))
        for q, messages in got.items():
            assert [m.offset for m in messages] == list(range(len(messages)))
            assert [m.value for m in messages] == [v for qq, _, v in first if qq == q]

        async with aio.Producer(cluster.bootstrap, delivery_timeout_ms=1_500) as p:
            with pytest.raises(RequestTimeout, match="read-only on this broker"):
                await p.send(TOPIC, b"refused", key=b"k0")
        async with aio.Admin(cluster.bootstrap) as admin, aio.Producer(cluster.bootstrap) as p:
            await admin.remap_topic(TOPIC, brokers=["broker-b"])
            second = await _send(p, 1, 60)
        got = await _read(cluster.bootstrap, len(first) + len(second))
        for q, messages in got.items():
            assert [m.offset for m in messages] == list(range(len(messages)))
            assert [m.value for m in messages] == [v for qq, _, v in first + second if qq == q]

    loop.run(main())
