"""What of each queue lives in the object store (tiered storage), as the store sees it.

The store never talks to the object store (`tidemq.tiered` does, through the broker's
tier service); it keeps, per queue with offloaded data, two offsets in its metadata::

    log_start ........ remote_end
    |  remote files  |
              local_min ...................... next_offset
              |        local index and log     |

* `remote_end`: every offset below it is in a verified, manifest-committed remote file.
  Local retention never moves a queue's min offset past it, so nothing is deleted from
  disk before the object store holds it (the tier service moves it only after the
  upload is verified and the manifest written).
* `log_start`: offsets below it are gone everywhere (remote retention). The queue's
  readable range starts here; [log_start, local_min) is read from the tier.

A queue of a topic with `remote.storage.enable=true` has no range until its first upload;
until then its local data is kept whatever its retention says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from tidemq.core.errors import ConfigError
from tidemq.store.metadata import Metadata

__all__ = ["RemoteRange", "RemoteRanges", "TierSettings", "tier_settings"]

#: `local.retention.*` value meaning "as `retention.*`" (Kafka's KIP-405 spelling).
USE_RETENTION: Final = -2


@dataclass(frozen=True, slots=True)
class RemoteRange:
    log_start: int
    remote_end: int


@dataclass(frozen=True, slots=True)
class TierSettings:
    enabled: bool
    #: -2: as retention.ms/bytes; -1: no limit (local copies kept as long as the data is).
    local_retention_ms: int
    local_retention_bytes: int


def _int(config: Mapping[str, str], key: str) -> int:
    raw = config.get(key, str(USE_RETENTION))
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"topic config {key} must be an integer, got {raw!r}") from None
    if value < USE_RETENTION:
        raise ConfigError(f"topic config {key} must be >= -2 (-2: as retention), got {value}")
    return value


def tier_settings(config: Mapping[str, str]) -> TierSettings:
    """A topic's tiered-storage configs (Kafka's names); ConfigError naming a bad one."""
    raw = config.get("remote.storage.enable", "false").lower()
    if raw not in ("true", "false"):
        raise ConfigError(f"remote.storage.enable must be true or false, got {raw!r}")
    return TierSettings(
        enabled=raw == "true",
        local_retention_ms=_int(config, "local.retention.ms"),
        local_retention_bytes=_int(config, "local.retention.bytes"),
    )


class RemoteRanges:
    def __init__(self, metadata: Metadata) -> None:
        self._meta = metadata
        self._ranges = {
            key: RemoteRange(start, end) for key, (start, end) in metadata.remote_ranges().items()
        }
        #: Keys set since the broker last wrote them into the replicated log
        #: (`broker/member_tables.py`).
        self.changed: set[tuple[int, int]] = set()

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self._ranges

    def keys(self) -> list[tuple[int, int]]:
        return list(self._ranges)

    def get(self, key: tuple[int, int]) -> RemoteRange | None:
        return self._ranges.get(key)

    def set(self, key: tuple[int, int], log_start: int, remote_end: int) -> None:
        # Remote retention may pass what was uploaded: nothing is remote then.
        remote_end = max(remote_end, log_start)
        self._meta.set_remote_range(key[0], key[1], log_start, remote_end)
        self._ranges[key] = RemoteRange(log_start, remote_end)
        self.changed.add(key)

    def drop_topic(self, topic_id: int) -> None:
        for key in [k for k in self._ranges if k[0] == topic_id]:
            del self._ranges[key]
