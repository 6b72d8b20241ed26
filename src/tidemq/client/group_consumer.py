"""Consumer groups: the coordinator broker assigns queues to members; members commit.

Each group has its own coordinator: the broker that rendezvous hashing of the group's name
over the live brokers picks (ADR 17). Every request about the group goes there, looked
up again at each retry, so when the name servers drop a broker its groups' members follow
their groups to their next coordinators (which take the committed offsets over from the
other brokers, and assign anew: members rejoin).

Membership is server-side and generation-fenced. A background heartbeat keeps the member
alive and learns of rebalances; on a new generation the consumer drops revoked queues (its
uncommitted progress there is redelivered to the new owner: at-least-once) and starts the
new ones at their committed offsets, or where `start` says for a queue the group never
committed. Commits carry the generation; one from a generation that is no longer current
is refused by the broker, so a member that lost a queue can never move its offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from datetime import datetime
from typing import Generic

from tidemq.client import checks
from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.client.stream_consumer import AsyncStreamConsumer, D, TopicQueue
from tidemq.core.errors import StaleGeneration, TidemqError, UnknownMember
from tidemq.core.filters import Sql92
from tidemq.core.message import Message
from tidemq.net.tasks import cancel_and_wait, completes_when_cancelled
from tidemq.protocol.commands import (
    CommitOffsetsRequest,
    CommitOffsetsResponse,
    Empty,
    FetchOffsetsRequest,
    FetchOffsetsResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    QueueOffset,
)

__all__ = ["AsyncGroupConsumer"]

log = logging.getLogger(__name__)

AssignmentCallback = Callable[[list[TopicQueue]], None]


def _check_offsets(offsets: object) -> dict[TopicQueue, int]:
    if not isinstance(offsets, Mapping):
        raise TypeError(
            "offsets must be a dict of (topic, queue) pairs to offsets, got "
            f"{type(offsets).__name__}"
        )
    return {
        checks.check_topic_queue(tq, "offsets"): checks.check_offset(o, f"offsets[{tq!r}]")
        for tq, o in offsets.items()
    }


class AsyncGroupConsumer(Generic[D]):
    def __init__(
        self,
        bootstrap: str,
        group: str,
        topics: Iterable[str],
        *,
        start: str | float | datetime = "latest",
        auto_commit: bool = True,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        client_id: str = "",
        on_assign: AssignmentCallback | None = None,
        on_revoke: AssignmentCallback | None = None,
        max_bytes_per_queue: int = 1 << 20,
        filter: str | Sql92 | None = None,
        client_config: ClientConfig | None = None,
        value_deserializer: Callable[[bytes], D] | None = None,
    ) -> None:
        """`group` and `topics` (a list, even of one) follow the name rule of
        `tidemq.core.names`. `start`: where a queue the group never committed begins:
        "earliest", "latest", or a time (seconds since the epoch, or an aware datetime).
        The same rule applies every time. `filter`: a tag expression or `Sql92(...)`,
        evaluated on the broker (see `AsyncStreamConsumer`). `value_deserializer`: values
        come deserialized; one it cannot turn raises DeserializationFailed and is not
        counted as consumed (seek past it, as with `AsyncStreamConsumer`)."""
        self._start: str | int
        if isinstance(start, str):
            if start not in ("earliest", "latest"):
                raise ValueError(
                    f"start must be 'earliest', 'latest' or a time in seconds, got {start!r}"
                )
            self._start = start
        else:
            self._start = checks.timestamp_ms(start, "start")
        self._group = checks.check_group_name(group)
        self._topics = sorted(checks.check_names(topics, "topics"))
        if not isinstance(auto_commit, bool):
            raise TypeError(f"auto_commit must be a bool, got {auto_commit!r}")
        self._auto_commit = auto_commit
        self._session_ms = checks.check_timeout_ms(session_timeout_ms, "session_timeout_ms")
        self._heartbeat_s = (
            checks.check_timeout_ms(heartbeat_interval_ms, "heartbeat_interval_ms") / 1000
        )
        if not isinstance(client_id, str):
            raise TypeError(f"client_id must be a str, got {client_id!r}")
        self._client_id = client_id
        for name, callback in (("on_assign", on_assign), ("on_revoke", on_revoke)):
            if callback is not None and not callable(callback):
                raise TypeError(f"{name} must be a function of a list of queues, got {callback!r}")
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._cluster = ClusterClient(bootstrap, client_config)
        self._stream: AsyncStreamConsumer[D] = AsyncStreamConsumer(
            bootstrap,
            start="earliest",
            max_bytes_per_queue=max_bytes_per_queue,
            filter=filter,
            cluster=self._cluster,
            value_deserializer=value_deserializer,
        )
        self._member_id = ""
        self._generation = -1
        self._assignment: list[TopicQueue] = []
        self._pending_assignment: tuple[int, list[TopicQueue]] | None = None
        self._consumed: dict[TopicQueue, int] = {}  # next offsets of messages handed out
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def member_id(self) -> str:
        return self._member_id

    @property
    def generation(self) -> int:
        return self._generation

    def assignment(self) -> list[TopicQueue]:
        return list(self._assignment)

    # ------------------------------------------------------------------ membership

    async def _join(self) -> None:
        request = JoinGroupRequest(
            group=self._group,
            topics=self._topics,
            member_id=self._member_id,
            client_id=self._client_id,
            session_timeout_ms=self._session_ms,
        )
        try:
            response = await self._cluster.group_call(self._group, request, JoinGroupResponse)
        except UnknownMember:
            # Our session expired: join as a new member (the old id is never reissued).
            self._member_id = ""
            request = JoinGroupRequest(
                group=self._group,
                topics=self._topics,
                client_id=self._client_id,
                session_timeout_ms=self._session_ms,
            )
            response = await self._cluster.group_call(self._group, request, JoinGroupResponse)
        self._member_id = response.member_id
        await self._apply_assignment(response.generation, [tuple(a) for a in response.assignment])  # type: ignore[misc]
        if self._heartbeat_task is None:
            self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeats())

    async def _heartbeats(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._heartbeat_s)
            try:
                request = HeartbeatRequest(
                    group=self._group, member_id=self._member_id, generation=self._generation
                )
                response = await self._cluster.group_call(self._group, request, HeartbeatResponse)
            except UnknownMember:
                self._pending_assignment = (-1, [])  # expired: rejoin at the next poll
                continue
            except TidemqError as exc:
                log.warning("group %s heartbeat failed: %s", self._group, exc)
                continue
            if response.generation != self._generation:
                queues = [(t, q) for t, q in response.assignment]
                self._pending_assignment = (response.generation, queues)

    async def _apply_assignment(self, generation: int, queues: list[TopicQueue]) -> None:
        revoked = [tq for tq in self._assignment if tq not in queues]
        added = [tq for tq in queues if tq not in self._assignment]
        if revoked:
            for tq in revoked:
                self._consumed.pop(tq, None)
            if self._on_revoke:
                self._on_revoke(revoked)
        self._generation = generation
        self._assignment = sorted(queues)
        self._stream.assign(self._assignment)
        if added:
            await self._position_new(added)
            if self._on_assign:
                self._on_assign(added)

    async def _position_new(self, queues: list[TopicQueue]) -> None:
        committed = await self._cluster.group_call(
            self._group, FetchOffsetsRequest(group=self._group), FetchOffsetsResponse
        )
        offsets = {(o.topic, o.queue): o.offset for o in committed.offsets}
        for tq in queues:
            if tq in offsets:
                # Not a user's seek: out of range, it resets like any position of ours.
                self._stream._set_position(tq, offsets[tq])
            elif self._start == "earliest":
                await self._stream.seek_to_beginning(*tq)
            elif self._start == "latest":
                await self._stream.seek_to_end(*tq)
            else:
                assert isinstance(self._start, int)
                await self._stream._seek_to_time_ms(self._start, tq)

    async def _sync(self) -> None:
        if self._generation < 0:
            await self._join()
        pending, self._pending_assignment = self._pending_assignment, None
        if pending is not None:
            generation, queues = pending
            if generation < 0:
                self._generation = -1
                await self._join()
            else:
                await self._apply_assignment(generation, queues)

    # ------------------------------------------------------------------ consuming

    async def poll(self, timeout_ms: int = 1000) -> list[Message[D | None]]:
        """Messages of the queues assigned to this member, waiting up to `timeout_ms`."""
        timeout_ms = checks.check_timeout_ms(timeout_ms)
        if self._closed:
            raise RuntimeError("the consumer is closed")
        if self._auto_commit and self._consumed:
            await self._commit_quietly()
        await self._sync()
        messages = await self._stream.poll(timeout_ms)
        owned = set(self._assignment)
        messages = [m for m in messages if (m.topic, m.queue) in owned]
        for m in messages:
            self._consumed[(m.topic, m.queue)] = m.offset + 1
        return messages

    async def commit(self, offsets: dict[TopicQueue, int] | None = None) -> None:
        """Commit the next offsets to read (default: after every message polled so far):
        `offsets` maps (topic, queue) pairs to offsets. Raises StaleGeneration if the group
        rebalanced (poll again to take the new assignment), OffsetOutOfRange for an offset
        past its queue's end."""
        chosen = dict(self._consumed if offsets is None else _check_offsets(offsets))
        owned = set(self._assignment)
        chosen = {tq: o for tq, o in chosen.items() if tq in owned}
        if not chosen:
            return
        request = CommitOffsetsRequest(
            group=self._group,
            offsets=[
                QueueOffset(topic=t, queue=q, offset=o) for (t, q), o in sorted(chosen.items())
            ],
            member_id=self._member_id,
            generation=self._generation,
        )
        await self._cluster.group_call(self._group, request, CommitOffsetsResponse)
        if offsets is None:
            for tq, o in chosen.items():
                if self._consumed.get(tq) == o:
                    del self._consumed[tq]

    async def _commit_quietly(self) -> None:
        try:
            await self.commit()
        except (StaleGeneration, UnknownMember) as exc:
            log.info("group %s: commit refused (%s); taking the new assignment", self._group, exc)

    async def __aiter__(self) -> AsyncIterator[Message[D | None]]:
        while not self._closed:
            for message in await self.poll():
                yield message

    @completes_when_cancelled
    async def close(self) -> None:
        if self._closed:
            return
        if self._auto_commit and self._consumed and self._generation >= 0:
            await self._commit_quietly()
        self._closed = True
        if self._heartbeat_task is not None:
            await cancel_and_wait(self._heartbeat_task)
        if self._member_id:
            with contextlib.suppress(TidemqError):
                await self._cluster.group_call(
                    self._group,
                    LeaveGroupRequest(group=self._group, member_id=self._member_id),
                    Empty,
                )
        await self._stream.close()
        await self._cluster.close()
