"""The flusher thread: requests that arrive during a sync are merged into the next one,
reports reach the loop in order, a failed sync stops the thread for good, and stop()
runs what was asked for last."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tidemq.broker.sync_thread import SyncThread

WAIT_S = 5.0


class _Recorder:
    def __init__(self) -> None:
        self.synced: list[int] = []
        self.failed: list[OSError] = []
        self.changed = asyncio.Event()

    def on_synced(self, target: int) -> None:
        self.synced.append(target)
        self.changed.set()

    def on_failed(self, error: OSError) -> None:
        self.failed.append(error)
        self.changed.set()

    async def until(self, *, synced: int = 0, failed: int = 0) -> None:
        async with asyncio.timeout(WAIT_S):
            while len(self.synced) < synced or len(self.failed) < failed:
                self.changed.clear()
                await self.changed.wait()


def test_requests_during_a_sync_are_merged_into_the_next() -> None:
    async def main() -> None:
        rec = _Recorder()
        thread = SyncThread(asyncio.get_running_loop(), rec.on_synced, rec.on_failed)
        started, release = threading.Event(), threading.Event()
        calls: list[int] = []

        def slow_sync(target: int) -> None:
            calls.append(target)
            started.set()
            assert release.wait(WAIT_S)

        thread.request(1, lambda: slow_sync(1))
        assert started.wait(WAIT_S)
        for target in (2, 3, 4):  # while the first sync runs
            thread.request(target, lambda t=target: calls.append(t))  # type: ignore[misc]
        release.set()
        await rec.until(synced=2)
        assert calls == [1, 4]
        assert rec.synced == [1, 4]
        assert thread.stop() is None

    asyncio.run(main())


def test_a_failed_sync_is_reported_and_nothing_runs_after_it() -> None:
    async def main() -> None:
        rec = _Recorder()
        thread = SyncThread(asyncio.get_running_loop(), rec.on_synced, rec.on_failed)
        error = OSError(5, "Input/output error")

        def failing() -> None:
            raise error

        thread.request(1, failing)
        await rec.until(failed=1)
        ran: list[int] = []
        thread.request(2, lambda: ran.append(2))
        assert thread.stop() is error
        await asyncio.sleep(0)
        assert rec.failed == [error]
        assert rec.synced == []
        assert ran == [], "a sync ran after a failed one"

    asyncio.run(main())


def test_stop_runs_the_pending_sync_first() -> None:
    async def main() -> None:
        rec = _Recorder()
        thread = SyncThread(asyncio.get_running_loop(), rec.on_synced, rec.on_failed)
        started, release = threading.Event(), threading.Event()
        ran: list[int] = []

        def blocked() -> None:
            started.set()
            assert release.wait(WAIT_S)
            ran.append(1)

        thread.request(1, blocked)
        assert started.wait(WAIT_S)
        thread.request(2, lambda: ran.append(2))
        threading.Timer(0.05, release.set).start()
        assert thread.stop() is None  # blocks until both ran
        assert ran == [1, 2]
        await rec.until(synced=2)
        assert rec.synced == [1, 2]

    asyncio.run(main())


@pytest.mark.parametrize("requests", [0, 1])
def test_stop_ends_the_thread(requests: int) -> None:
    async def main() -> None:
        rec = _Recorder()
        before = set(threading.enumerate())  # other tests' brokers may still run theirs
        thread = SyncThread(asyncio.get_running_loop(), rec.on_synced, rec.on_failed)
        (ours,) = [t for t in threading.enumerate() if t not in before and t.name == "tidemq-fsync"]
        assert ours.is_alive()
        for target in range(requests):
            thread.request(target, lambda: None)
        thread.stop()
        assert not ours.is_alive()

    asyncio.run(main())
