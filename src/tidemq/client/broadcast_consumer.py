"""Broadcasting (asyncio): every member of a group gets every message of its topics.

    consumer = BroadcastConsumer(bootstrap, "cache-invalidation", ["prices"], member="host-7")
    for msg in await consumer.poll():
        apply(msg)
    await consumer.commit()

Each member reads every queue of its topics (new queues are picked up as they appear) and
keeps its own progress on the broker: its offsets are committed as the consumer-group
offsets of `broadcast_group(group, member)`, so a member that restarts with the same
`member` name continues where it left, and members never move each other's progress.
That progress group has its own coordinator (ADR 17), so members' progress spreads over
the brokers.
`Admin.describe_group(broadcast_group(group, member))` shows one member's lag.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from typing import Generic, Self

from tidemq.client import checks
from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.client.stream_consumer import AsyncStreamConsumer, D, TopicQueue
from tidemq.core.filters import Sql92
from tidemq.core.message import Message
from tidemq.core.names import MEMBER_PATTERN
from tidemq.protocol.commands import (
    CommitOffsetsRequest,
    CommitOffsetsResponse,
    FetchOffsetsRequest,
    FetchOffsetsResponse,
    QueueOffset,
)

__all__ = ["AsyncBroadcastConsumer", "broadcast_group"]

_MEMBER = re.compile(MEMBER_PATTERN)
#: How often the queues of the topics are looked up again (new queues, new topics).
_REFRESH_S = 5.0


def broadcast_group(group: str, member: str) -> str:
    """The group name under which one broadcasting member's progress is stored."""
    return f"{group}%BROADCAST%{member}"


class AsyncBroadcastConsumer(Generic[D]):
    def __init__(
        self,
        bootstrap: str,
        group: str,
        topics: Iterable[str],
        *,
        member: str,
        start: str = "latest",
        auto_commit: bool = True,
        filter: str | Sql92 | None = None,
        client_config: ClientConfig | None = None,
        value_deserializer: Callable[[bytes], D] | None = None,
    ) -> None:
        """`group` and `topics` (a list, even of one) follow the name rule of
        `tidemq.core.names`. `member`: this member's stable name (1-100 of A-Z a-z 0-9
        _ . : -); its progress is kept under it. `start`: where a queue this member never
        committed begins ("earliest" or "latest"). `value_deserializer`: as for
        `AsyncStreamConsumer`."""
        group = checks.check_group_name(group)
        if not isinstance(member, str):
            raise TypeError(f"member must be a str, got {type(member).__name__}")
        if not _MEMBER.fullmatch(member):
            raise ValueError(f"member must be 1-100 of A-Z a-z 0-9 _ . : -, got {member!r}")
        if not isinstance(start, str) or start not in ("earliest", "latest"):
            raise ValueError(f"start must be 'earliest' or 'latest', got {start!r}")
        self._topics = sorted(checks.check_names(topics, "topics"))
        if not isinstance(auto_commit, bool):
            raise TypeError(f"auto_commit must be a bool, got {auto_commit!r}")
        self.group = group
        self.member = member
        self._progress_group = broadcast_group(group, member)
        self._auto_commit = auto_commit
        self._cluster = ClusterClient(bootstrap, client_config)
        self._stream: AsyncStreamConsumer[D] = AsyncStreamConsumer(
            bootstrap,
            start=start,
            filter=filter,
            cluster=self._cluster,
            value_deserializer=value_deserializer,
        )
        self._assigned: set[TopicQueue] = set()
        self._consumed: dict[TopicQueue, int] = {}
        self._refreshed = 0.0
        self._closed = False

    async def _refresh(self) -> None:
        """Assign every queue of the topics; new ones start at this member's committed
        offset, or where `start` says."""
        if time.monotonic() - self._refreshed < _REFRESH_S and self._assigned:
            return
        self._refreshed = time.monotonic()
        routes = await self._cluster.refresh_routes(force=True)
        wanted = {(t, q) for t in self._topics if t in routes for q in routes.queues(t)}
        new = wanted - self._assigned
        if not new:
            return
        committed = await self._cluster.group_call(
            self._progress_group,
            FetchOffsetsRequest(group=self._progress_group),
            FetchOffsetsResponse,
        )
        positions = {(o.topic, o.queue): o.offset for o in committed.offsets}
        self._assigned |= new
        self._stream.assign(sorted(self._assigned))
        for tq in new:
            if tq in positions:
                self._stream.seek(tq[0], tq[1], positions[tq])

    async def poll(self, timeout_ms: int = 1000) -> list[Message[D | None]]:
        """Messages of any queue; with `auto_commit`, the previous poll's are committed
        first (at-least-once: a crash redelivers at most one poll's worth)."""
        timeout_ms = checks.check_timeout_ms(timeout_ms)
        if self._closed:
            raise RuntimeError("the consumer is closed")
        if self._auto_commit and self._consumed:
            await self.commit()
        await self._refresh()
        messages = await self._stream.poll(timeout_ms)
        for m in messages:
            tq = (m.topic, m.queue)
            self._consumed[tq] = max(self._consumed.get(tq, 0), m.offset + 1)
        return messages

    async def commit(self) -> None:
        """Store this member's progress (the offsets after the messages polled so far)."""
        if not self._consumed:
            return
        request = CommitOffsetsRequest(
            group=self._progress_group,
            offsets=[
                QueueOffset(topic=t, queue=q, offset=o)
                for (t, q), o in sorted(self._consumed.items())
            ],
        )
        await self._cluster.group_call(self._progress_group, request, CommitOffsetsResponse)
        self._consumed.clear()

    async def close(self) -> None:
        if self._closed:
            return
        try:
            if self._auto_commit:
                await self.commit()
        finally:
            self._closed = True
            await self._stream.close()
            await self._cluster.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
