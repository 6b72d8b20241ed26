"""The single bridge between the event loop and the synchronous store.

The store is single-threaded and its operations (appends to the page cache, index lookups,
preads) take microseconds, so they run right on the event loop: no thread hop, no lock,
no GIL hand-off per request. Only fdatasync, which takes a millisecond or more and releases
the GIL, runs on the flusher thread (`sync_thread.py`; except a small one, below):

* In sync flush mode an append returns only when a flush covering its end has completed.
  Each such append hands the flusher thread the log's new end; the thread syncs back to
  back while there is more, and appends keep landing meanwhile, so the next fdatasync
  covers all of them together (group commit: one sync per round, however many producers).
  A small append (up to `_INLINE_SYNC_MAX_BYTES` unflushed) made while no fdatasync runs,
  and not right after the previous such sync, is synced on the loop instead: cheaper than
  two thread hops when a producer sends one message at a time.
* In async flush mode appends return at once; the flusher syncs every `flush_interval_ms`.
* Readable data wakes parked fetches: after each completed flush in sync mode (readers see
  only flushed records there), at once in async mode.
* A periodic task runs the checkpoint when due (on the loop, so nothing else touches the
  store meanwhile).

A failed fdatasync fences the store: every waiting append fails with StorageFailure.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final, TypeVar

from tidemq.broker.metrics import GROUP_COMMIT_BUCKETS, Durations
from tidemq.broker.sync_thread import SyncThread
from tidemq.core.errors import BrokerNotAvailable, DiskFull, StoreClosed, TidemqError
from tidemq.store.config import FlushMode
from tidemq.store.message_store import AppendResult, MessageStore
from tidemq.store.producer_state import ProducerStamp

__all__ = ["StoreGateway"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How often the periodic task looks at the checkpoint and the async-mode flush.
_TICK_INTERVAL_S: Final = 0.05
#: Sync mode: an append that leaves at most this much unflushed while no fdatasync runs is
#: synced right on the loop. For a lone small write (one message per round trip) the
#: flusher's two thread hops (submit, then wake the loop; each waits for the GIL and a
#: CPU) cost more than the fdatasync of a page or two. Larger appends go to the flusher
#: thread, so the loop keeps reading and appending while the disk works (group commit).
_INLINE_SYNC_MAX_BYTES: Final = 16 * 1024
#: ... but only when no append waits for the flusher (it joins them) and the previous sync
#: on the loop ended at least this long ago. Appends
#: that arrive back to back (several producers at once, which queued up while the loop
#: was syncing) go to the flusher, where one fdatasync covers them all; synced on the loop
#: one by one, each would cost a whole fdatasync. A producer sending one message per round
#: trip comes back no sooner than its own processing and two loopback hops, well over this.
_INLINE_SYNC_MIN_GAP_S: Final = 100e-6


class StoreGateway:
    def __init__(
        self,
        store: MessageStore,
        loop: asyncio.AbstractEventLoop,
        on_data: Callable[[set[tuple[str, int]]], None],
    ) -> None:
        self._store = store
        self._loop = loop
        self._on_data = on_data
        self._sync = store.config.flush_mode is FlushMode.SYNC
        # (end position, future, monotonic time) of appends waiting for durability (in a
        # replica group: for the group's commit), in append order
        self._waiting: list[tuple[int, asyncio.Future[None], float]] = []
        #: In a replica group's leader (`replica_leader.py`): given the flushed position,
        #: the group's committed position; appends are answered, and reads see records,
        #: only up to it. `check_writable` raises before an append the group cannot take
        #: (too few in sync, no longer leader). None: no replication.
        self.commit: Callable[[int], int] | None = None
        self.check_writable: Callable[[], None] | None = None
        #: Called after every append (a leader's parked REPLICA_FETCHes wake on it).
        self.appended: Callable[[], None] | None = None
        # queues appended to since the last flush request, and (target, queues) of each
        # request, in order: a completed flush wakes the fetches of the queues it covers
        self._unflushed_queues: set[tuple[str, int]] = set()
        self._requested: list[tuple[int, set[tuple[str, int]]]] = []
        self._requested_target = 0  # the newest target handed to the flusher thread
        self._inline_synced_at = 0.0  # perf_counter() when the last sync on the loop ended
        self._closed = False
        self._stopped = False  # the flusher thread has ended: its late reports are moot
        self._flusher = SyncThread(loop, self._synced, self._sync_failed)
        #: fdatasync durations (seconds) measured on the flusher thread, drained into
        #: `_fsync_times` on the loop (a deque's append and popleft are thread-safe).
        self._sync_seconds: collections.deque[float] = collections.deque()
        self._fsync_times = Durations()
        #: Bytes each fdatasync made durable (the group commit's size).
        self.group_commit_bytes = Durations(GROUP_COMMIT_BUCKETS)
        self._ticker = loop.create_task(self._tick_loop())

    @property
    def store(self) -> MessageStore:
        return self._store

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ API for coroutines

    async def call(self, fn: Callable[[MessageStore], T]) -> T:
        """Run `fn(store)` (on the loop: it must not block)."""
        if self._closed:
            raise StoreClosed("the broker is shutting down")
        return fn(self._store)

    async def append(
        self,
        topic: str,
        queue_id: int,
        payload: bytes | memoryview,
        *,
        producer: ProducerStamp | None = None,
        properties: bytes = b"",
        flags: int = 0,
    ) -> AppendResult:
        """Append one batch; returns once it is durable per the flush mode."""
        if not self._sync:
            return self.append_now(
                topic, queue_id, payload, producer=producer, properties=properties, flags=flags
            )
        result = self._append(topic, queue_id, payload, producer, properties, flags)
        if result.end_position <= self._acknowledged:
            return result  # a retried batch that is durable (and committed) already
        if (
            self.commit is None
            and not self._flushing
            and not self._waiting
            and result.end_position - self._store.flushed_position <= _INLINE_SYNC_MAX_BYTES
            and time.perf_counter() - self._inline_synced_at >= _INLINE_SYNC_MIN_GAP_S
        ):
            self._sync_inline((topic, queue_id))
            # Not loop.time(): uvloop's is in milliseconds, cached per iteration.
            self._inline_synced_at = time.perf_counter()
            return result
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiting.append((result.end_position, future, time.monotonic()))
        self._unflushed_queues.add((topic, queue_id))
        self._request_flush()
        await future
        return result

    @property
    def appends_at_once(self) -> bool:
        """Whether an append is answered without waiting (async flush): `append_now`."""
        return not self._sync

    def append_now(
        self,
        topic: str,
        queue_id: int,
        payload: bytes | memoryview,
        *,
        producer: ProducerStamp | None = None,
        properties: bytes = b"",
        flags: int = 0,
    ) -> AppendResult:
        """`append` with async flush (`appends_at_once`), where nothing is waited for:
        callable from a protocol callback, with no task."""
        assert not self._sync
        result = self._append(topic, queue_id, payload, producer, properties, flags)
        if not result.duplicate:
            self._on_data({(topic, queue_id)})
        return result

    def _append(  # noqa: PLR0917
        self,
        topic: str,
        queue_id: int,
        payload: bytes | memoryview,
        producer: ProducerStamp | None,
        properties: bytes,
        flags: int,
    ) -> AppendResult:
        if self._closed:
            raise StoreClosed("the broker is shutting down")
        if self.check_writable is not None:
            self.check_writable()
        result = self._store.append(
            topic, queue_id, payload, producer=producer, properties=properties, flags=flags
        )
        if self.appended is not None and not result.duplicate:
            self.appended()
        return result

    async def append_many(
        self, items: list[tuple[str, int, bytes | memoryview, bytes, int]]
    ) -> tuple[list[AppendResult], TidemqError | None]:
        """Append (topic, queue, payload, properties, flags) records in this order, then
        wait until they are durable. A failing append stops the rest: the results of those
        appended before it come back (durable) with the error, which is not raised, so the
        caller knows exactly which records exist."""
        if self._closed:
            raise StoreClosed("the broker is shutting down")
        if self.check_writable is not None:
            self.check_writable()
        results: list[AppendResult] = []
        error: TidemqError | None = None
        for topic, queue, payload, props, flags in items:
            try:
                results.append(
                    self._store.append(topic, queue, payload, properties=props, flags=flags)
                )
            except TidemqError as exc:
                error = exc
                break
        if results and self.appended is not None:
            self.appended()
        touched = {(topic, queue) for topic, queue, *_ in items[: len(results)]}
        end = max((r.end_position for r in results), default=0)
        if not self._sync:
            self._on_data(touched)
            return results, error
        if end <= self._acknowledged:
            return results, error
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiting.append((end, future, time.monotonic()))
        self._unflushed_queues.update(touched)
        self._request_flush()
        await future
        return results, error

    async def settled(self) -> None:
        """Wait until readers see everything appended so far (durable per the flush mode,
        and in a replica group committed), for a reader that must not miss an
        acknowledged record that is only not visible yet (a new leader's log end is
        committed once its followers report). Fails as a waiting append would."""
        if self._closed:
            raise StoreClosed("the broker is shutting down")
        end = self._store.end_position
        if self._store.visible_position >= end:
            return
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiting.append((end, future, time.monotonic()))
        self._request_flush()
        await future

    @property
    def _acknowledged(self) -> int:
        """Appends ending at or before this may be answered: flushed, and committed."""
        store = self._store
        if store.commit_limit is None:
            return store.flushed_position
        return min(store.flushed_position, store.commit_limit)

    # ------------------------------------------------------------------ replication

    def commit_advanced(self) -> None:
        """The replica group's committed position may have moved (a follower reported):
        answer the appends it now covers and wake the fetches of their queues."""
        self._complete(self._store.flushed_position)

    def fail_waiting_since(self, before: float, error: TidemqError) -> None:
        """Fail the appends waiting since before `before` (time.monotonic()) with `error`:
        the group did not commit them in time. They stay in the log; a retry of an
        idempotent producer's batch is answered from it once committed."""
        keep = []
        for item in self._waiting:
            if item[2] < before and not item[1].done():
                item[1].set_exception(error)
            elif not item[1].done():
                keep.append(item)
        self._waiting = keep

    def fail_all_waiting(self, error: TidemqError) -> None:
        """Fail every append still waiting (this member stopped leading)."""
        self._fail_waiting(error)

    # ------------------------------------------------------------------ flushing

    @property
    def _flushing(self) -> bool:
        """A sync handed to the flusher thread has not reported yet."""
        return self._requested_target > self._store.flushed_position

    def _request_flush(self) -> None:
        """Have the flusher thread sync the log to its current end (merged with any
        request that has not started yet)."""
        try:
            target, sync = self._store.begin_flush()
        except TidemqError as exc:
            self._fail_waiting(exc)
            return
        self._requested.append((target, self._unflushed_queues))
        self._unflushed_queues = set()
        self._requested_target = target
        self._flusher.request(target, self._timed(sync))

    def _timed(self, sync: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            started = time.perf_counter()
            sync()
            self._sync_seconds.append(time.perf_counter() - started)

        return run

    def fsync_times(self) -> Durations:
        """The commit log's fdatasync durations so far (read on the loop)."""
        while self._sync_seconds:
            self._fsync_times.observe(self._sync_seconds.popleft())
        return self._fsync_times

    def _synced(self, target: int) -> None:
        """The flusher thread made the log durable up to `target` (on the loop)."""
        if self._stopped:
            return
        before = self._store.flushed_position
        self._store.complete_flush(target)  # not if the store was fenced meanwhile
        if target > before:
            self.group_commit_bytes.observe(target - before)
        self._complete(self._store.flushed_position)

    def _sync_failed(self, exc: OSError) -> None:
        if self._stopped:
            return
        self._fail_waiting(self._store.fail_flush(exc))

    def _sync_inline(self, queue: tuple[str, int]) -> None:
        """fdatasync on the loop, for a small append while the flusher is idle; completes
        every append waiting for the flusher too. Raises what the flusher would give."""
        store = self._store
        target, sync = store.begin_flush()
        before = store.flushed_position
        try:
            self._timed(sync)()
        except OSError as exc:
            error = store.fail_flush(exc)
            self._fail_waiting(error)
            raise error from None
        store.complete_flush(target)
        if target > before:
            self.group_commit_bytes.observe(target - before)
        self._unflushed_queues.add(queue)
        self._complete(target)

    def _complete(self, target: int) -> None:
        """Appends that end at or before `target` are durable: answer them, and wake the
        fetches parked on the queues they touched. In a replica group only up to the
        group's committed position (`commit`), which readers are limited to as well."""
        if self.commit is not None:
            target = self.commit(target)
            self._store.commit_limit = target
        done = 0
        for end, future, _ in self._waiting:
            if end > target:
                break
            if not future.done():
                future.set_result(None)
            done += 1
        del self._waiting[:done]
        touched: set[tuple[str, int]] = set()
        done = 0
        for requested, queues in self._requested:
            if requested > target:
                break
            touched |= queues
            done += 1
        del self._requested[:done]
        if target >= self._store.end_position:  # everything appended is durable
            touched |= self._unflushed_queues
            self._unflushed_queues = set()
        if touched:
            self._on_data(touched)

    def _fail_waiting(self, error: TidemqError) -> None:
        for _, future, _ in self._waiting:
            if not future.done():
                future.set_exception(error)
        self._waiting.clear()

    async def _tick_loop(self) -> None:
        # A full disk fails every checkpoint (every tick, 20 a second) until space is
        # freed: logged when it starts and when it ends, not at each tick.
        disk_full = False
        while True:
            await asyncio.sleep(_TICK_INTERVAL_S)
            try:
                if self._store.flush_due() and not self._flushing:
                    self._request_flush()
                if self._store.checkpoint_due():
                    self._store.checkpoint()  # flushes the whole log, on the loop
                    self._complete(self._store.flushed_position)
                    if disk_full:
                        disk_full = False
                        log.warning("checkpoints succeed again (disk space was freed)")
            except StoreClosed:
                return
            except DiskFull as exc:
                if not disk_full:
                    disk_full = True
                    log.warning("checkpoint failed, retried until space is freed: %s", exc)
            except Exception:
                log.exception("periodic store work failed")

    async def close(self) -> None:
        """Flush what is waiting, checkpoint and close the store."""
        if self._closed:
            return
        self._closed = True
        self._ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._ticker
        # Ends after the sync it was asked for last, which covers every waiting append;
        # blocks the loop for at most that one fdatasync, at shutdown.
        error = self._flusher.stop()
        self._stopped = True
        try:
            if error is not None:
                self._fail_waiting(self._store.fail_flush(error))
            elif self._waiting:
                try:
                    self._complete(self._store.flush())
                except TidemqError as exc:
                    self._fail_waiting(exc)
            # In a replica group some may still wait for the group: never left hanging.
            self._fail_waiting(
                BrokerNotAvailable("the broker stopped before the replica group committed this")
            )
        finally:
            self._store.close()
