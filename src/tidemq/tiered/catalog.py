"""The topics a broker offloads, kept in the bucket so that an empty broker can rebuild
them (restore).

One JSON object per topic: `_tidemq/topics/broker=<b>/topic=<t>.json` (`TopicEntry`):
everything the broker's store needs to create the topic again as it was, its creation
time included (the manifests name it: a topic created again under the same name is
another topic). Written by the tier service when it first sees an offloaded topic and
whenever its configs (or, for a static topic, its chains) change; deleted with the
topic's remote data.
"""

from __future__ import annotations

import msgspec

from tidemq.core.errors import CorruptRecordError
from tidemq.core.static_chain import QueueChain

__all__ = ["TopicEntry", "catalog_path", "catalog_prefix", "decode_entry", "encode_entry"]


class TopicEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    name: str
    queues: int
    message_type: str
    cleanup_policy: str
    retention_ms: int | None
    retention_bytes: int | None
    config: dict[str, str]
    created_ms: int
    #: A static topic's chains of the queues this broker holds links of, as it last
    #: stored them (the brokers hold the newest; ADR 0010).
    chains: list[QueueChain] = msgspec.field(default_factory=list)


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(TopicEntry)


def encode_entry(entry: TopicEntry) -> bytes:
    return _ENCODER.encode(entry)


def decode_entry(data: bytes) -> TopicEntry:
    try:
        return _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptRecordError(f"undecodable tier topic entry: {exc}") from None


def catalog_prefix(broker: str) -> str:
    return f"_tidemq/topics/broker={broker}/"


def catalog_path(broker: str, topic: str) -> str:
    return f"{catalog_prefix(broker)}topic={topic}.json"
