"""Finding one message: by its id, by (topic, queue, offset), or by time.

A message id names (topic hash, queue, offset) (`core.message.message_id`): the topic is
found among the cluster's topics by its hash, then the message is read at its offset like
any consumer reads it (static topics included: their offsets are logical). Ids of delayed
and transactional messages name their origin instead, the broker's timer or half topic
(and keep it once delivered): every live broker is asked (ORIGIN_MESSAGE), and the one
that stored it answers with the message as sent, where it goes, and where it was
delivered when known (`offset` -1 otherwise).
"""

from __future__ import annotations

import asyncio

from tidemq.client.cluster import ClusterClient
from tidemq.client.stream_consumer import AsyncStreamConsumer
from tidemq.core.batch import columns_to_records, decode_columns
from tidemq.core.errors import InvalidRequest, OffsetOutOfRange, UnknownMessage
from tidemq.core.message import Message, parse_message_id, topic_hash
from tidemq.core.record import parse_header
from tidemq.protocol.query_messages import OriginMessageRequest, OriginMessageResponse

__all__ = ["MAX_BROWSE", "message_at", "message_at_time", "message_by_id", "messages_from"]

#: Polls (each a long poll of `_POLL_MS`) before a stored message counts as not found.
_POLLS = 5
_POLL_MS = 1_000


#: Most messages one browse returns (`messages_from`).
MAX_BROWSE = 1_000


async def message_at(cluster: ClusterClient, topic: str, queue: int, offset: int) -> Message | None:
    """The message at `offset` of the queue; None if that offset holds none now (not
    written yet, removed by retention or by compaction)."""
    got = await messages_from(cluster, topic, queue, offset, 1)
    return got[0] if got and got[0].offset == offset else None


async def messages_from(
    cluster: ClusterClient, topic: str, queue: int, offset: int, limit: int
) -> list[Message]:
    """Up to `limit` messages of the queue from `offset` on (fewer at its end; a compact
    topic's holes are stepped over). An offset below the queue's start reads from the
    start; one at or past its end reads nothing."""
    if offset < 0:
        raise InvalidRequest(f"offset must be >= 0, got {offset}")
    if not 1 <= limit <= MAX_BROWSE:
        raise InvalidRequest(f"limit must be 1..{MAX_BROWSE}, got {limit}")
    bounds = await cluster.list_offsets(topic, queue)
    offset = max(offset, bounds.min_offset)
    end = min(bounds.max_offset, offset + limit)
    if offset >= end:
        return []
    consumer = AsyncStreamConsumer(cluster.bootstrap, start="none", cluster=cluster)
    out: list[Message] = []
    try:
        consumer.assign([(topic, queue)])
        consumer.seek(topic, queue, offset)
        empty_polls = 0
        while len(out) < limit and empty_polls < _POLLS:
            try:
                got = await consumer.poll(_POLL_MS)
            except OffsetOutOfRange:  # removed by retention meanwhile
                break
            empty_polls = 0 if got else empty_polls + 1
            out.extend(m for m in got if m.offset < end)
            if (consumer.position(topic, queue) or 0) >= end:
                break
        return out[:limit]
    finally:
        await consumer.close()


async def message_at_time(
    cluster: ClusterClient, topic: str, queue: int, timestamp_ms: int
) -> Message | None:
    """The queue's first message whose timestamp is at or after `timestamp_ms`."""
    found = (await cluster.list_offsets(topic, queue, timestamp_ms)).offset_for_time
    return None if found is None else await message_at(cluster, topic, queue, found)


async def message_by_id(cluster: ClusterClient, message_id: str) -> Message | None:
    """The message with this id; None if it is no longer stored. UnknownMessage when no
    topic of the cluster has the id's topic hash."""
    try:
        wanted, queue, offset = parse_message_id(message_id)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    routes = await cluster.refresh_routes(force=True)
    topics = [t for t in routes.topics() if topic_hash(t) == wanted]
    if not topics:
        found = await _by_origin(cluster, sorted(set(routes.brokers.values())), message_id)
        if found is None:
            raise UnknownMessage(
                f"no topic of this cluster has the id {message_id}'s topic hash, and no "
                "live broker stored it as a delayed or transactional message (or no longer "
                "keeps it)"
            )
        return found
    for topic in topics:  # a hash names one topic but for a collision
        if queue < routes.queue_count(topic):
            found = await message_at(cluster, topic, queue, offset)
            if found is not None:
                return found
    return None


async def _by_origin(cluster: ClusterClient, brokers: list[str], message_id: str) -> Message | None:
    """The delayed or transactional message with this id, from the broker that stored it
    (None: no live broker has it)."""
    request = OriginMessageRequest(message_id=message_id)
    answers = await asyncio.gather(
        *(cluster.request(b, request, OriginMessageResponse) for b in brokers)
    )
    offset = parse_message_id(message_id)[2]
    for answer, body in answers:
        if answer.found:
            return _origin_message(answer, body, offset)
    return None


def _origin_message(answer: OriginMessageResponse, record: bytes, offset: int) -> Message:
    header = parse_header(record)
    columns = decode_columns(memoryview(record)[header.payload_start :])
    index = offset - answer.base_offset
    m = columns_to_records(columns)[index]
    delivered = answer.delivered_base + index if answer.delivered_base >= 0 else -1
    return Message(
        answer.topic,
        answer.queue,
        delivered,
        m.value,
        m.key,
        m.tag,
        m.keys,
        dict(m.headers),
        m.timestamp_ms,
        (answer.origin, 0, offset),
        answer.deliver_at_ms,
    )
