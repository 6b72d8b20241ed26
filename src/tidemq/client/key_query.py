"""Messages by key: ask every broker holding the topic's data, merge, newest first.

Each broker answers from its own key index (QUERY_MESSAGES), with matches it has read
and checked itself; a static topic's brokers include those of its older links, and
answer with logical offsets. The answers are merged by store time, newest first, and cut
to the limit.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from tidemq.client import checks
from tidemq.client.cluster import ClusterClient
from tidemq.core import limits
from tidemq.core.errors import InvalidRequest
from tidemq.core.message import Message, iter_records, messages_from_records
from tidemq.protocol.query_messages import QueryMessagesRequest, QueryMessagesResponse

__all__ = ["DEFAULT_QUERY_LIMIT", "query_messages", "query_request"]

#: Messages a query returns unless told otherwise (RocketMQ's queryMessage default: 32).
DEFAULT_QUERY_LIMIT = 32
_END_MS = (1 << 63) - 1

When = float | datetime | None


def _ms(when: When, name: str) -> int | None:
    if when is None:
        return None
    if isinstance(when, datetime):
        if when.tzinfo is None:
            raise InvalidRequest(f"{name} needs a time zone (datetime(..., tzinfo=UTC))")
        return int(when.timestamp() * 1000)
    if isinstance(when, bool) or not isinstance(when, (int, float)):
        raise InvalidRequest(
            f"{name} must be seconds since the epoch or an aware datetime, got "
            f"{type(when).__name__}"
        )
    return int(when * 1000)


def query_request(
    topic: str, key: str | bytes, *, start: When, end: When, limit: int
) -> QueryMessagesRequest:
    """The request, every argument checked (InvalidRequest naming the wrong one)."""
    try:
        checks.check_readable_topic(topic, "topic")
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(str(exc)) from None
    if isinstance(key, str):
        raw = key.encode()
    elif isinstance(key, bytes):
        raw = key
    else:
        raise InvalidRequest(f"key must be str or bytes, got {type(key).__name__}")
    if not raw:
        raise InvalidRequest("key must not be empty")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidRequest(f"limit must be an int, got {type(limit).__name__}")
    if not 1 <= limit <= limits.MAX_KEY_QUERY_MESSAGES:
        raise InvalidRequest(f"limit must be in 1..{limits.MAX_KEY_QUERY_MESSAGES}, got {limit}")
    start_ms, end_ms = _ms(start, "start"), _ms(end, "end")
    start_ms = 0 if start_ms is None else max(start_ms, 0)
    end_ms = _END_MS if end_ms is None else end_ms
    if start_ms > end_ms:
        raise InvalidRequest(f"start ({start}) is after end ({end})")
    return QueryMessagesRequest(topic=topic, key=raw, start_ms=start_ms, end_ms=end_ms, limit=limit)


async def query_messages(cluster: ClusterClient, request: QueryMessagesRequest) -> list[Message]:
    """Up to `request.limit` messages of the topic carrying the key, newest first."""
    topic = request.topic
    routes = await cluster.topic_routes(topic)
    # The brokers serving its queues and, for a static topic, those of every link of its
    # chains still in the routes (older offsets stay where they were written).
    holders = {a for q in routes.queues(topic) if (a := routes.broker_for(topic, q)) is not None}
    for q in routes.queues(topic):
        chain = routes.chain(topic, q)
        for link in chain.links if chain is not None else ():
            address = routes.brokers.get(link.broker)
            if address is not None:
                holders.add(address)
    answers = await asyncio.gather(
        *(cluster.request(a, request, QueryMessagesResponse) for a in sorted(holders))
    )
    found: list[tuple[int, Message]] = []
    for header, body in answers:
        records = iter_records(body, header.record_sizes)
        for record, queue, mask, stored in zip(
            records, header.queues, header.masks, header.store_times_ms, strict=True
        ):
            for message in messages_from_records(
                request.topic, queue, bytes(record), [len(record)], 0, masks=[mask]
            ):
                found.append((stored, message))
    found.sort(key=lambda m: (m[0], m[1].offset), reverse=True)
    return [m for _, m in found[: request.limit]]
