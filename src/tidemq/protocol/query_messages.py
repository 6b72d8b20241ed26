"""Messages by key (code 110): the broker's key index, read by `Admin.query_messages`;
and a delayed or transactional message by its id (code 111), which names where the broker
first stored it (its timer or half topic), read by `Admin.get_message`. Appended to
`commands.REQUESTS`; fields only ever added at the end.

The response body holds whole commit-log records back to back, as a FETCH answer does;
`record_sizes`, `queues` and `masks` say, per record, its size, its queue and which of its
messages match (bit i of byte i // 8 for message i). Offsets are logical on a static topic.
"""

from __future__ import annotations

from typing import Final

import msgspec

from tidemq.protocol.codes import RequestCode

__all__ = [
    "QUERY_REQUESTS",
    "OriginMessageRequest",
    "OriginMessageResponse",
    "QueryMessagesRequest",
    "QueryMessagesResponse",
]


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


class OriginMessageRequest(_Msg):
    #: A delayed or transactional message's id (as its receipt and its consumers see it).
    message_id: str


class OriginMessageResponse(_Msg):
    """The body holds the record as first stored (in the timer or half topic) when
    `found`; the message is the one at `offset - base_offset` in it."""

    found: bool = False
    #: The id's origin topic (e.g. "%SYS%TIMER@broker-0"), the batch's first offset there.
    origin: str = ""
    base_offset: int = 0
    #: Where it goes (or went): its topic and queue.
    topic: str = ""
    queue: int = 0
    #: "pending" (a delayed message not due yet), "delivered" (or cancelled: a delayed
    #: message no longer scheduled), "open", "committed", "rolled_back", or "unknown" (a
    #: transaction no longer remembered).
    state: str = ""
    deliver_at_ms: int = 0
    #: The first offset of the batch where it was delivered or published (-1: not
    #: delivered, or not found within the search's bounds).
    delivered_base: int = -1


QUERY_REQUESTS: Final[dict[RequestCode, tuple[type[msgspec.Struct], type[msgspec.Struct]]]] = {
    RequestCode.QUERY_MESSAGES: (QueryMessagesRequest, QueryMessagesResponse),
    RequestCode.ORIGIN_MESSAGE: (OriginMessageRequest, OriginMessageResponse),
}
