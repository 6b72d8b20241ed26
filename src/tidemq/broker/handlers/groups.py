"""Consumer-group requests: membership (GroupCoordinator, on the loop) and offsets (store).

Commits are fenced by generation: a member that has not yet taken its assignment for the
current generation cannot commit, so a consumer that lost a queue in a rebalance can never
overwrite the offsets of its new owner. A member of the current generation commits only
the queues that generation assigns it.

Each group has its own coordinator (rendezvous hashing, ADR 17). Before a request that
reads or writes a group's offsets is served, `OffsetPull.ensure` makes sure the offsets
are here: a group that has just moved to this broker takes them from the other brokers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from tidemq.broker.groups import GroupCoordinator, check_group_name
from tidemq.broker.offset_book import OffsetBook
from tidemq.broker.offset_pull import OffsetPull
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.topics import TopicTable
from tidemq.core.errors import InvalidRequest, OffsetOutOfRange, QueueNotFound, TopicNotFound
from tidemq.core.offsets import check_reset_target, reset_target
from tidemq.protocol.commands import (
    CommitOffsetsRequest,
    CommitOffsetsResponse,
    DescribeGroupRequest,
    DescribeGroupResponse,
    Empty,
    FetchOffsetsRequest,
    FetchOffsetsResponse,
    GroupMember,
    GroupOffset,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    ListGroupsRequest,
    ListGroupsResponse,
    QueueOffset,
    ResetOffsetsRequest,
    ResetOffsetsResponse,
)
from tidemq.store.message_store import MessageStore

__all__ = ["GroupHandlers"]

#: Offsets in one commit (a member owns at most this many queues at once).
_COMMIT_OFFSETS_MAX = 65_536
_check_group = check_group_name


#: Asks the cluster (the name server's routes) for the queue counts of topics this
#: broker does not host; topics nobody serves are left out of the answer.
RemoteCounts = Callable[[list[str]], Awaitable[dict[str, int]]]


class GroupHandlers:
    def __init__(
        self,
        coordinator: GroupCoordinator,
        gateway: StoreGateway,
        book: OffsetBook,
        topics: TopicTable,
        *,
        remote_counts: RemoteCounts | None = None,
        pop_groups: Callable[[], Iterable[str]] | None = None,
        offset_pull: OffsetPull | None = None,
    ) -> None:
        """`pop_groups`: the groups consuming by pop here (simple and push consumers),
        listed with the others. `offset_pull`: takes a group's offsets from the other
        brokers when it moves here (None: a broker alone, nothing to pull)."""
        self._offset_pull = offset_pull
        self._coordinator = coordinator
        self._gateway = gateway
        self._book = book
        self._topics = topics
        self._remote_counts = remote_counts
        self._pop_groups = pop_groups

    async def _known_counts(self, topics: list[str]) -> dict[str, int]:
        """Queue counts of the topics that exist: hosted here, or anywhere in the cluster
        (the coordinator need not host a queue of every topic its groups read)."""
        counts: dict[str, int] = {}
        missing = []
        for name in topics:
            if self._topic_exists(name):
                counts[name] = self._topics.get(name).queues
            else:
                missing.append(name)
        if missing and self._remote_counts is not None:
            remote = await self._remote_counts(missing)
            counts.update({t: n for t, n in remote.items() if t in missing})
        return counts

    async def _queue_counts(self, topics: list[str]) -> dict[str, int]:
        counts = await self._known_counts(topics)
        unknown = [t for t in topics if t not in counts]
        if unknown:
            raise TopicNotFound(f"topic {unknown[0][:140]!r} does not exist")
        return counts

    async def _offsets_here(self, group: str) -> None:
        if self._offset_pull is not None:
            await self._offset_pull.ensure(group)

    async def join(self, req: JoinGroupRequest) -> JoinGroupResponse:
        _check_group(req.group)
        # Before the member learns its queues: it positions them at the committed offsets.
        await self._offsets_here(req.group)
        assignment = self._coordinator.join(
            req.group,
            member_id=req.member_id,
            client_id=req.client_id,
            topics=list(req.topics),
            session_timeout_ms=req.session_timeout_ms,
            queue_counts=await self._queue_counts(list(req.topics)),
        )
        return JoinGroupResponse(
            member_id=assignment.member_id,
            generation=assignment.generation,
            assignment=list(assignment.queues),
        )

    async def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResponse:
        _check_group(req.group)
        state = self._coordinator.describe(req.group)
        topics = sorted({t for m in state.members for t in m.topics})
        # A deleted topic counts as 0 queues, so its queues leave the assignment.
        known = await self._known_counts(topics)
        counts = {t: known.get(t, 0) for t in topics}
        assignment = self._coordinator.heartbeat(req.group, req.member_id, req.generation, counts)
        return HeartbeatResponse(
            generation=assignment.generation, assignment=list(assignment.queues)
        )

    def _topic_exists(self, name: str) -> bool:
        try:
            self._topics.get(name)
        except TopicNotFound:
            return False
        return True

    async def leave(self, req: LeaveGroupRequest) -> Empty:
        _check_group(req.group)
        self._coordinator.leave(req.group, req.member_id)
        return Empty()

    async def commit(self, req: CommitOffsetsRequest) -> CommitOffsetsResponse:
        _check_group(req.group)
        if len(req.offsets) > _COMMIT_OFFSETS_MAX:
            raise InvalidRequest(f"at most {_COMMIT_OFFSETS_MAX} offsets per commit")
        for o in req.offsets:
            if o.offset < 0:
                raise OffsetOutOfRange(
                    f"offset {o.offset} for {o.topic[:140]}/{o.queue} is negative; offsets "
                    "start at 0"
                )
        counts = await self._queue_counts(sorted({o.topic for o in req.offsets}))
        for o in req.offsets:
            if not 0 <= o.queue < counts[o.topic]:
                raise QueueNotFound(
                    f"topic {o.topic!r} has queues 0..{counts[o.topic] - 1}, not {o.queue}"
                )
        # First the offsets a moved group had elsewhere: a commit of some queues must not
        # make the group's other queues look never committed (nothing would pull them).
        await self._offsets_here(req.group)
        self._coordinator.check_commit(req.group, req.member_id, req.generation)
        if req.member_id:
            # The generation check alone would let a current member move the offset of a
            # queue another member owns; only the owner's progress may be committed.
            foreign = [
                f"{o.topic}/{o.queue}"
                for o in req.offsets
                if self._coordinator.assignment_owner(req.group, o.topic, o.queue) != req.member_id
            ]
            if foreign:
                raise InvalidRequest(
                    f"queues {', '.join(foreign[:10])} are not assigned to member "
                    f"{req.member_id!r} in generation {req.generation} of group {req.group!r}"
                )
        offsets = {(o.topic, o.queue): o.offset for o in req.offsets}
        # Queues stored here are checked against their end before the commit (the end only
        # grows). Queues of other brokers cannot be
        # checked by this coordinator without a request to each; their owners' fetches
        # report an out-of-range position instead.
        local = [(t, q) for t, q in offsets if q in self._topics.hosted(t)]

        def check(store: MessageStore) -> None:
            for t, q in local:
                end = store.queue_bounds(t, q)[1]
                chain = store.static_chain(t, q) if self._topics.is_static(t) else None
                if chain is not None:
                    # A static queue: offsets are logical; its end is known only where
                    # its write end is (a sealed link here is not the end).
                    last = chain.write_end
                    if last is None or not store.static_writable(t, q):
                        continue
                    end = last.logical_start + end - last.physical_start
                if offsets[(t, q)] > end:
                    raise OffsetOutOfRange(
                        f"offset {offsets[(t, q)]} for {t}/{q} is past the queue's end "
                        f"({end}): commit the next offset to read, at most the end"
                    )

        await self._gateway.call(check)
        await self._book.commit(req.group, offsets)
        return CommitOffsetsResponse()

    async def fetch_offsets(self, req: FetchOffsetsRequest) -> FetchOffsetsResponse:
        _check_group(req.group)
        if not req.local_only:
            await self._offsets_here(req.group)
        held = sorted((await self._book.committed_with_time(req.group)).items())
        return FetchOffsetsResponse(
            offsets=[QueueOffset(topic=t, queue=q, offset=o) for (t, q), (o, _) in held],
            committed_ms=[ms for _, (_, ms) in held],
        )

    async def list_groups(self, req: ListGroupsRequest) -> ListGroupsResponse:
        stored = await self._book.groups()
        popping = self._pop_groups() if self._pop_groups is not None else ()
        return ListGroupsResponse(
            groups=sorted(set(stored) | set(self._coordinator.groups()) | set(popping))
        )

    async def describe(self, req: DescribeGroupRequest) -> DescribeGroupResponse:
        _check_group(req.group)
        await self._offsets_here(req.group)
        state = self._coordinator.describe(req.group)
        members = state.members
        committed = await self._book.committed(req.group)
        topics = {t for t, _ in committed} | {t for m in members for t in m.topics}
        queues = sorted(
            (t, q) for t in topics if self._topic_exists(t) for q in self._topics.hosted(t)
        )

        def bounds(store: MessageStore) -> list[int]:
            return [store.queue_bounds(t, q)[1] for t, q in queues]

        ends = await self._gateway.call(bounds)
        offsets = []
        for (t, q), end in zip(queues, ends, strict=True):
            done = committed.get((t, q), -1)
            offsets.append(
                GroupOffset(
                    topic=t, queue=q, committed=done, max_offset=end, lag=max(0, end - max(done, 0))
                )
            )
        return DescribeGroupResponse(
            group=req.group,
            generation=state.generation,
            members=[
                GroupMember(
                    member_id=m.member_id, client_id=m.client_id, assignment=list(m.assignment)
                )
                for m in members
            ],
            offsets=offsets,
        )

    async def reset(self, req: ResetOffsetsRequest) -> ResetOffsetsResponse:
        _check_group(req.group)
        self._topics.get(req.topic)
        check_reset_target(req.to)
        await self._offsets_here(req.group)  # a shift starts from the committed offsets
        if req.execute:
            state = self._coordinator.describe(req.group)
            if state.members:
                raise InvalidRequest(
                    f"group {req.group!r} has {len(state.members)} active members; "
                    "stop them before resetting offsets"
                )
        hosted = self._topics.hosted(req.topic)
        committed = await self._book.committed(req.group)

        def run(store: MessageStore) -> dict[tuple[str, int], int]:
            new: dict[tuple[str, int], int] = {}
            for q in hosted:
                lo, hi = store.queue_bounds(req.topic, q)
                at = (
                    store.offset_for_time(req.topic, q, req.value)
                    if req.to == "timestamp"
                    else None
                )
                new[(req.topic, q)] = reset_target(
                    req.to, req.value, min_offset=lo, max_offset=hi,
                    committed=committed.get((req.topic, q)), offset_for_time=at,
                )  # fmt: skip
            return new

        new = await self._gateway.call(run)
        if req.execute:
            await self._book.commit(req.group, new)
        return ResetOffsetsResponse(
            offsets=[QueueOffset(topic=t, queue=q, offset=o) for (t, q), o in sorted(new.items())]
        )
