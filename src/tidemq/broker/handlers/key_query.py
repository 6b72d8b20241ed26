"""QUERY_MESSAGES: a topic's messages by key, from this broker's key index.

The store finds and checks the matches (`store/key_lookup.py`); this handler checks the
request, and on a static topic rebases each record onto logical offsets, as a fetch of
the link does (a record in no link of this broker is left out).
"""

from __future__ import annotations

from tidemq.broker.static_service import StaticService
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.topics import TopicTable
from tidemq.core import limits
from tidemq.core.errors import InvalidRequest, QueueMoved
from tidemq.core.record import parse_header, rebase_record
from tidemq.protocol.query_messages import QueryMessagesRequest, QueryMessagesResponse
from tidemq.store.key_index import KEY_INDEX_CONFIG
from tidemq.store.key_lookup import KeyMatches, MatchedRecord
from tidemq.store.message_store import MessageStore

__all__ = ["KeyQueryHandler", "check_query"]

#: A key longer than this cannot have been indexed usefully; refused before any work.
MAX_QUERY_KEY_BYTES = 64 << 10


def check_query(req: QueryMessagesRequest) -> None:
    """InvalidRequest naming the argument that is wrong."""
    if not req.key:
        raise InvalidRequest("key must not be empty")
    if len(req.key) > MAX_QUERY_KEY_BYTES:
        raise InvalidRequest(f"key is {len(req.key)} bytes, at most {MAX_QUERY_KEY_BYTES}")
    if not 1 <= req.limit <= limits.MAX_KEY_QUERY_MESSAGES:
        raise InvalidRequest(
            f"limit must be in 1..{limits.MAX_KEY_QUERY_MESSAGES}, got {req.limit}"
        )
    if req.start_ms > req.end_ms:
        raise InvalidRequest(f"start ({req.start_ms} ms) is after end ({req.end_ms} ms)")


class KeyQueryHandler:
    def __init__(self, gateway: StoreGateway, topics: TopicTable, static: StaticService) -> None:
        self._gateway = gateway
        self._topics = topics
        self._static = static

    async def query(self, req: QueryMessagesRequest) -> tuple[QueryMessagesResponse, bytes]:
        check_query(req)
        self._topics.get(req.topic)  # TopicNotFound

        def run(store: MessageStore) -> KeyMatches:
            if not store.key_indexed(req.topic):
                raise InvalidRequest(
                    f"topic {req.topic!r} has {KEY_INDEX_CONFIG}=false (or is a system "
                    "topic): its messages are not indexed by key; find them by offset "
                    "or time"
                )
            return store.find_by_key(
                req.topic, req.key, start_ms=req.start_ms, end_ms=req.end_ms, limit=req.limit
            )

        found = await self._gateway.call(run)
        static = self._topics.is_static(req.topic)
        response = QueryMessagesResponse(more=found.more)
        records: list[bytes] = []
        for matched in found.records:
            record = self._logical(req.topic, matched) if static else matched.record
            if record is None:
                continue
            records.append(record)
            response.record_sizes.append(len(record))
            response.queues.append(matched.queue)
            response.masks.append(_mask(matched.indexes, parse_header(record).count))
            response.store_times_ms.append(matched.store_time_ms)
        return response, b"".join(records)

    def _logical(self, topic: str, matched: MatchedRecord) -> bytes | None:
        """The record under its logical offsets (None: in no link of this broker now)."""
        try:
            view = self._static.view(topic, matched.queue)
            if view is None:
                return matched.record
            return rebase_record(
                matched.record, view.logical(parse_header(matched.record).base_offset)
            )
        except (InvalidRequest, QueueMoved):
            return None


def _mask(indexes: list[int], count: int) -> bytes:
    """Bit i of byte i // 8 set for message i (a filtered fetch's mask)."""
    out = bytearray((count + 7) >> 3)
    for i in indexes:
        out[i >> 3] |= 1 << (i & 7)
    return bytes(out)
