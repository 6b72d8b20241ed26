"""Tiered storage: sealed data offloaded as Parquet, read back exactly, never deleted
locally before the object store verifiably holds it; its retention; its failures."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from tests.support.s3_server import S3Server, s3_server

import tidemq.aio
from tidemq.broker.broker import Broker
from tidemq.core.errors import ConfigError, DataLost, TopicNotFound
from tidemq.testing.clock import ManualClock
from tidemq.testing.faulty_http import FaultMode, FaultyHttpProxy
from tidemq.tiered.config import TieredConfig

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop, StartBroker

pytestmark = pytest.mark.timeout(120)

TOPIC = "orders"
#: Small files and row groups, so that a few thousand messages make many of each.
SMALL: dict[str, Any] = {
    "file_bytes": 16 * 1024,
    "row_group_bytes": 4 * 1024,
    "file_max_age_ms": 60_000,
}
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


def test_offload_to_s3_and_read_back(start_broker: StartBroker, loop: Loop) -> None:
    clock = ManualClock()
    with s3_server() as s3:
        env = start_broker(clock=clock, tiered=s3.tiered(**SMALL))

        async def scenario() -> None:
            async with tidemq.aio.Admin(env.address) as admin:
                await admin.create_topic(TOPIC, 2, config=OFFLOADED)
            await _produce(env.address, 1000)
            local = await _read_all(env.address)
            await _offload_all(env, clock)
            status = await env.broker.tier.status(tidemq_status_request())  # type: ignore[union-attr]
            assert [(q.error, q.local_min == q.remote_end == 500) for q in status.queues] == [
                ("", True),
                ("", True),
            ]
            assert status.uploaded_files >= 4
            assert await _read_all(env.address) == local

        loop.run(scenario())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_store_that_is_down_keeps_local_copies_until_it_is_back(
    start_broker: StartBroker, loop: Loop
) -> None:
    """Offload waits and retries with backoff; nothing is deleted locally meanwhile;
    produce and fetch go on; `tier status` says why; once the store is up it catches up."""
    clock = ManualClock()
    port = _free_port()
    down = S3Server(f"http://127.0.0.1:{port}", "tidemq-tier")
    env = start_broker(clock=clock, tiered=down.tiered(**SMALL, request_timeout_ms=2_000))
    tier = env.broker.tier
    assert tier is not None

    async def produce_and_fail() -> list[Any]:
        async with tidemq.aio.Admin(env.address) as admin:
            await admin.create_topic(TOPIC, 2, config=OFFLOADED)
        await _produce(env.address, 600)
        await _offload_all(env, clock)
        status = await tier.status(tidemq_status_request())
        for q in status.queues:
            assert "127.0.0.1" in q.error
            assert q.retry_in_ms >= SMALL["file_max_age_ms"] // 60  # the first backoff
            assert (q.local_min, q.remote_end, q.next_offset) == (0, 0, 300)
            assert q.pending_bytes > 0
        await _produce(env.address, 200)  # produce does not wait for the store
        return await _read_all(env.address)

    local = loop.run(produce_and_fail())
    assert len(local) == 800
    with s3_server(port):
        clock.advance(60_000)  # past the backoff

        async def recover() -> None:
            await _offload_all(env, clock)
            status = await tier.status(tidemq_status_request())
            for q in status.queues:
                assert (q.error, q.local_min, q.remote_end, q.next_offset) == ("", 400, 400, 400)
            assert await _read_all(env.address) == local

        loop.run(recover())


def test_remote_retention_deletes_expired_files(
    start_broker: StartBroker, loop: Loop, tmp_path: Path
) -> None:
    clock = ManualClock()
    bucket = tmp_path / "bucket"
    env = start_broker(clock=clock, tiered=tiered(f"file://{bucket}"))
    hour = 3_600_000

    async def scenario() -> None:
        async with tidemq.aio.Admin(env.address) as admin:
            await admin.create_topic(TOPIC, 1, config={**OFFLOADED, "retention.ms": str(2 * hour)})
        await _produce(env.address, 400, queues=1)
        await _offload_all(env, clock)
        old_files = set(bucket.rglob("*.parquet"))
        clock.advance(hour)
        await _produce(env.address, 400, queues=1)
        await _offload_all(env, clock)
        assert len(set(bucket.rglob("*.parquet"))) > len(old_files)
        clock.advance(hour + 1)  # the first 400 are now older than retention.ms
        await env.broker.tier.run_once()  # type: ignore[union-attr]
        remaining = set(bucket.rglob("*.parquet"))
        assert not remaining & old_files
        async with tidemq.aio.Admin(env.address) as admin:
            info = await admin.describe_topic(TOPIC)
        assert info.queue_info[0].min_offset == 400
        assert info.queue_info[0].max_offset == 800
        consumer = tidemq.aio.StreamConsumer(env.address)
        try:
            consumer.assign([(TOPIC, 0)])
            consumer.seek(TOPIC, 0, 400)
            got = await consumer.poll(timeout_ms=2000)
            assert got[0].offset == 400
        finally:
            await consumer.close()

    loop.run(scenario())


def test_a_restart_resumes_from_the_bucket_and_deletes_orphans(
    start_broker: StartBroker, loop: Loop, tmp_path: Path
) -> None:
    """An upload cut off before its manifest named it leaves an orphan file: the next
    start deletes it; the manifest, read back from the bucket, serves every offset."""
    clock = ManualClock()
    bucket = tmp_path / "bucket"
    env = start_broker(clock=clock, tiered=tiered(f"file://{bucket}"))

    async def before() -> list[Any]:
        async with tidemq.aio.Admin(env.address) as admin:
            await admin.create_topic(TOPIC, 2, config=OFFLOADED)
        await _produce(env.address, 600)
        local = await _read_all(env.address)
        await _offload_all(env, clock)
        await env.broker.stop()
        return local

    local = loop.run(before())
    orphan = next(bucket.rglob("queue=1/**/*.parquet")).with_name("part-1-300-400.parquet")
    orphan.write_bytes(b"an upload cut off by a crash")
    restarted = Broker(env.broker.config, embedded_nameserver=True, clock=clock)
    address = loop.run(restarted.start())
    try:

        async def after() -> None:
            assert await _read_all(address) == local  # served from the bucket
            await restarted.tier.run_once()  # type: ignore[union-attr]
            assert not orphan.exists()
            assert restarted.tier.stats.orphans_deleted == 1  # type: ignore[union-attr]

        loop.run(after())
    finally:
        loop.run(restarted.stop())


def test_seek_to_time_finds_offloaded_messages(
    start_broker: StartBroker, loop: Loop, tmp_path: Path
) -> None:
    """A lookup by time older than the local data looks into the tier: same answer as
    before the offload."""
    clock = ManualClock()
    env = start_broker(clock=clock, tiered=tiered(f"file://{tmp_path / 'bucket'}"))
    hour = 3_600_000

    async def first_offset_at(when_ms: int) -> int:
        consumer = tidemq.aio.StreamConsumer(env.address)
        try:
            consumer.assign([(TOPIC, 0)])
            await consumer.seek_to_time(when_ms / 1000)
            return (await consumer.poll(timeout_ms=2000))[0].offset
        finally:
            await consumer.close()

    async def scenario() -> None:
        async with tidemq.aio.Admin(env.address) as admin:
            await admin.create_topic(TOPIC, 1, config=OFFLOADED)
        fourth_batches = []  # per round of six batches of 50, the time of the fourth
        async with tidemq.aio.Producer(env.address) as producer:
            for _ in range(3):
                for batch in range(6):
                    if batch == 3:
                        fourth_batches.append(clock.now_ms())
                    for _ in range(50):
                        stamp = clock.now_ms() / 1000
                        await producer.send_nowait(TOPIC, b"x" * 40, queue=0, timestamp=stamp)
                    await producer.flush()
                    clock.advance(1000)
                clock.advance(hour)
        before = [await first_offset_at(t) for t in fourth_batches]
        assert before == [150, 450, 750]
        await _offload_all(env, clock)
        status = await env.broker.tier.status(tidemq_status_request())  # type: ignore[union-attr]
        assert status.queues[0].local_min == 900  # all of it is remote only now
        assert [await first_offset_at(t) for t in fourth_batches] == before

    loop.run(scenario())


def test_pop_consumers_read_from_the_tier(
    start_broker: StartBroker, loop: Loop, tmp_path: Path
) -> None:
    """A pop group whose messages are only in the object store leases them from there;
    a nacked one is delivered again (read from the tier again), and acks finish them."""
    clock = ManualClock()
    env = start_broker(clock=clock, tiered=tiered(f"file://{tmp_path / 'bucket'}"))

    async def scenario() -> None:
        async with tidemq.aio.Admin(env.address) as admin:
            await admin.create_topic(TOPIC, 1, config=OFFLOADED)
        await _produce(env.address, 300, queues=1)
        local = {f[1]: f for f in await _read_all(env.address, queues=1)}
        await _offload_all(env, clock)
        status = await env.broker.tier.status(tidemq_status_request())  # type: ignore[union-attr]
        assert status.queues[0].local_min == 300  # nothing left on the local disk
        consumer = tidemq.aio.SimpleConsumer(
            env.address, "workers", {TOPIC: "*"}, await_duration=0.2
        )
        try:
            got: dict[int, Any] = {}
            for _ in range(100):
                batch = await consumer.receive(32)
                if not batch:
                    break
                for m in batch:
                    assert m.offset not in got
                    got[m.offset] = m
            assert sorted(got) == list(range(300))
            assert all(_fields(m) == local[o] for o, m in got.items())
            nacked = got.pop(7)
            await consumer.ack_many(list(got.values()))
            await consumer.nack(nacked)
            (again,) = await consumer.receive(32)  # through %RETRY%workers: its message,
            assert again.delivery_attempt == 2  # read back from the tier, and its first id
            assert again.value == local[7][2]
            assert again.message_id == local[7][8]
            assert again.headers["tidemq.retry.offset"] == b"7"
            await again.ack()
            assert await consumer.receive(32) == []
        finally:
            await consumer.close()

    loop.run(scenario())


def test_offload_now_and_list_the_files(
    start_broker: StartBroker, loop: Loop, tmp_path: Path
) -> None:
    """`Admin.tier_offload` uploads what is durable at once (no size or age threshold);
    `tier_files` lists the Parquet files of an offset range, which pyarrow opens as they
    are."""
    bucket = tmp_path / "bucket"
    env = start_broker(tiered=TieredConfig(url=f"file://{bucket}"))  # default thresholds

    async def scenario() -> None:
        async with tidemq.aio.Admin(env.address) as admin:
            await admin.create_topic(TOPIC, 2, config=OFFLOADED)
            await _produce(env.address, 400)
            (status,) = await admin.tier_offload(TOPIC)
            assert [(q.remote_end, q.local_min, q.next_offset) for q in status.queues] == [
                (200, 200, 200),
                (200, 200, 200),
            ]
            files = await admin.tier_files(TOPIC, queue=1, start=50, end=60)
            assert [(f.queue, f.start <= 50, f.end >= 60) for f in files] == [(1, True, True)]
            table = pq.read_table(files[0].url.removeprefix("file://"))
            assert table.column("offset").to_pylist() == list(range(files[0].start, files[0].end))
            assert await admin.tier_files(TOPIC, start=10_000) == []
            with pytest.raises(TopicNotFound):
                await admin.tier_files("nope")

    loop.run(scenario())


def test_store_faults_are_retried_and_show_in_the_status(
    start_broker: StartBroker, loop: Loop
) -> None:
    """500s, a store that hangs, refused connections and lost acknowledgements of
    uploads (through a faulty proxy in front of moto): each pass fails clearly and backs
    off; local copies stay; once the store behaves, every message is offloaded exactly
    once, no orphan remains, and everything reads back."""
    clock = ManualClock()
    with s3_server() as s3, FaultyHttpProxy(s3.endpoint) as proxy:
        flaky = S3Server(proxy.endpoint, s3.bucket)
        settings = {**SMALL, "file_bytes": 1024 * 1024, "request_timeout_ms": 500}
        env = start_broker(clock=clock, tiered=flaky.tiered(**settings))
        tier = env.broker.tier
        assert tier is not None

        async def scenario() -> None:
            async with tidemq.aio.Admin(env.address) as admin:
                await admin.create_topic(TOPIC, 1, config=OFFLOADED)
            await _produce(env.address, 600, queues=1)
            local = await _read_all(env.address, queues=1)
            await tier.run_once()  # reads the (empty) manifest; nothing is old enough yet
            assert tier.stats.uploaded_files == 0
            clock.advance(SMALL["file_max_age_ms"])
            for mode, said in [
                (FaultMode.ERROR, "500"),
                (FaultMode.HANG, "error sending request"),  # after request_timeout_ms
                (FaultMode.REFUSE, "error sending request"),
                (FaultMode.LOSE_ACK, "500"),  # the data file is stored, its PUT answered 500
            ]:
                proxy.set_mode(mode)
                clock.advance(120_000)  # past any backoff
                await tier.run_once()
                (q,) = (await tier.status(tidemq_status_request())).queues
                assert said in q.error.lower(), (mode, q.error)
                assert q.retry_in_ms > 0
                await env.broker._gateway.call(lambda s: s.enforce_retention())
                assert (q.local_min, q.next_offset) == (0, 600)  # nothing local deleted
            proxy.set_mode(FaultMode.PASS)
            clock.advance(120_000)
            await _offload_all(env, clock)
            (q,) = (await tier.status(tidemq_status_request())).queues
            assert (q.error, q.remote_end, q.local_min) == ("", 600, 600)
            listed = {f.url.split("/", 3)[-1] for f in await _files(env.address)}
            stored = {o.path for o in tier.store.list(f"topic={TOPIC}/")}
            assert stored == {p.removeprefix("cluster-1/") for p in listed}  # no orphan
            assert await _read_all(env.address, queues=1) == local

        loop.run(scenario())


async def _files(address: str) -> list[Any]:
    async with tidemq.aio.Admin(address) as admin:
        return await admin.tier_files(TOPIC)


def test_an_empty_broker_restores_its_topics_from_the_bucket(
    start_broker: StartBroker, loop: Loop, tmp_path: Path
) -> None:
    """The old broker's disk is gone: a broker of the same name on an empty data directory
    with the same tier rebuilds its offloaded topics (configs, queues, offsets) and serves
    every offloaded message; new messages continue after them."""
    clock = ManualClock()
    bucket = tmp_path / "bucket"
    config = {**OFFLOADED, "retention.ms": "86400000"}
    old = start_broker(clock=clock, tiered=tiered(f"file://{bucket}"))

    async def before() -> list[Any]:
        async with tidemq.aio.Admin(old.address) as admin:
            await admin.create_topic(TOPIC, 2, config=config)
        await _produce(old.address, 600)
        local = await _read_all(old.address)
        await _offload_all(old, clock)
        await old.broker.stop()
        return local

    offloaded = loop.run(before())
    fresh = start_broker(
        clock=clock, tiered=tiered(f"file://{bucket}"), broker_name=old.broker.config.broker_name
    )
    assert fresh.data_dir != old.data_dir

    async def after() -> None:
        tier = fresh.broker.tier
        assert tier is not None
        await tier.run_once()  # the first pass restores
        async with tidemq.aio.Admin(fresh.address) as admin:
            info = await admin.describe_topic(TOPIC)
        assert {k: info.config[k] for k in config} == config
        assert [(q.min_offset, q.max_offset) for q in info.queue_info] == [(0, 300), (0, 300)]
        assert await _read_all(fresh.address) == offloaded
        async with tidemq.aio.Producer(fresh.address) as producer:
            receipt = await producer.send(TOPIC, b"after the restore", queue=0)
        assert receipt.offset == 300

    loop.run(after())


def test_reads_do_not_wait_behind_an_upload(start_broker: StartBroker, loop: Loop) -> None:
    """An upload that hangs (its PUTs stalled by the store) holds its queue's pass; reads
    of the queue's offloaded offsets go on meanwhile."""
    clock = ManualClock()
    with s3_server() as s3, FaultyHttpProxy(s3.endpoint) as proxy:
        stalled = S3Server(proxy.endpoint, s3.bucket)
        env = start_broker(clock=clock, tiered=stalled.tiered(**SMALL, request_timeout_ms=20_000))
        tier = env.broker.tier
        assert tier is not None

        async def scenario() -> None:
            async with tidemq.aio.Admin(env.address) as admin:
                await admin.create_topic(TOPIC, 1, config=OFFLOADED)
            await _produce(env.address, 300, queues=1)
            offloaded = await _read_all(env.address, queues=1)
            await _offload_all(env, clock)  # all 300 remote only
            await _produce(env.address, 300, queues=1)
            clock.advance(SMALL["file_max_age_ms"])
            proxy.set_mode(FaultMode.HANG, only=frozenset({"PUT"}))
            puts = proxy.requests["PUT"]
            uploading = asyncio.ensure_future(tier.run_once())
            await loop.wait_until(lambda: proxy.requests["PUT"] > puts, what="a PUT hanging")
            consumer = tidemq.aio.StreamConsumer(env.address)
            try:
                consumer.assign([(TOPIC, 0)])
                consumer.seek(TOPIC, 0, 0)
                first = await consumer.poll(timeout_ms=5000)
            finally:
                await consumer.close()
            assert first, "the read waited behind the upload"
            assert [_fields(m) for m in first] == offloaded[: len(first)]
            assert not uploading.done()  # the read did not wait for it
            proxy.set_mode(FaultMode.PASS)
            await uploading

        loop.run(scenario())


def test_a_read_racing_remote_retention_moves_to_the_new_start(
    start_broker: StartBroker, loop: Loop
) -> None:
    """A read whose file remote retention deletes while the read waits for the store is
    answered out of range (the consumer moves to the queue's new start), not DataLost."""
    clock = ManualClock()
    hour = 3_600_000
    with s3_server() as s3, FaultyHttpProxy(s3.endpoint) as proxy:
        env = start_broker(clock=clock, tiered=S3Server(proxy.endpoint, s3.bucket).tiered(**SMALL))
        tier = env.broker.tier
        assert tier is not None

        async def scenario() -> None:
            async with tidemq.aio.Admin(env.address) as admin:
                await admin.create_topic(
                    TOPIC, 1, config={**OFFLOADED, "retention.ms": str(2 * hour)}
                )
            await _produce(env.address, 400, queues=1)
            await _offload_all(env, clock)
            clock.advance(hour)
            await _produce(env.address, 400, queues=1)
            await _offload_all(env, clock)
            proxy.set_mode(FaultMode.HANG, only=frozenset({"GET"}))
            gets = proxy.requests["GET"]
            consumer = tidemq.aio.StreamConsumer(env.address, start="earliest")
            try:
                consumer.assign([(TOPIC, 0)])
                consumer.seek(TOPIC, 0, 0)
                polling = asyncio.ensure_future(consumer.poll(timeout_ms=10_000))
                await loop.wait_until(lambda: proxy.requests["GET"] > gets, what="a GET")
                clock.advance(hour + 1)  # the first 400 expire
                await tier.run_once()  # deletes their files (DELETEs pass)
                proxy.set_mode(FaultMode.PASS)
                got = await polling
                while not got:
                    got = await consumer.poll(timeout_ms=2000)
                assert got[0].offset == 400
            finally:
                await consumer.close()

        loop.run(scenario())
