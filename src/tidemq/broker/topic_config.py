"""Topic configs by their Kafka names, validated, and mapped onto the store's topic fields.

Known keys and their meaning are listed in `KNOWN`; anything else is refused with the key
named, so a typo never silently does nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from tidemq.core.errors import ConfigError
from tidemq.store.compaction_settings import COMPACTION_KEYS, compaction_settings
from tidemq.store.key_index import KEY_INDEX_CONFIG
from tidemq.store.metadata import CleanupPolicy, MessageType
from tidemq.store.remote_ranges import USE_RETENTION, tier_settings

__all__ = [
    "HOSTED_QUEUES_KEY",
    "KNOWN",
    "TopicSettings",
    "check_tier_config",
    "parse_hosted",
    "parse_message_type",
    "parse_topic_config",
]

#: Internal key: the queues of a multi-broker topic that this broker serves.
HOSTED_QUEUES_KEY: Final = "tidemq.hosted.queues"

KNOWN: Final[dict[str, str]] = {
    "cleanup.policy": "delete | compact | compact,delete",
    "retention.ms": "keep batches this long (-1: forever)",
    "retention.bytes": "keep at most this many bytes per queue (-1: no limit)",
    "max.message.bytes": "largest batch accepted for this topic",
    "message.timestamp.type": "CreateTime | LogAppendTime",
    "compression.type": "producer | none | zstd | lz4 (what producers should use)",
    "segment.bytes": "accepted for Kafka compatibility; the commit log is shared (a compact "
    "topic's dirty range is bounded by min.cleanable.dirty.ratio and max.compaction.lag.ms)",
    "segment.ms": "accepted for Kafka compatibility; the commit log is shared",
    **{key: meaning for key, (_, meaning) in COMPACTION_KEYS.items()},
    "schema.validation": "true | false: refuse values whose schema id is not registered "
    "under <topic>-value in the schema registry",
    "remote.storage.enable": "true | false: offload sealed data to the object store "
    "(tiered.url); once on, stays on",
    "local.retention.ms": "keep local copies of offloaded data this long (-2: as "
    "retention.ms; -1: forever)",
    "local.retention.bytes": "keep at most this many bytes locally per queue (-2: as "
    "retention.bytes; -1: no limit)",
    KEY_INDEX_CONFIG: "true | false: index message keys for queries by key (default true; "
    "false saves the index's cost on produce)",
}


@dataclass(frozen=True, slots=True)
class TopicSettings:
    cleanup_policy: CleanupPolicy | None
    retention_ms: int | None
    retention_bytes: int | None
    extra: dict[str, str]


def _int(key: str, value: str, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"topic config {key} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ConfigError(f"topic config {key} must be >= {minimum}, got {number}")
    return number


def parse_topic_config(config: Mapping[str, str]) -> TopicSettings:
    unknown = sorted(k for k in config if k not in KNOWN and k != HOSTED_QUEUES_KEY)
    if unknown:
        raise ConfigError(
            f"unknown topic config {', '.join(unknown)}; known: {', '.join(sorted(KNOWN))}"
        )
    policy = None
    if "cleanup.policy" in config:
        value = config["cleanup.policy"].replace(" ", "")
        try:
            policy = CleanupPolicy(value)
        except ValueError:
            raise ConfigError(
                f"cleanup.policy must be delete, compact or compact,delete, got {value!r}"
            ) from None
    retention_ms = (
        _int("retention.ms", config["retention.ms"], -1) if "retention.ms" in config else None
    )
    retention_bytes = (
        _int("retention.bytes", config["retention.bytes"], -1)
        if "retention.bytes" in config
        else None
    )
    if "max.message.bytes" in config:
        _int("max.message.bytes", config["max.message.bytes"], 1)
    compaction_settings(config)  # ConfigError naming a bad compaction key
    if config.get("schema.validation", "false").lower() not in ("true", "false"):
        raise ConfigError(
            f"schema.validation must be true or false, got {config['schema.validation']!r}"
        )
    tier_settings(config)  # ConfigError naming a bad tiered-storage key
    if config.get(KEY_INDEX_CONFIG, "true").lower() not in ("true", "false"):
        raise ConfigError(
            f"{KEY_INDEX_CONFIG} must be true or false, got {config[KEY_INDEX_CONFIG]!r}"
        )
    if config.get("message.timestamp.type", "CreateTime") not in ("CreateTime", "LogAppendTime"):
        raise ConfigError("message.timestamp.type must be CreateTime or LogAppendTime")
    extra = {
        k: v
        for k, v in config.items()
        if k not in ("cleanup.policy", "retention.ms", "retention.bytes")
    }
    return TopicSettings(policy, retention_ms, retention_bytes, extra)


def parse_message_type(value: str) -> MessageType:
    try:
        return MessageType(value.upper())
    except ValueError:
        raise ConfigError(
            f"message type must be one of {', '.join(t.value for t in MessageType)}, got {value!r}"
        ) from None


def parse_hosted(config: Mapping[str, str], queues: int) -> list[int]:
    """The hosted queue ids stored in a topic's config (all queues when absent)."""
    raw = config.get(HOSTED_QUEUES_KEY, "")
    if not raw:
        return list(range(queues))
    return [int(q) for q in raw.split(",")]


def _within(local: int, total: int) -> bool:
    """Whether a local retention (-2: as total, -1: none) keeps no more than the total."""
    if local == USE_RETENTION or total < 0:
        return True
    return 0 <= local <= total


def check_tier_config(
    before: Mapping[str, str] | None,
    after: Mapping[str, str],
    *,
    compact: bool,
    retention_ms: int,
    retention_bytes: int,
    tier_configured: bool,
) -> None:
    """A topic's tiered-storage configs as a whole (its config `before` an alter, None at
    create; `after` it, merged): ConfigError naming what is wrong."""
    now = tier_settings(after)
    if before is not None and tier_settings(before).enabled and not now.enabled:
        raise ConfigError(
            "remote.storage.enable cannot be turned off once on (its offloaded data would "
            "become unreadable); delete the topic instead"
        )
    if not now.enabled:
        return
    if not tier_configured:
        raise ConfigError(
            "remote.storage.enable=true needs tiered storage on the broker: set tiered.url "
            "(the [tiered] section of tidemq.toml, or --set tiered.url=s3://bucket/prefix)"
        )
    if compact:
        raise ConfigError("remote.storage.enable=true is not supported for compact topics")
    if not _within(now.local_retention_ms, retention_ms):
        raise ConfigError(
            f"local.retention.ms ({now.local_retention_ms}) must not exceed retention.ms "
            f"({retention_ms})"
        )
    if not _within(now.local_retention_bytes, retention_bytes):
        raise ConfigError(
            f"local.retention.bytes ({now.local_retention_bytes}) must not exceed "
            f"retention.bytes ({retention_bytes})"
        )
