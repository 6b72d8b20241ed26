"""The store gateway's sync flush: an append returns only once durable, whether its
fdatasync ran on the loop (a small append while the flusher is idle) or on the flusher
thread (a large one, or while a sync runs), and a failed fdatasync fails every append that
waited for it and fences the store. The file system is `tidemq.testing`'s fault-injecting
one, so "durable" means what survives a simulated power cut."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from tidemq.broker.store_gateway import StoreGateway
from tidemq.core.batch import encode_values
from tidemq.core.errors import StorageFailure
from tidemq.store.config import FlushMode, StoreConfig
from tidemq.store.message_store import MessageStore
from tidemq.testing.files import FaultFile, FaultFileSystem

DATA = Path("/data")
SEGMENT = DATA / "commitlog" / "00000000000000000000.log"


def _payload(size: int, n: int = 1) -> bytes:
    return encode_values([bytes([n % 256]) * size], timestamp_ms=1)


def _open(fs: FaultFileSystem, meta: Path) -> MessageStore:
    config = StoreConfig(data_dir=DATA, flush_mode=FlushMode.SYNC)
    store = MessageStore.open(config, fs=fs, metadata_path=meta)
    if not any(t.name == "t" for t in store.topics()):
        store.create_topic("t", 2)
    return store


async def _with_gateway(
    fs: FaultFileSystem, meta: Path
) -> tuple[MessageStore, StoreGateway, list[object]]:
    store = _open(fs, meta)
    woken: list[object] = []
    return store, StoreGateway(store, asyncio.get_running_loop(), woken.append), woken


def _surviving_offsets(fs: FaultFileSystem, meta: Path) -> int:
    """Messages in t/0 after a power cut that keeps only what was synced."""
    store = _open(fs.crash(random.Random(1), "lose"), meta)
    try:
        return store.queue_bounds("t", 0)[1]
    finally:
        store.close()


def test_small_and_large_appends_are_durable_when_they_return(tmp_path: Path) -> None:
    fs = FaultFileSystem()

    async def main() -> None:
        store, gateway, woken = await _with_gateway(fs, tmp_path / "meta.sqlite")
        for i in range(5):
            await gateway.append("t", 0, _payload(100, i))  # small: synced on the loop
        await gateway.append("t", 0, _payload(64 * 1024))  # large: on the flusher thread
        assert store.flushed_position == store.end_position
        assert woken, "fetches parked on the queue were not woken"
        await gateway.close()

    asyncio.run(main())
    assert _surviving_offsets(fs, tmp_path / "meta.sqlite") == 6


def test_concurrent_small_appends_all_return_durable(tmp_path: Path) -> None:
    fs = FaultFileSystem()

    async def main() -> None:
        store, gateway, _ = await _with_gateway(fs, tmp_path / "meta.sqlite")

        async def one(i: int) -> int:
            result = await gateway.append("t", i % 2, _payload(200 if i % 3 else 40_000, i))
            assert store.flushed_position >= result.end_position
            return result.base_offset

        offsets = await asyncio.gather(*(one(i) for i in range(60)))
        assert sorted(offsets[0::2]) == list(range(30))
        await gateway.close()

    asyncio.run(main())
    assert _surviving_offsets(fs, tmp_path / "meta.sqlite") == 30


@pytest.mark.parametrize("size", [100, 64 * 1024], ids=["on the loop", "on the flusher"])
def test_a_failed_fdatasync_fails_the_append_and_fences_the_store(
    size: int, tmp_path: Path
) -> None:
    fs = FaultFileSystem()

    async def main() -> None:
        _, gateway, _ = await _with_gateway(fs, tmp_path / "meta.sqlite")
        await gateway.append("t", 0, _payload(100))
        fs.fail_sync(path=SEGMENT)  # not another file's sync, such as a checkpoint's
        with pytest.raises(StorageFailure, match="fdatasync failed"):
            await gateway.append("t", 0, _payload(size))
        with pytest.raises(StorageFailure):
            await gateway.append("t", 0, _payload(100))
        await gateway.close()

    asyncio.run(main())
    assert (
        _surviving_offsets(fs, tmp_path / "meta.sqlite") == 1
    )  # the acknowledged append, and nothing else


def test_back_to_back_small_appends_share_an_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Synced on the loop one by one, 40 appends that arrive together would cost 40
    # fdatasyncs; the first is synced on the loop, the rest queue up behind it and go to
    # the flusher together (group commit).
    syncs: list[Path] = []
    real_sync = FaultFile.sync

    def counting_sync(self: FaultFile) -> None:
        syncs.append(self.path)
        real_sync(self)

    monkeypatch.setattr(FaultFile, "sync", counting_sync)
    fs = FaultFileSystem()

    async def main() -> None:
        store, gateway, _ = await _with_gateway(fs, tmp_path / "meta.sqlite")
        before = syncs.count(SEGMENT)
        results = await asyncio.gather(
            *(gateway.append("t", 0, _payload(100, i)) for i in range(40))
        )
        assert all(r.end_position <= store.flushed_position for r in results)
        assert syncs.count(SEGMENT) - before <= 10, f"{syncs.count(SEGMENT) - before} syncs"
        await gateway.close()

    asyncio.run(main())
    assert _surviving_offsets(fs, tmp_path / "meta.sqlite") == 40
