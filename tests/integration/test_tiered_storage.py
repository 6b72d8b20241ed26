"""Tiered storage: sealed data offloaded as Parquet, read back exactly, never deleted
locally before the object store verifiably holds it; its retention; its failures."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.dataset as ds
import pytest

import tidemq.aio
from tidemq.core.errors import ConfigError, DataLost
from tidemq.testing.clock import ManualClock
from tidemq.tiered.config import TieredConfig

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop, StartBroker

pytestmark = pytest.mark.timeout(120)

TOPIC = "orders"
#: Small files and row groups, so that a few thousand messages make many of each.
SMALL = {"file_bytes": 16 * 1024, "row_group_bytes": 4 * 1024, "file_max_age_ms": 60_000}
OFFLOADED = {"remote.storage.enable": "true", "local.retention.ms": "0"}


def tiered(url: str, **overrides: Any) -> TieredConfig:
    return TieredConfig(url=url, **{**SMALL, **overrides})


def _fields(m: tidemq.Message[Any]) -> tuple[Any, ...]:
    return (
        m.queue, m.offset, m.value, m.key, m.tag, m.keys, dict(m.headers), m.timestamp_ms,
        m.message_id,
    )  # fmt: skip


async def _produce(address: str, n: int, queues: int = 2) -> None:
    async with tidemq.aio.Producer(address) as producer:
        for i in range(n):
            await producer.send_nowait(
                TOPIC,
                None if i % 97 == 5 else f"value-{i}-".encode() * (1 + i % 7),
                key=None if i % 3 == 0 else f"k{i % 50}".encode(),
                tag=None if i % 4 == 0 else f"t{i % 3}",
                keys=(f"id-{i}",) if i % 5 == 0 else (),
                headers={"h": str(i).encode()} if i % 2 else {},
                queue=i % queues,
            )
            if i % 100 == 99:
                await producer.flush()  # batches of about 50 per queue
        await producer.flush()


async def _read_all(address: str, queues: int = 2, *, tags: str | None = None) -> list[Any]:
    out: list[Any] = []
    consumer = tidemq.aio.StreamConsumer(address)
    try:
        consumer.assign([(TOPIC, q) for q in range(queues)])
        for q in range(queues):
            consumer.seek(TOPIC, q, 0)
        async with tidemq.aio.Admin(address) as admin:
            info = await admin.describe_topic(TOPIC)
        ends = {qi.queue: qi.max_offset for qi in info.queue_info}
        seen = dict.fromkeys(range(queues), 0)
        while any(seen[q] < ends[q] for q in range(queues)):
            batch = await consumer.poll(timeout_ms=2000)
            if not batch:
                break
            for m in batch:
                seen[m.queue] = m.offset + 1
                if tags is None or m.tag == tags:
                    out.append(_fields(m))
    finally:
        await consumer.close()
    return sorted(out, key=lambda f: (f[0], f[1]))


async def _offload_all(env: BrokerEnv, clock: ManualClock) -> None:
    """Let every queue's tail age into files, offload them, then apply local retention."""
    clock.advance(SMALL["file_max_age_ms"])
    tier = env.broker.tier
    assert tier is not None
    for _ in range(50):
        before = tier.stats.uploaded_files
        await tier.run_once()
        if tier.stats.uploaded_files == before:
            break
    await env.broker._gateway.call(lambda s: s.enforce_retention())


def test_offloaded_messages_read_back_exactly(
    start_broker: StartBroker, loop: Loop, tmp_path: Path
) -> None:
    clock = ManualClock()
    bucket = tmp_path / "bucket"
    env = start_broker(clock=clock, tiered=tiered(f"file://{bucket}"))

    async def scenario() -> None:
        async with tidemq.aio.Admin(env.address) as admin:
            await admin.create_topic(TOPIC, 2, config=OFFLOADED)
        await _produce(env.address, 3000)
        local = await _read_all(env.address)
        assert len(local) == 3000
        await _offload_all(env, clock)
        status = await env.broker.tier.status(tidemq_status_request())  # type: ignore[union-attr]
        for q in status.queues:
            assert q.error == ""
            assert q.files >= 2
            # Every message is remote and nothing is left on the local disk.
            assert q.remote_end == q.next_offset == q.local_min
        remote = await _read_all(env.address)
        assert remote == local
        # Tag subscriptions are served from the tier too.
        assert await _read_all(env.address, tags="t1") == [f for f in local if f[4] == "t1"]

    loop.run(scenario())
    # The files are plain Parquet, in a Hive layout that pyarrow (and Spark, DuckDB) read.
    table = ds.dataset(bucket, format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 3000
    assert set(table.column("topic").to_pylist()) == {TOPIC}
    assert sorted(table.column("value").to_pylist(), key=lambda v: v or b"")[:1] == [None]


def tidemq_status_request() -> Any:
    from tidemq.protocol.tier_messages import TierStatusRequest  # noqa: PLC0415

    return TierStatusRequest()


def test_remote_storage_needs_the_tier_and_a_delete_topic(
    start_broker: StartBroker, loop: Loop, tmp_path: Path
) -> None:
    plain = start_broker()
    offloading = start_broker(tiered=tiered(f"file://{tmp_path / 'bucket'}"))

    async def scenario() -> None:
        async with tidemq.aio.Admin(plain.address) as admin:
            with pytest.raises(ConfigError, match=r"tiered\.url"):
                await admin.create_topic(TOPIC, 1, config=OFFLOADED)
        async with tidemq.aio.Admin(offloading.address) as admin:
            with pytest.raises(ConfigError, match="compact"):
                await admin.create_topic("kv", 1, config={**OFFLOADED, "cleanup.policy": "compact"})
            with pytest.raises(ConfigError, match=r"local\.retention\.ms"):
                await admin.create_topic(
                    TOPIC, 1, config={**OFFLOADED, "retention.ms": "1000",
                                      "local.retention.ms": "5000"},
                )  # fmt: skip
            with pytest.raises(ConfigError, match=r"remote\.storage\.enable must be"):
                await admin.create_topic(TOPIC, 1, config={"remote.storage.enable": "yes"})
            await admin.create_topic(TOPIC, 1, config=OFFLOADED)
            with pytest.raises(ConfigError, match="cannot be turned off"):
                await admin.alter_topic(TOPIC, config={"remote.storage.enable": "false"})

    loop.run(scenario())


def test_a_missing_remote_file_is_reported_as_data_loss(
    start_broker: StartBroker, loop: Loop, tmp_path: Path
) -> None:
    clock = ManualClock()
    bucket = tmp_path / "bucket"
    env = start_broker(clock=clock, tiered=tiered(f"file://{bucket}"))

    async def scenario() -> None:
        async with tidemq.aio.Admin(env.address) as admin:
            await admin.create_topic(TOPIC, 1, config=OFFLOADED)
        await _produce(env.address, 500, queues=1)
        await _offload_all(env, clock)
        first = sorted(bucket.rglob("part-0-0-*.parquet"))
        assert len(first) == 1
        first[0].unlink()  # behind the broker's back
        consumer = tidemq.aio.StreamConsumer(env.address)
        try:
            consumer.assign([(TOPIC, 0)])
            consumer.seek(TOPIC, 0, 0)
            with pytest.raises(DataLost, match="offloaded offsets 0\\.\\."):
                await consumer.poll(timeout_ms=2000)
        finally:
            await consumer.close()

    loop.run(scenario())
