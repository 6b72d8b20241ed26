"""A replica starting over at its leader's log start (docs/design/replication.md,
"Starting over").

A follower pulls its leader's commit log by position. When the follower's log ends below
the leader's log start (it was stopped while the leader's retention deleted the
segments it needs next, or it joins a group whose first segments are gone), there is
nothing left to pull from there: the follower throws its copy away and starts its store
over at the leader's log start S. The leader names S, where each queue continues at S
(the offset of its first record at or after S), and its compact queues' compacted logs,
which hold what the deleted segments held of those queues (ADR 8). Each compacted log
generation is one self-contained file; the follower copies them whole into a staging
directory first, checks each (footer, checksum, end), and only then touches its store.

The start-over itself, on a closed store, is crash-safe by a marker file:

1. write `start-over` (synced, and its directory);
2. wipe: the commit log, queue indexes, key index, checkpoint, epoch file, and the
   metadata rows derived from the log (`Metadata.forget_log_state`);
3. create an empty log whose first segment starts at S;
4. record each queue's end and min offset at its offset at S (recovery then resets each
   empty index to continue there, as it does for a queue whose records all went with
   their segments), and the leader's producer windows of batches before S (recovery
   loads them as its snapshot: a retry of such a batch is answered, not stored again);
5. move the staged compacted files into their queues' directories and switch to them;
6. write a checkpoint at S, and the follower's epoch history (the leader's, up to S);
7. remove the marker.

A store opened with the marker present (a crash anywhere in 1-6) is wiped again and
opens empty at position 0 (`discard_interrupted`): the follower then asks from 0 and
starts over again. Nothing half-installed is ever served.

Kept through a start-over: topics (mirrored from the leader before), the topic-id and
producer-id counters, users, ACLs, the saved service state, static chains and remote
ranges (metadata not in the log; the chains and ranges are then read again from their
replicated topic, `broker/member_tables.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tidemq.core.errors import CorruptRecordError, OffsetOutOfRange
from tidemq.store.checkpoint import NAME as CHECKPOINT_FILE
from tidemq.store.checkpoint import write_checkpoint
from tidemq.store.compacted_log import CompactedLog, compacted_dir, file_name
from tidemq.store.epoch_file import EPOCH_FILE
from tidemq.store.files import FileSystem, ensure_dir
from tidemq.store.format.checkpoint import Checkpoint
from tidemq.store.message_store import queue_dir
from tidemq.store.metadata import Metadata
from tidemq.store.producer_state import ProducerRow
from tidemq.store.segmented_log import segment_name

if TYPE_CHECKING:
    from tidemq.store.config import StoreConfig
    from tidemq.store.message_store import MessageStore

__all__ = [
    "MARKER",
    "CompactedFile",
    "StartOverPlan",
    "check_staged",
    "discard_interrupted",
    "mark_for_start_over",
    "plan_start_over",
    "read_compacted_file",
    "staging_path",
    "start_over",
]

#: Present while a start-over is under way: a store opened with it is wiped again.
MARKER: Final = "start-over"
#: Where a starting-over follower puts the leader's compacted log files as it copies them.
STAGING: Final = "start-over.staging"
#: What a start-over removes (besides the marker, the staging directory and metadata rows).
_WIPED_DIRS: Final = ("commitlog", "queues", "keyindex")
_WIPED_FILES: Final = (CHECKPOINT_FILE, EPOCH_FILE)


@dataclass(frozen=True, slots=True)
class CompactedFile:
    """One compact queue's compacted log at the leader: generation, offsets [start,
    end) it serves, and the file's length."""

    topic_id: int
    queue_id: int
    generation: int
    start: int
    end: int
    size: int


@dataclass(frozen=True, slots=True)
class StartOverPlan:
    #: The leader's log start: the follower's log starts here.
    position: int
    #: (topic id, queue id) -> the queue's offset at `position`.
    queues: dict[tuple[int, int], int]
    compacted: list[CompactedFile]
    #: Producer windows of the batches before `position` (`ProducerStates.rows_before`).
    producers: list[ProducerRow] = field(default_factory=list)


# ---------------------------------------------------------------------- leader side


#: Producer-window batches a plan carries at most by default.
MAX_PLAN_BATCHES: Final = 65_536


def plan_start_over(store: MessageStore, max_batches: int = MAX_PLAN_BATCHES) -> StartOverPlan:
    """What a follower needs to start over at this store's log start; at most
    `max_batches` batches of producer windows (the newest)."""
    position = store.log.start_position
    return StartOverPlan(
        position=position,
        queues={
            key: index.offset_at_position(position) for key, index in store.queue_indexes().items()
        },
        compacted=[
            CompactedFile(t, q, log.generation, log.start, log.end, log.file_size())
            for (t, q), log in store.compacted.items()
        ],
        producers=store.producer_states.rows_before(position, max_batches),
    )


def read_compacted_file(
    store: MessageStore, key: tuple[int, int], generation: int, offset: int, max_bytes: int
) -> tuple[bytes, int]:
    """(bytes from `offset`, at most `max_bytes`; the file's length) of a queue's current
    compacted log generation. OffsetOutOfRange when that generation is gone (compacted
    again since the plan, or the topic deleted): the follower starts over again."""
    found = store.compacted.get(key)
    if found is None or found.generation != generation:
        now = "none" if found is None else str(found.generation)
        raise OffsetOutOfRange(
            f"compacted log generation {generation} of topic id {key[0]} queue {key[1]} is "
            f"gone (current generation: {now}); start over again"
        )
    size = found.file_size()
    if not 0 <= offset <= size:
        raise OffsetOutOfRange(
            f"offset {offset} is outside compacted log generation {generation} of topic id "
            f"{key[0]} queue {key[1]} ({size} bytes)"
        )
    return found.read_file(offset, max_bytes), size


# ---------------------------------------------------------------------- follower side


def staging_path(data_dir: Path, f: CompactedFile) -> Path:
    return data_dir / STAGING / f"{f.topic_id}-{f.queue_id}-{file_name(f.generation)}"


def check_staged(fs: FileSystem, path: Path, f: CompactedFile) -> None:
    """A copied file is the generation the leader named: whole, its checksum holding,
    ending where the leader said (CorruptRecordError otherwise)."""
    opened = CompactedLog.open(fs, path, generation=f.generation, start=f.start)
    try:
        if opened.end != f.end:
            raise CorruptRecordError(
                f"copied compacted log {path} ends at offset {opened.end}, the leader's at {f.end}"
            )
    finally:
        opened.close()


def start_over(
    config: StoreConfig,
    fs: FileSystem,
    plan: StartOverPlan,
    *,
    write_epochs: Callable[[], None],
    step: Callable[[str], None] | None = None,
) -> None:
    """Start the (closed) store in `config.data_dir` over at `plan.position`, with the
    compacted files staged by `staging_path` (checked by `check_staged`). Topics must
    be mirrored already. `write_epochs()` writes the member's epoch history for the new
    log (while the marker still stands). `step(name)`: called before each step (fault
    injection for tests; production passes none)."""
    data_dir = config.data_dir
    marker = data_dir / MARKER

    def at(name: str) -> None:
        if step is not None:
            step(name)

    at("marker")
    fs.open(marker, create=True).close()
    fs.sync_dir(data_dir)
    meta = Metadata(data_dir / "meta.sqlite")
    try:
        at("wipe")
        _wipe(fs, data_dir, meta)
        at("log")
        segments = data_dir / "commitlog"
        ensure_dir(fs, segments)
        fs.open(segments / segment_name(plan.position), create=True).close()
        fs.sync_dir(segments)
        at("queues")
        topics = {t.id: t for t in meta.live_topics()}
        starts = {
            key: offset
            for key, offset in plan.queues.items()
            if key[0] in topics and key[1] < topics[key[0]].queues
        }
        meta.set_queue_index_ends(starts)
        meta.set_queue_min_offsets(starts)
        meta.save_producer_state(r for r in plan.producers if (r[0], r[1]) in starts)
        at("compacted")
        for f in plan.compacted:
            key = (f.topic_id, f.queue_id)
            if key not in starts:
                continue  # deleted since the plan: the mirror of topics dropped it
            where = compacted_dir(queue_dir(data_dir, topics[f.topic_id], f.queue_id))
            ensure_dir(fs, where)
            fs.replace(staging_path(data_dir, f), where / file_name(f.generation))
            fs.sync_dir(where)
            meta.set_compacted_log(f.topic_id, f.queue_id, f.generation, f.start, f.end)
        at("checkpoint")
        # Store time 0: the leader's records from S on are the first this log holds.
        write_checkpoint(fs, data_dir, Checkpoint(plan.position, plan.position, 0))
        at("epochs")
        write_epochs()
        at("done")
        fs.remove(marker)
        fs.sync_dir(data_dir)
    finally:
        meta.close()
    _remove_staging(fs, data_dir)


def mark_for_start_over(fs: FileSystem, data_dir: Path) -> None:
    """Throw the (closed) store's log away at its next open: write the marker alone,
    which recovery treats as an interrupted start-over. For a follower whose log differs
    from its leader's from a position below its own log start (its retention deleted
    where it would have to cut): it cannot cut there, so it starts over."""
    fs.open(data_dir / MARKER, create=True).close()
    fs.sync_dir(data_dir)


def discard_interrupted(fs: FileSystem, data_dir: Path, meta: Metadata) -> bool:
    """Recovery: a start-over was interrupted (the marker stands). Wipe what it left, so
    the store opens empty at position 0 and its follower starts over again. Returns
    whether there was one."""
    marker = data_dir / MARKER
    if not fs.exists(marker):
        _remove_staging(fs, data_dir)  # a copy interrupted before the store was touched
        return False
    _wipe(fs, data_dir, meta)
    fs.remove(marker)
    fs.sync_dir(data_dir)
    _remove_staging(fs, data_dir)
    return True


def _wipe(fs: FileSystem, data_dir: Path, meta: Metadata) -> None:
    for name in _WIPED_DIRS:
        if fs.exists(data_dir / name):
            fs.remove_tree(data_dir / name)
    for name in _WIPED_FILES:
        if fs.exists(data_dir / name):
            fs.remove(data_dir / name)
    fs.sync_dir(data_dir)
    meta.forget_log_state()


def _remove_staging(fs: FileSystem, data_dir: Path) -> None:
    if fs.exists(data_dir / STAGING):
        fs.remove_tree(data_dir / STAGING)
        fs.sync_dir(data_dir)
