"""What a compact topic's configuration asks of compaction (issue 18), by Kafka's topic
config names, in one value the store's compactor reads and the broker's topic config fills.

Kafka's semantics and defaults:

* `min.compaction.lag.ms` (0): a message younger than this (by store time) is never
  compacted away, even if a newer value of its key exists.
* `max.compaction.lag.ms` (none): a queue whose oldest uncompacted message is older than
  this is compacted even below the dirty ratio.
* `min.cleanable.dirty.ratio` (0.5): compact a queue once the part written since its last
  compaction (the dirty part) is at least this share of its bytes.
* `delete.retention.ms` (1 day): a tombstone (a key with a null value) stays readable this
  long after compaction first reached it, so that a consumer reading from the start sees
  the delete; then compaction removes it.
* `cleanup.policy` `compact,delete` also applies the topic's time and size retention.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["DEFAULT_DELETE_RETENTION_MS", "DEFAULT_MIN_DIRTY_RATIO", "CompactionPolicy"]

DEFAULT_DELETE_RETENTION_MS: Final = 86_400_000
DEFAULT_MIN_DIRTY_RATIO: Final = 0.5


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """One compact topic's compaction settings (validated by whoever builds it)."""

    #: `min.compaction.lag.ms`: messages stored less than this long ago are kept.
    min_lag_ms: int = 0
    #: `max.compaction.lag.ms`: compact regardless of the dirty ratio past this; None: never.
    max_lag_ms: int | None = None
    #: `min.cleanable.dirty.ratio`, in [0, 1].
    min_dirty_ratio: float = DEFAULT_MIN_DIRTY_RATIO
    #: `delete.retention.ms`: how long a tombstone stays once compaction has reached it.
    delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS
    #: `cleanup.policy` includes `delete`: time and size retention apply as well.
    also_delete: bool = False

    def __post_init__(self) -> None:
        if self.min_lag_ms < 0:
            raise ValueError(f"min_lag_ms must be >= 0, got {self.min_lag_ms}")
        if self.max_lag_ms is not None and self.max_lag_ms < self.min_lag_ms:
            raise ValueError(
                f"max_lag_ms ({self.max_lag_ms}) must be >= min_lag_ms ({self.min_lag_ms})"
            )
        if not 0.0 <= self.min_dirty_ratio <= 1.0:
            raise ValueError(f"min_dirty_ratio must be in [0, 1], got {self.min_dirty_ratio}")
        if self.delete_retention_ms < 0:
            raise ValueError(f"delete_retention_ms must be >= 0, got {self.delete_retention_ms}")
