"""Starting over, both sides (docs/design/replication.md, "Starting over";
the store's part: `store/start_over.py`).

The leader answers a fetch below its log start with `ReplicaStartOver` (its log start,
each queue's offset there, its compacted log files) and the topic table, and serves those
files' bytes (REPLICA_FILE). The follower copies the files into its staging directory,
checks each, and starts its store over at the leader's log start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Final

from tidemq.core.clock import Clock
from tidemq.core.errors import CorruptRecordError, TidemqError
from tidemq.net.client import ClientConnection
from tidemq.protocol.replica_messages import (
    EpochStart,
    ReplicaCompactedFile,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    ReplicaFileRequest,
    ReplicaFileResponse,
    ReplicaProducerWindow,
    ReplicaQueueStart,
    ReplicaStartOver,
    ReplicaTopic,
)
from tidemq.store.epoch_file import EpochEntry, EpochHistory
from tidemq.store.files import FileSystem, OsFileSystem, ensure_dir
from tidemq.store.message_store import MessageStore
from tidemq.store.start_over import (
    CompactedFile,
    StartOverPlan,
    check_staged,
    mark_for_start_over,
    plan_start_over,
    read_compacted_file,
    staging_path,
    start_over,
)

__all__ = [
    "StartOverFailed",
    "add_topic_table",
    "copy_compacted_files",
    "file_answer",
    "plan_of",
    "restart_empty",
    "restart_store",
    "start_over_answer",
    "start_over_at",
]

log = logging.getLogger(__name__)

#: Longest one REPLICA_FILE answer may take.
FILE_ANSWER_TIMEOUT_S: Final = 30.0


def add_topic_table(answer: ReplicaFetchResponse, store: MessageStore) -> None:
    """The store's whole topic table (as followers mirror it), the highest topic id it
    gave and the last producer id it issued, into a fetch answer."""
    answer.topics = [
        ReplicaTopic(
            t.id,
            t.name,
            t.queues,
            t.message_type.value,
            t.cleanup_policy.value,
            t.retention_ms,
            t.retention_bytes,
            dict(t.config),
            t.created_ms,
        )
        for t in store.topics()
    ]
    answer.max_topic_id = store.metadata.max_topic_id()
    answer.last_producer_id = store.metadata.last_producer_id()


#: Bytes of a start-over answer counted per producer-window batch it carries (four
#: msgpack integers of at most 9 bytes and the array's header, rounded up): the windows
#: take at most a quarter of the fetch's `max_bytes`.
_BYTES_PER_WINDOW_BATCH: Final = 48


def start_over_answer(
    store: MessageStore,
    req: ReplicaFetchRequest,
    *,
    epoch: int,
    committed: int,
    history: EpochHistory,
) -> ReplicaFetchResponse:
    """The leader's answer to a fetch below its log start (retention deleted what the
    follower needs next): start over there, with the topic table, which the follower
    mirrors first, and the producer windows of batches before the log start, in at most
    a quarter of the request's `max_bytes`."""
    plan = plan_start_over(store, max_batches=req.max_bytes // 4 // _BYTES_PER_WINDOW_BATCH)
    answer = ReplicaFetchResponse(
        epoch=epoch,
        position=req.position,
        leader_end=store.end_position,
        log_start=plan.position,
        committed=committed,
        epochs=[EpochStart(e.epoch, e.start_position) for e in history.entries],
        topics_version=store.topics_version,
        start_over=ReplicaStartOver(
            position=plan.position,
            queues=[ReplicaQueueStart(t, q, offset) for (t, q), offset in plan.queues.items()],
            compacted=[
                ReplicaCompactedFile(f.topic_id, f.queue_id, f.generation, f.start, f.end, f.size)
                for f in plan.compacted
            ],
            producers=[ReplicaProducerWindow(*row) for row in plan.producers],
        ),
    )
    add_topic_table(answer, store)
    log.info(
        "epoch %d: %s asked from log position %d, below this log's start %d: it starts over there",
        epoch,
        req.member,
        req.position,
        plan.position,
    )
    return answer


def file_answer(
    store: MessageStore, req: ReplicaFileRequest, max_bytes: int
) -> tuple[ReplicaFileResponse, bytes]:
    """The leader's answer to REPLICA_FILE: bytes of a compacted log file, at most
    `max_bytes` (and the request's)."""
    data, size = read_compacted_file(
        store,
        (req.topic_id, req.queue_id),
        req.generation,
        req.offset,
        min(req.max_bytes, max_bytes),
    )
    return ReplicaFileResponse(size=size, offset=req.offset), data


def plan_of(message: ReplicaStartOver) -> StartOverPlan:
    return StartOverPlan(
        position=message.position,
        queues={(q.topic_id, q.queue_id): q.next_offset for q in message.queues},
        compacted=[
            CompactedFile(f.topic_id, f.queue_id, f.generation, f.start, f.end, f.size)
            for f in message.compacted
        ],
        producers=[
            (p.topic_id, p.queue_id, p.producer_id, p.epoch, p.window) for p in message.producers
        ],
    )


async def copy_compacted_files(
    conn: ClientConnection,
    plan: StartOverPlan,
    *,
    fs: FileSystem,
    data_dir: Path,
    base: ReplicaFileRequest,
) -> None:
    """Copy each compacted file of `plan` into the staging directory, chunk by chunk
    (`base.max_bytes` each), synced and checked. `base` carries the group, member, epoch
    and chunk size; its file fields are set per file. The leader refuses a generation it
    compacted away meanwhile (OffsetOutOfRange): the follower then starts over again."""
    for f in plan.compacted:
        path = staging_path(data_dir, f)
        ensure_dir(fs, path.parent)
        handle = fs.open(path, create=True)
        try:
            handle.truncate(0)
            copied = 0
            while copied < f.size:
                request = ReplicaFileRequest(
                    group=base.group,
                    member=base.member,
                    epoch=base.epoch,
                    topic_id=f.topic_id,
                    queue_id=f.queue_id,
                    generation=f.generation,
                    offset=copied,
                    max_bytes=base.max_bytes,
                )
                answer, body = await conn.request(
                    request, ReplicaFileResponse, timeout_s=FILE_ANSWER_TIMEOUT_S
                )
                if answer.size != f.size or not body:
                    raise CorruptRecordError(
                        f"the leader's compacted log generation {f.generation} of topic id "
                        f"{f.topic_id} queue {f.queue_id} is {answer.size} bytes, not the "
                        f"{f.size} it named, or sent nothing at offset {copied}"
                    )
                handle.append((body,))
                copied += len(body)
            handle.sync()
        finally:
            handle.close()
        fs.sync_dir(path.parent)
        check_staged(fs, path, f)
    log.info("copied %d compacted log file(s) of the leader", len(plan.compacted))


async def restart_store(
    store: MessageStore,
    plan: StartOverPlan,
    history: EpochHistory,
    epochs: list[EpochEntry],
    *,
    clock: Clock,
    step: Callable[[str], None] | None,
) -> MessageStore:
    """Close `store`, start it over at `plan.position` with the staged files and the
    history `epochs`, and open it again; the store opened. The caller holds off
    everything else that uses the store meanwhile (compaction).

    Opened again whatever happens: after a failure recovery finds the marker and opens
    the store empty (its history emptied too), and `StartOverFailed` carries that store:
    the next round starts over again. A thread cannot be stopped halfway: a cancellation
    waits for it, and the store it opened is closed before the cancellation goes on."""
    config = store.config
    store.close()

    def replace() -> tuple[MessageStore, Exception | None]:
        error = None
        try:
            start_over(
                config,
                OsFileSystem(),
                plan,
                write_epochs=lambda: history.replace(epochs),
                step=step,
            )
        except Exception as exc:
            error = exc
        opened = MessageStore.open(config, clock=clock)
        if error is not None:
            history.replace([])  # recovery wiped the epoch file with the rest
        return opened, error

    task = asyncio.ensure_future(asyncio.to_thread(replace))
    try:
        opened, error = await asyncio.shield(task)
    except asyncio.CancelledError:
        (await task)[0].close()
        raise
    if error is not None:
        raise StartOverFailed(opened, error) from error
    return opened


async def start_over_at(
    conn: ClientConnection,
    answer: ReplicaFetchResponse,
    base: ReplicaFileRequest,
    store: MessageStore,
    history: EpochHistory,
    *,
    lock: asyncio.Lock,
    clock: Clock,
    step: Callable[[str], None] | None,
) -> tuple[MessageStore, int]:
    """The follower's side of a `start_over` answer: copy the leader's compacted log
    files (REPLICA_FILE, `base` naming the group, member, epoch and chunk size), then,
    holding `lock` (compaction's), start the store over at the leader's log start with
    the leader's epoch history up to there. Returns the store opened again and that
    position; `StartOverFailed` carries the store opened again (empty) on failure."""
    start = answer.start_over
    assert start is not None
    plan = plan_of(start)
    await copy_compacted_files(
        conn, plan, fs=OsFileSystem(), data_dir=store.config.data_dir, base=base
    )
    epochs = [
        EpochEntry(e.epoch, e.start_position)
        for e in answer.epochs
        if e.start_position <= plan.position
    ]
    async with lock:
        opened = await restart_store(store, plan, history, epochs, clock=clock, step=step)
    return opened, plan.position


class StartOverFailed(TidemqError):
    """A start-over failed (the disk, most likely); `store` is the store opened again,
    empty: the follower goes on with it and the next round starts over again."""

    def __init__(self, store: MessageStore, error: Exception) -> None:
        super().__init__(f"starting over failed, retried from an empty store: {error}")
        self.store = store


async def restart_empty(
    store: MessageStore, history: EpochHistory, *, clock: Clock
) -> MessageStore:
    """Close `store`, throw its log away (`mark_for_start_over`) and open it again,
    empty at position 0, with an empty epoch history: the next fetch starts over."""
    config = store.config
    store.close()

    def reopen() -> MessageStore:
        mark_for_start_over(OsFileSystem(), config.data_dir)
        opened = MessageStore.open(config, clock=clock)
        history.replace([])
        return opened

    task = asyncio.ensure_future(asyncio.to_thread(reopen))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        (await task).close()
        raise
