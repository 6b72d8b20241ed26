"""The topic list, page by page: each broker answers at most `limits.MAX_LIST_TOPICS`
topics at a time, by name, so a list of 100,000 topics never needs one huge answer.

Every broker holds only its own topics; a topic spread over several brokers is listed by
each. A list of at most `limit` topics after `after` takes each broker's first `limit`
ones (the overall first `limit` are among them), merged by name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from tidemq.client.cluster import ClusterClient
from tidemq.core import limits
from tidemq.protocol.commands import ListTopicsRequest, ListTopicsResponse, TopicInfoMsg

__all__ = ["list_topics"]


async def list_topics(
    cluster: ClusterClient,
    brokers: Sequence[str],
    *,
    prefix: str = "",
    after: str = "",
    limit: int | None = None,
    keep: Callable[[str], bool] | None = None,
) -> list[TopicInfoMsg]:
    """Topics of these brokers whose names start with `prefix` and come after `after`,
    sorted by name, at most `limit` of them (None: every one); with `keep`, only the
    names it keeps (left out before counting to `limit`)."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if limit == 0:
        return []
    answers = await asyncio.gather(
        *(_from_broker(cluster, b, (prefix, after), limit, keep) for b in brokers)
    )
    seen: dict[str, TopicInfoMsg] = {}
    for topics in answers:
        for topic in topics:
            seen.setdefault(topic.name, topic)
    names = sorted(seen)
    if limit is not None:
        names = names[:limit]
    return [seen[n] for n in names]


async def _from_broker(
    cluster: ClusterClient,
    broker: str,
    start: tuple[str, str],
    limit: int | None,
    keep: Callable[[str], bool] | None,
) -> list[TopicInfoMsg]:
    prefix, cursor = start
    out: list[TopicInfoMsg] = []
    while limit is None or len(out) < limit:
        wanted = limits.MAX_LIST_TOPICS if limit is None else limit - len(out)
        request = ListTopicsRequest(
            prefix=prefix, after=cursor, limit=min(wanted, limits.MAX_LIST_TOPICS)
        )
        page = await cluster.call(broker, request, ListTopicsResponse)
        out.extend(t for t in page.topics if keep is None or keep(t.name))
        if not page.next:
            break
        cursor = page.next
    return out[:limit]
