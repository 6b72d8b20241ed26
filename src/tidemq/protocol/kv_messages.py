"""Compact-topic requests (codes 100-101): a key's latest value, and a compaction run on
demand. Appended to `commands.REQUESTS`; fields only ever added at the end."""

from __future__ import annotations

from typing import Final

import msgspec

from tidemq.protocol.codes import RequestCode

__all__ = [
    "KV_REQUESTS",
    "CompactRequest",
    "CompactResponse",
    "CompactionRun",
    "KvGetRequest",
    "KvGetResponse",
]


class _Msg(msgspec.Struct, kw_only=True, omit_defaults=True):
    pass


class KvGetRequest(_Msg):
    topic: str
    #: The queue the key maps to (the client computes it as a producer does).
    queue: int
    key: bytes


class KvGetResponse(_Msg):
    #: False: no message with this key is readable (never written, or compacted away
    #: after its tombstone). A tombstone is found, with value None.
    found: bool = False
    offset: int = -1
    value: bytes | None = None
    timestamp_ms: int = 0


class CompactRequest(_Msg):
    topic: str
    #: One queue, or -1 for every queue this broker hosts.
    queue: int = -1


class CompactionRun(_Msg):
    queue: int
    messages_in: int
    messages_out: int
    bytes_in: int
    bytes_out: int
    #: Offsets below this are now served from the queue's compacted log.
    compacted_end: int


class CompactResponse(_Msg):
    runs: list[CompactionRun]


KV_REQUESTS: Final[dict[RequestCode, tuple[type[msgspec.Struct], type[msgspec.Struct]]]] = {
    RequestCode.KV_GET: (KvGetRequest, KvGetResponse),
    RequestCode.COMPACT: (CompactRequest, CompactResponse),
}
