"""Opening a store: find the valid end of the log, re-derive what the crash may have lost.

1. Read the checkpoint (missing or damaged: replay from the start of the log).
2. Open every live topic's queue indexes and cut each at the checkpoint's indexed
   position: entries past it may point at records the crash tore off.
3. Scan the log from that position, checking each record's header CRC and payload CRC;
   the first bad or zero-length record in the last segment is the end of the log.
4. Re-append an index entry, and replay the producer state, for every record scanned.
   An index that, once cut, falls short of the end recorded at the last checkpoint has
   lost entries behind the store's back (a file deleted or cut short): it is rebuilt
   from the whole log first.
5. Truncate the torn tail and write a fresh checkpoint.

Before all this, a replica's interrupted start-over (its marker file) is wiped away
(`start_over.discard_interrupted`): the store then opens empty.

After this no index entry points past the recovered log, and every queue continues at
the offset after its last recovered record.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tidemq.core.batch import parse_envelope
from tidemq.core.clock import Clock
from tidemq.core.errors import CorruptRecordError
from tidemq.core.record import RecordFlags
from tidemq.store.checkpoint import read_checkpoint
from tidemq.store.commit_log import CommitLog, ScannedRecord
from tidemq.store.compacted_queues import open_compacted_logs
from tidemq.store.config import StoreConfig
from tidemq.store.files import FileSystem, ensure_dir
from tidemq.store.key_index import KeyIndex, batch_keys, indexes_topic
from tidemq.store.message_store import MessageStore, queue_dir
from tidemq.store.metadata import Metadata
from tidemq.store.producer_state import NO_PRODUCER, ProducerStamp, ProducerStates
from tidemq.store.queue_index import IndexFileCache, QueueIndex
from tidemq.store.segmented_log import SegmentedLog
from tidemq.store.start_over import discard_interrupted

__all__ = ["recover"]

log_ = logging.getLogger(__name__)


def recover(config: StoreConfig, fs: FileSystem, clock: Clock, metadata_path: Path) -> MessageStore:
    ensure_dir(fs, config.data_dir)
    meta = Metadata(metadata_path)
    try:
        return _recover(config, fs, clock, meta)
    except BaseException:
        meta.close()
        raise


def _recover(config: StoreConfig, fs: FileSystem, clock: Clock, meta: Metadata) -> MessageStore:
    if discard_interrupted(fs, config.data_dir, meta):
        log_.warning(
            "%s: a replica's start-over was interrupted; the store is wiped and opens empty "
            "(its follower starts over again)",
            config.data_dir,
        )
    cp = read_checkpoint(fs, config.data_dir)
    segments = SegmentedLog(fs, config.data_dir / "commitlog", config.segment_size_bytes)
    log = CommitLog(segments, clock=clock)
    replay_from = max(cp.indexed_position if cp else 0, log.start_position)
    if cp is not None:
        log.note_store_time(cp.max_store_time_ms)
    if replay_from > log.end_position:
        message = (
            f"checkpoint says position {replay_from} was flushed but the log ends at "
            f"{log.end_position}: acknowledged data is missing from {config.data_dir}"
        )
        log.close()
        raise CorruptRecordError(message)

    cache = IndexFileCache(config.index_cache_files)
    queues = _open_indexes(config, fs, meta, cache, replay_from)
    ends = meta.queue_index_ends()
    rebuilt = _rebuild_damaged_indexes(log, queues, ends, replay_from)

    producers = ProducerStates(config.idempotence_window)
    producers.load(meta.load_producer_state())
    keys = _open_key_index(config, fs, replay_from)
    keyed = {t.id for t in meta.live_topics() if indexes_topic(t.name, t.config)}
    valid_end = replay_from
    for rec in log.scan(replay_from):
        h = rec.header
        valid_end = rec.position + h.size
        log.note_store_time(h.store_time_ms)
        index = queues.get((h.topic_id, h.queue_id))
        if index is None:
            continue  # a deleted topic: its records wait for retention
        _index_record(index, rec, rebuilding=(h.topic_id, h.queue_id) in rebuilt)
        if h.topic_id in keyed and rec.position >= keys.covered_position:
            _index_keys(keys, rec)
        if h.producer_id != NO_PRODUCER:
            stamp = ProducerStamp(h.producer_id, h.producer_epoch, h.base_sequence)
            producers.record(
                (h.topic_id, h.queue_id, h.producer_id), stamp, h.count, h.base_offset, valid_end
            )
    # A snapshot saved before the log was cut (replication's truncation, interrupted)
    # may remember batches past the end: they are not stored.
    producers.cut_from_position(valid_end)
    if valid_end < log.end_position:
        log.truncate_to(valid_end)
    else:
        log.truncate_to(log.end_position)
    _finish_rebuilt_indexes(rebuilt, ends)
    # Only now: before the replay a queue may end below its saved min offset (retention
    # ran on records past the checkpoint), and clamping there would lose the mark.
    min_offsets = meta.queue_min_offsets()
    for key, index in queues.items():
        saved_min = min_offsets.get(key, 0)
        index.min_offset = min(max(index.min_offset, saved_min), index.next_offset)
    compacted = open_compacted_logs(
        fs,
        meta,
        {
            (t.id, q): queue_dir(config.data_dir, t, q)
            for t in meta.live_topics()
            for q in range(t.queues)
        },
    )
    store = MessageStore(
        key_index=keys,
        compacted=compacted,
        config=config,
        fs=fs,
        clock=clock,
        metadata=meta,
        log=log,
        queues=queues,
        producers=producers,
        index_cache=cache,
        indexed_position=replay_from,
    )
    store.mark_all_queues_dirty()  # re-derived entries must reach their files
    store.checkpoint()
    return store


def _rebuild_damaged_indexes(
    log: CommitLog,
    queues: dict[tuple[int, int], QueueIndex],
    ends: dict[tuple[int, int], int],
    replay_from: int,
) -> dict[tuple[int, int], QueueIndex]:
    """Indexes that, cut back to the checkpoint, fall short of the end a checkpoint saw:
    entries it wrote were lost (a file deleted or cut short behind the store's back).
    Left alone, the queue would hand out those offsets again. Each is emptied and
    re-derived from the whole log up to `replay_from`; the replay goes on from there."""
    rebuilt = {k: index for k, index in queues.items() if index.next_offset < ends.get(k, 0)}
    if not rebuilt:
        return rebuilt
    for index in rebuilt.values():
        index.reset(0)
    for rec in log.scan(log.start_position):
        if rec.position >= replay_from:
            break
        damaged = rebuilt.get((rec.header.topic_id, rec.header.queue_id))
        if damaged is not None:
            _index_record(damaged, rec, rebuilding=True)
    return rebuilt


def _finish_rebuilt_indexes(
    rebuilt: dict[tuple[int, int], QueueIndex], ends: dict[tuple[int, int], int]
) -> None:
    """After the replay: a rebuilt queue with no record left in the log continues at its
    recorded end."""
    for key, index in rebuilt.items():
        if index.next_offset < ends[key]:
            if index.last_position >= 0:
                raise CorruptRecordError(
                    f"topic id {key[0]} queue {key[1]} ends at offset {index.next_offset} "
                    f"in the log, but a checkpoint saw it reach {ends[key]}"
                )
            index.reset(ends[key])  # every record of the queue went with its segments


def _open_key_index(config: StoreConfig, fs: FileSystem, replay_from: int) -> KeyIndex:
    """The key index, its open file cut back to the replay position."""
    keys = KeyIndex(
        fs,
        config.data_dir / "keyindex",
        entries_per_file=config.key_index_entries_per_file,
        max_entries=config.key_index_max_entries,
    )
    keys.cut_from_position(replay_from)
    return keys


def _index_keys(keys: KeyIndex, rec: ScannedRecord) -> None:
    h = rec.header
    if h.flags & RecordFlags.COMPACTED:
        return  # only compaction writes these, into its own files, never the log
    payload = rec.record[h.payload_start :]
    keys.add(
        batch_keys(payload, parse_envelope(payload, verify_crc=False)),
        base_offset=h.base_offset,
        log_position=rec.position,
        store_time_ms=h.store_time_ms,
        topic_id=h.topic_id,
        queue_id=h.queue_id,
    )


def _index_record(index: QueueIndex, rec: ScannedRecord, *, rebuilding: bool) -> None:
    h = rec.header
    if h.base_offset < index.next_offset and h.base_offset + h.count <= index.min_offset:
        # Below the first index file: retention deleted the file holding its entry (after
        # the checkpoint, before the crash) and raised the queue's min offset past it.
        return
    if h.base_offset != index.next_offset:
        if not (rebuilding and index.last_position < 0 and h.base_offset > index.next_offset):
            raise CorruptRecordError(
                f"record at {rec.position} has offset {h.base_offset} for topic id "
                f"{h.topic_id} queue {h.queue_id}, but the queue continues at "
                f"{index.next_offset}"
            )
        # The first record left of a queue being rebuilt: the ones before it went with
        # their log segments (retention), so the queue starts here.
        index.reset(h.base_offset)
    index.append(rec.position, h.size, h.count, h.store_time_ms, rec.tag_summary)


def _open_indexes(
    config: StoreConfig, fs: FileSystem, meta: Metadata, cache: IndexFileCache, replay_from: int
) -> dict[tuple[int, int], QueueIndex]:
    """Every live queue's index, cut back to the replay position."""
    topics = meta.live_topics()
    _remove_orphan_dirs(fs, config.data_dir, {f"{t.id}-{t.name}" for t in topics})
    queues: dict[tuple[int, int], QueueIndex] = {}
    for info in topics:
        for q in range(info.queues):
            index = QueueIndex(
                fs,
                queue_dir(config.data_dir, info, q),
                entries_per_file=config.index_entries_per_file,
                cache=cache,
            )
            index.cut_from_position(replay_from)
            queues[(info.id, q)] = index

    return queues


def _remove_orphan_dirs(fs: FileSystem, data_dir: Path, live: set[str]) -> None:
    """Index directories of topics deleted before a crash finished removing them."""
    root = data_dir / "queues"
    for name in fs.listdir(root):
        if name not in live:
            fs.remove_tree(root / name)
