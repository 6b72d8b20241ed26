"""A full disk while the object store is down (tiered storage): produce is refused with
DiskFull, nothing acknowledged is lost, and produce resumes once the store is back and
offload has caught up (local copies of offloaded data go, the disk empties), without a
restart. A real `tidemq server` on a small tmpfs (root only; skipped with the reason
otherwise), the store a moto S3 server brought up on a port chosen in advance."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.support.killable_server import KillableServer
from tests.support.s3_server import s3_server
from tests.support.tmpfs import mount_tmpfs, unmount, used_fraction

from tidemq import aio
from tidemq.client.cluster import ClientConfig
from tidemq.core.errors import DiskFull

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

pytestmark = pytest.mark.timeout(180)

FS_BYTES = 24 << 20
VALUE = bytes(range(256)) * 128  # 32 KiB
TOPIC = "offloaded"


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    why = mount_tmpfs(mnt, FS_BYTES)
    if why is not None:
        pytest.skip(why)
    try:
        yield mnt
    finally:
        unmount(mnt)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(data_dir: Path, port: int) -> KillableServer:
    settings = {
        "tiered.url": "s3://tidemq-tier/disk-full",
        "tiered.endpoint": f"http://127.0.0.1:{port}",
        "tiered.access_key_id": "test",
        "tiered.secret_access_key": "test",
        "tiered.file_max_age_ms": 1,
        "tiered.check_interval_ms": 50,
        "tiered.retry_backoff_ms": 50,
        "tiered.retry_backoff_max_ms": 200,
        "tiered.request_timeout_ms": 1000,
        # Small segments: local copies free whole segments as soon as they are offloaded.
        "store.segment_size_bytes": 1 << 20,
        "store.disk_check_interval_ms": 100,
        # The services' scan position holds log segments until their next checkpoint.
        "broker.service_checkpoint_interval_ms": 500,
    }
    return KillableServer(
        data_dir, *(a for k, v in settings.items() for a in ("--set", f"{k}={v}"))
    )


def test_disk_full_while_the_store_is_down_resumes_when_offload_catches_up(
    small_fs: Path, loop: Loop
) -> None:
    wait_until = loop.wait_until
    port = _free_port()
    server = _start(small_fs / "data", port)
    address = server.address
    no_retry = ClientConfig(retries=0, request_timeout_ms=5_000)
    acked: list[int] = []

    async def fill() -> None:
        async with aio.Admin(address, client_config=no_retry) as admin:
            await admin.create_topic(
                TOPIC, 1, config={"remote.storage.enable": "true", "local.retention.ms": "0"}
            )
        async with aio.Producer(
            address, client_config=no_retry, delivery_timeout_ms=2_000, linger_ms=0
        ) as producer:
            for _ in range(FS_BYTES // len(VALUE) * 2):
                try:
                    acked.append((await producer.send(TOPIC, VALUE, queue=0)).offset)
                except DiskFull:
                    return
        raise AssertionError("the watermark never refused an append")

    async def resume() -> float:
        """Seconds until as many bytes again as filled the disk are accepted: only
        possible once offload caught up and local copies went (the disk empties). A
        producer faster than offload on a loaded machine may fill the disk again on the
        way: each DiskFull waits for the disk to empty once more (it must, every time)."""
        started = time.monotonic()
        wanted = 2 * len(acked)
        while len(acked) < wanted:
            await wait_until(
                lambda: used_fraction(small_fs) < 0.5, timeout_s=120, what="the disk emptying"
            )
            async with aio.Producer(
                address, client_config=no_retry, delivery_timeout_ms=2_000, linger_ms=0
            ) as producer:
                try:
                    while len(acked) < wanted:
                        acked.append((await producer.send(TOPIC, VALUE, queue=0)).offset)
                except DiskFull:
                    continue  # refused, not stored: offload catches up again
        return time.monotonic() - started

    async def read_back() -> None:
        consumer = aio.StreamConsumer(address)
        consumer.assign([(TOPIC, 0)])
        consumer.seek(TOPIC, 0, 0)
        got: dict[int, bytes | None] = {}
        try:
            while len(got) < len(acked):
                batch = await consumer.poll(timeout_ms=5000)
                assert batch, f"read stalled at {len(got)} of {len(acked)}"
                got.update((m.offset, m.value) for m in batch)
        finally:
            await consumer.close()
        assert sorted(got) == acked
        assert all(got[o] == VALUE for o in acked)

    try:
        asyncio.run(asyncio.wait_for(fill(), 90))
        assert acked, "nothing was accepted before the disk filled"
        full = used_fraction(small_fs)
        with s3_server(port):
            waited = asyncio.run(asyncio.wait_for(resume(), 90))
            asyncio.run(asyncio.wait_for(read_back(), 90))
        print(
            f"tiered disk full: {len(acked) // 2} x 32 KiB acked before DiskFull at "
            f"{full:.0%} used, as many again {waited:.1f} s after the store came back; "
            f"{used_fraction(small_fs):.0%} used then"
        )
    except BaseException:
        print("".join(server.lines[-200:]))  # the broker's side of the failure
        raise
    finally:
        server.stop()
