"""Messages by key (code 110): the broker's key index, read by `Admin.query_messages`.
Appended to `commands.REQUESTS`; fields only ever added at the end.

The response body holds whole commit-log records back to back, as a FETCH answer does;
`record_sizes`, `queues` and `masks` say, per record, its size, its queue and which of its
messages match (bit i of byte i // 8 for message i). Offsets are logical on a static topic.
"""

from __future__ import annotations

from typing import Final

import msgspec

from tidemq.protocol.codes import RequestCode

__all__ = ["QUERY_REQUESTS", "QueryMessagesRequest", "QueryMessagesResponse"]


class _Msg(msgspec.Struct, kw_only=True, omit_defaults=True):
    pass


class QueryMessagesRequest(_Msg):
    topic: str
    key: bytes
    #: Store times, ms since the epoch, both ends included.
    start_ms: int = 0
    end_ms: int = (1 << 63) - 1
    #: At most this many messages (`limits.MAX_KEY_QUERY_MESSAGES`), newest first.
    limit: int = 32


class QueryMessagesResponse(_Msg):
    record_sizes: list[int] = []
    queues: list[int] = []
    masks: list[bytes] = []
    #: Store time of each record (the order of the answer: newest first).
    store_times_ms: list[int] = []
    #: The search stopped before examining every candidate: older matches may exist.
    more: bool = False


QUERY_REQUESTS: Final[dict[RequestCode, tuple[type[msgspec.Struct], type[msgspec.Struct]]]] = {
    RequestCode.QUERY_MESSAGES: (QueryMessagesRequest, QueryMessagesResponse),
}
