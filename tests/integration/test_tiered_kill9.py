"""kill -9 of a real `tidemq server` while it offloads to a local-directory tier.

The server offloads as fast as it can (files of a few KiB, every 20 ms), drops local copies
at once (`local.retention.ms=0`) and expires remote files by size (`retention.bytes`), so a
kill lands in uploads, manifest writes, local deletions and remote deletions. After each
restart: every acknowledged message at or past the queue's start is read back with its
bytes (from the tier or the disk), offsets are dense, the start only moves forward, every
file a manifest lists exists with its checksum, and the first pass deletes every file no
manifest lists (an upload cut off before its manifest). The seed is printed;
TIDEMQ_KILL9_SEED replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.support.killable_server import KillableServer

from tidemq import aio
from tidemq.client.cluster import ClientConfig
from tidemq.core.errors import TidemqError

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

TOPIC = "tiered-kill9"
QUEUES = 2
CYCLES = int(os.environ.get("TIDEMQ_TIER_CYCLES", "10"))
SOAK_CYCLES = 100
#: Upper bound per cycle on average, so a hang cannot eat the CI budget.
CYCLE_TIME_LIMIT_S = 15
#: Remote files expire past this many bytes per queue (remote deletions during the run).
RETENTION_BYTES = 256 * 1024


def _start_server(data_dir: Path, bucket: Path) -> KillableServer:
    tiered = {
        "url": f"file://{bucket}",
        "file_bytes": 8192,
        "row_group_bytes": 2048,
        "file_max_age_ms": 1,
        "check_interval_ms": 20,
        "retry_backoff_ms": 20,
    }
    return KillableServer(
        data_dir, *(a for k, v in tiered.items() for a in ("--set", f"tiered.{k}={v}"))
    )


async def _produce_until_killed(
    server: KillableServer, rng: random.Random, cycle: int,
    acked: dict[int, dict[int, bytes]],
) -> None:  # fmt: skip
    proc, address = server.proc, server.address
    killer = threading.Timer(rng.uniform(0.3, 1.5), proc.send_signal, (signal.SIGKILL,))
    producer = aio.Producer(
        address, linger_ms=1, client_config=ClientConfig(retries=0, request_timeout_ms=5000)
    )
    killer.start()
    seq = 0
    try:
        while proc.poll() is None:
            queue = rng.randrange(QUEUES)
            values = [f"{cycle}:{seq + i}:".encode() * 8 for i in range(rng.randint(1, 40))]
            seq += len(values)
            try:
                receipts = await asyncio.wait_for(
                    producer.send_batch(TOPIC, values, queue=queue), timeout=10
                )
            except (TidemqError, TimeoutError):
                break  # the server died mid-request: the outcome is unknown, not acked
            for receipt, value in zip(receipts, values, strict=True):
                acked[queue][receipt.offset] = value
    finally:
        killer.join()
        proc.wait(30)
        with contextlib.suppress(TidemqError, TimeoutError):
            await asyncio.wait_for(producer.close(), timeout=10)


async def _verify(
    address: str, acked: dict[int, dict[int, bytes]], starts: dict[int, int], where: str
) -> None:
    """Read every queue from its start to its end as described; the start may move on
    meanwhile (remote retention): what is checked is from the final start on."""
    async with aio.Admin(address) as admin:
        info = await admin.describe_topic(TOPIC)
    ends = {qi.queue: qi.max_offset for qi in info.queue_info}
    consumer = aio.StreamConsumer(address, start="earliest")
    consumer.assign([(TOPIC, q) for q in range(QUEUES)])
    for qi in info.queue_info:
        consumer.seek(TOPIC, qi.queue, qi.min_offset)
    got: dict[int, dict[int, bytes]] = {q: {} for q in range(QUEUES)}
    position = {qi.queue: qi.min_offset for qi in info.queue_info}
    deadline = time.monotonic() + 60
    try:
        while any(position[q] < ends[q] for q in range(QUEUES)):
            assert time.monotonic() < deadline, f"{where}: could not read back the queues"
            for m in await consumer.poll(timeout_ms=1000):
                assert m.value is not None
                got[m.queue][m.offset] = m.value
                position[m.queue] = m.offset + 1
    finally:
        await consumer.close()
    async with aio.Admin(address) as admin:
        info = await admin.describe_topic(TOPIC)
    for qi in info.queue_info:
        q, low = qi.queue, qi.min_offset
        assert low >= starts[q], f"{where}: queue {q} start went back {starts[q]} -> {low}"
        starts[q] = low
        kept = [o for o in sorted(got[q]) if low <= o < ends[q]]
        assert kept == list(range(low, ends[q])), f"{where}: queue {q} not dense"
        for offset, value in acked[q].items():
            if low <= offset < ends[q]:
                assert got[q][offset] == value, f"{where}: acked {q}/{offset} lost or changed"
            assert offset < ends[q], f"{where}: acked {q}/{offset} past the queue's end"


def _listed(bucket: Path, where: str) -> set[Path]:
    """Every file the manifests list, each checked against its size and checksum."""
    listed: set[Path] = set()
    for manifest in bucket.glob("_tidemq/manifests/**/*.json"):
        for f in json.loads(manifest.read_bytes())["files"]:
            path = bucket / f["path"]
            assert path.exists(), f"{where}: {manifest} lists missing {f['path']}"
            data = path.read_bytes()
            assert len(data) == f["size"], f"{where}: {f['path']} has the wrong size"
            assert hashlib.sha256(data).hexdigest() == f["sha256"], f"{where}: {f['path']}"
            listed.add(path)
    return listed


async def _no_orphans(loop: Loop, bucket: Path, where: str) -> None:
    """The first pass after a start deletes what no manifest lists."""
    await loop.wait_until(
        lambda: set(bucket.rglob("*.parquet")) <= _listed(bucket, where),
        what=f"{where}: orphan files deleted",
    )


@pytest.mark.slow
def test_kill9_during_offload_loses_nothing_acknowledged(
    tmp_path: Path, loop: Loop, soak: bool
) -> None:
    seed = int(os.environ.get("TIDEMQ_KILL9_SEED", random.randrange(1 << 32)))
    print(f"tiered kill9: seed {seed} (rerun with TIDEMQ_KILL9_SEED={seed})")
    rng = random.Random(seed)
    data_dir, bucket = tmp_path / "data", tmp_path / "bucket"
    acked: dict[int, dict[int, bytes]] = {q: {} for q in range(QUEUES)}
    starts = dict.fromkeys(range(QUEUES), 0)
    cycles = SOAK_CYCLES if soak else CYCLES
    started = time.monotonic()

    server = _start_server(data_dir, bucket)
    try:

        async def create() -> None:
            async with aio.Admin(server.address) as admin:
                await admin.create_topic(
                    TOPIC,
                    QUEUES,
                    config={
                        "remote.storage.enable": "true",
                        "local.retention.ms": "0",
                        "retention.bytes": str(RETENTION_BYTES),
                    },
                )

        loop.run(create())
    finally:
        server.reap()
    for cycle in range(cycles):
        assert time.monotonic() - started < 60 + cycles * CYCLE_TIME_LIMIT_S, (
            f"seed {seed}: out of time before cycle {cycle}"
        )
        where = f"seed={seed} cycle={cycle}"
        server = _start_server(data_dir, bucket)
        try:
            loop.run(_verify(server.address, acked, starts, where))
            loop.run(_no_orphans(loop, bucket, where))
            loop.run(_produce_until_killed(server, rng, cycle, acked))
        finally:
            server.reap()
    server = _start_server(data_dir, bucket)
    address = server.address
    try:
        loop.run(_verify(address, acked, starts, f"seed={seed} final"))

        async def offloaded() -> aio.TierStatus:
            """The status with every queue's manifest read back (`tier_files` loads them),
            once the local tail is offloaded too: retention.bytes counts it, and a tail
            left by the last cycle on a slow machine can hold the whole budget, which
            rightly expires every remote file."""
            async with aio.Admin(address) as admin:
                await admin.tier_offload(TOPIC)
                assert await admin.tier_files(TOPIC), "no offloaded file listed"
                (status,) = await admin.tier_status()
            assert status.queues, status
            assert any(q.files for q in status.queues), status
            return status

        status = loop.run(offloaded())
        assert all(q.error == "" for q in status.queues), status
        assert any(s > 0 for s in starts.values()), "remote retention never deleted a file"
    finally:
        assert server.stop() == 0
    total = sum(len(v) for v in acked.values())
    print(f"tiered kill9: {cycles} cycles, {total} messages acknowledged, starts {starts}")
