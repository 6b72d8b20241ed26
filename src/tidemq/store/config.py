"""StoreConfig: the storage engine's settings, validated once, frozen."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from tidemq.core import limits
from tidemq.core.errors import ConfigError

__all__ = ["FlushMode", "StoreConfig"]


class FlushMode(StrEnum):
    #: Acknowledge after fdatasync; one sync covers every record appended since the last.
    SYNC = "sync"
    #: Acknowledge once the bytes are in the kernel; sync every `flush_interval_ms`.
    ASYNC = "async"


@dataclass(frozen=True, kw_only=True)
class StoreConfig:
    data_dir: Path
    #: Commit-log segment size; a record never spans segments.
    segment_size_bytes: int = 1 << 30
    flush_mode: FlushMode = FlushMode.SYNC
    #: Async mode: the longest time an appended record waits for fdatasync.
    flush_interval_ms: int = 500
    #: How often index entries are written out and the checkpoint advanced. Recovery
    #: replays at most this much of the log (plus what the interval lets through).
    checkpoint_interval_ms: int = 1000
    #: Entries per queue-index file (40 bytes each; 262,144 entries = 10 MiB).
    index_entries_per_file: int = 1 << 18
    #: Sealed index files kept in memory for lookups, over all queues.
    index_cache_files: int = 256
    #: Key index (store/key_index.py): entries per file (40 bytes each; 1,048,576 = 40
    #: MiB). A full file is sorted and sealed at the next checkpoint (~0.1 s for this many).
    key_index_entries_per_file: int = 1 << 20
    #: Key index bound: once sealed files and a full open file would hold more entries
    #: than this, the oldest sealed file is deleted (its keys are no longer found by key).
    #: 33,554,432 entries = 1.25 GiB of disk.
    key_index_max_entries: int = 1 << 25
    #: Largest batch payload accepted by append (the broker's `max_message_bytes`).
    max_batch_bytes: int = 4 << 20
    #: Appends are refused above this fraction of the disk in use.
    disk_reject_ratio: float = 0.90
    #: Disk usage (statvfs) is read again after at most this many bytes appended, and
    #: after half the room left below the watermark (see DiskWatermark) ...
    disk_check_interval_bytes: int = 16 << 20
    #: ... and at least this often while appending (other files use the disk too).
    disk_check_interval_ms: int = 1_000
    #: Batches remembered per (producer, queue) to answer retried sends (Kafka keeps 5). An
    #: idempotent producer keeps at most this many in flight per queue; more in flight
    #: means more data per group commit (P1 with sync flush: 5 -> 32 in flight, see
    #: docs/design/performance.md).
    idempotence_window: int = 32
    #: Topic defaults when a topic does not set its own.
    retention_ms: int = 72 * 3600 * 1000
    retention_bytes: int = -1

    def __post_init__(self) -> None:
        if self.segment_size_bytes < limits.MIN_SEGMENT_BYTES:
            raise ConfigError(
                f"store.segment_size_bytes must be >= {limits.MIN_SEGMENT_BYTES}, "
                f"got {self.segment_size_bytes}"
            )
        if not isinstance(self.flush_mode, FlushMode):
            raise ConfigError(f"store.flush_mode must be sync or async, got {self.flush_mode!r}")
        for name in (
            "flush_interval_ms",
            "checkpoint_interval_ms",
            "index_entries_per_file",
            "index_cache_files",
            "max_batch_bytes",
            "disk_check_interval_bytes",
            "disk_check_interval_ms",
            "idempotence_window",
            "key_index_entries_per_file",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"store.{name} must be positive, got {getattr(self, name)}")
        if self.max_batch_bytes > limits.MAX_BATCH_BYTES:
            raise ConfigError(f"store.max_batch_bytes must be <= {limits.MAX_BATCH_BYTES}")
        if not 0.0 < self.disk_reject_ratio <= 1.0:
            raise ConfigError(
                f"store.disk_reject_ratio must be in (0, 1], got {self.disk_reject_ratio}"
            )
        if self.key_index_max_entries < self.key_index_entries_per_file:
            raise ConfigError(
                "store.key_index_max_entries must be >= store.key_index_entries_per_file "
                f"({self.key_index_entries_per_file}), got {self.key_index_max_entries}"
            )
        if self.retention_ms < -1 or self.retention_bytes < -1:
            raise ConfigError("store.retention_ms and retention_bytes must be >= -1 (-1: none)")
