"""Retention: advance each queue's min offset by time and size, then delete log segments
that no queue needs any more.

Only whole batches are removed. Time retention keeps every batch stored at or after
`now - retention.ms`; size retention keeps the newest batches whose records add up to at
most `retention.bytes`. A segment is deleted only when every live queue's first kept
record lies past it and the checkpoint no longer needs it for recovery.

A topic with `remote.storage.enable=true` keeps its local copies by `local.retention.*`
instead, and never drops one that is not yet verified in the object store (its remote
end, `remote_ranges.py`); how long its data exists at all is the tier service's business.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tidemq.store.config import StoreConfig
from tidemq.store.metadata import CleanupPolicy, TopicInfo
from tidemq.store.remote_ranges import USE_RETENTION, TierSettings, tier_settings

if TYPE_CHECKING:
    from tidemq.store.message_store import MessageStore

__all__ = ["apply_retention"]


def apply_retention(store: MessageStore) -> int:
    now = store.clock.now_ms()
    config = store.config
    indexes = store.queue_indexes()
    changed: dict[tuple[int, int], int] = {}
    for info in store.topics():
        if info.cleanup_policy is CleanupPolicy.COMPACT:
            continue  # compact-only topics keep the latest value per key, not a time window
        tier = tier_settings(info.config)
        retention_ms, retention_bytes = _local_limits(info, config, tier)
        for q in range(info.queues):
            index = indexes[(info.id, q)]
            compacted = store.compacted.get((info.id, q))
            if compacted is not None and retention_ms >= 0:
                # compact,delete: compacted messages older than retention.ms go too.
                kept = compacted.offset_for_time(now - retention_ms)
                store.compacted.advance_start((info.id, q), compacted.end if kept is None else kept)
            new_min = index.min_offset
            if retention_ms >= 0:
                new_min = max(new_min, index.offset_for_time(now - retention_ms))
            if retention_bytes >= 0:
                new_min = max(
                    new_min, _offset_for_size(index.all_entries(), new_min, retention_bytes)
                )
            if tier.enabled:
                # Never past what the object store verifiably holds (none uploaded yet:
                # nothing goes).
                remote = store.remote.get((info.id, q))
                new_min = min(new_min, index.min_offset if remote is None else remote.remote_end)
            if new_min > index.min_offset:
                index.advance_min_offset(new_min)
                changed[(info.id, q)] = index.min_offset
    if changed:
        store.metadata.set_queue_min_offsets(changed)

    needed = min(store.indexed_position, store.log.end_position)
    pin = store.log_pin
    if pin is not None:
        needed = min(needed, pin)
    for index in indexes.values():
        first = index.first_entry()
        if first is not None and index.min_offset < index.next_offset:
            needed = min(needed, first.log_position)
    deleted = len(store.log.segments.delete_segments_before(needed))
    # Key-index files pointing only into deleted segments name nothing readable now.
    store.key_index.drop_before(store.log.start_position)
    return deleted


def _local_limits(info: TopicInfo, config: StoreConfig, tier: TierSettings) -> tuple[int, int]:
    """(ms, bytes) of a topic's local retention: its retention.*, or for an offloaded
    topic its local.retention.* (-2: as retention.*)."""
    retention_ms = config.retention_ms if info.retention_ms is None else info.retention_ms
    retention_bytes = (
        config.retention_bytes if info.retention_bytes is None else info.retention_bytes
    )
    if tier.enabled and tier.local_retention_ms != USE_RETENTION:
        retention_ms = tier.local_retention_ms
    if tier.enabled and tier.local_retention_bytes != USE_RETENTION:
        retention_bytes = tier.local_retention_bytes
    return retention_ms, retention_bytes


def _offset_for_size(entries: npt.NDArray[np.void], min_offset: int, retention_bytes: int) -> int:
    """The first offset to keep so that the kept batches total at most retention_bytes."""
    live = entries[entries["base_offset"] + entries["count"] > min_offset]
    if len(live) == 0:
        # No entries, or all of them below the min offset: a queue that retention emptied
        # keeps entries below it until their index file can go.
        return min_offset
    sizes = live["size"].astype(np.int64)
    # bytes kept if we start at batch i = suffix sum from i
    suffix = np.cumsum(sizes[::-1])[::-1]
    keep_from = int(np.searchsorted(-suffix, -retention_bytes, side="left"))
    if keep_from >= len(live):
        last = live[-1]
        return int(last["base_offset"] + last["count"])
    return max(min_offset, int(live["base_offset"][keep_from]))
