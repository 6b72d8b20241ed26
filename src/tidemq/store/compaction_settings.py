"""A compact topic's settings, by Kafka's topic config names, with Kafka's defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from tidemq.core.errors import ConfigError

__all__ = ["COMPACTION_KEYS", "CompactionSettings", "compaction_settings"]

_LONG_MAX: Final = (1 << 63) - 1

#: Key: (default, meaning). Kafka's names and defaults.
COMPACTION_KEYS: Final[dict[str, tuple[str, str]]] = {
    "min.compaction.lag.ms": ("0", "messages younger than this are never compacted"),
    "max.compaction.lag.ms": (
        str(_LONG_MAX),
        "a message is compacted at most this long after it was written, whatever the ratio",
    ),
    "min.cleanable.dirty.ratio": (
        "0.5",
        "compact once not-yet-compacted bytes are at least this share of the queue",
    ),
    "delete.retention.ms": (
        "86400000",
        "a tombstone stays readable this long after compaction reached it",
    ),
}


@dataclass(frozen=True, slots=True)
class CompactionSettings:
    min_lag_ms: int = 0
    max_lag_ms: int = _LONG_MAX
    dirty_ratio: float = 0.5
    delete_retention_ms: int = 86_400_000


def _int(config: Mapping[str, str], key: str) -> int:
    raw = config.get(key, COMPACTION_KEYS[key][0])
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"topic config {key} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"topic config {key} must be >= 0, got {value}")
    return value


def compaction_settings(config: Mapping[str, str]) -> CompactionSettings:
    """The settings in a topic's config (ConfigError naming a bad key and value)."""
    raw = config.get("min.cleanable.dirty.ratio", "0.5")
    try:
        ratio = float(raw)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"topic config min.cleanable.dirty.ratio must be 0..1, got {raw!r}")
    settings = CompactionSettings(
        min_lag_ms=_int(config, "min.compaction.lag.ms"),
        max_lag_ms=_int(config, "max.compaction.lag.ms"),
        dirty_ratio=ratio,
        delete_retention_ms=_int(config, "delete.retention.ms"),
    )
    if settings.max_lag_ms < settings.min_lag_ms:
        raise ConfigError(
            f"topic config max.compaction.lag.ms ({settings.max_lag_ms}) must be >= "
            f"min.compaction.lag.ms ({settings.min_lag_ms})"
        )
    return settings
