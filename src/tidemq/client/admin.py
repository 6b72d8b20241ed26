"""Topic, group and cluster administration.

A topic's queues are spread over the live brokers (queue q on the q-th broker in name
order, round robin); each broker is told which queues it serves. With one broker it
serves them all.

Dead letters: messages a pop or push consumer group gave up on are in `%DLQ%<group>`
(queue 0), with `tidemq.dlq.*` headers naming their origin. `dead_letters` lists them;
`redrive` sends them back to their origin topics and remembers how far it got as the
committed offset of the group `%REDRIVE%<group>` on the dead-letter queue, so the next
redrive starts after the last one (at least once: a redrive interrupted between a send
and its commit sends that message again next time).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

from tidemq.client import acls as acls_api
from tidemq.client import (
    checks,
    key_query,
    kv,
    lookup,
    static_admin,
    static_leave,
    topic_batch,
    topic_pages,
)
from tidemq.client.acls import Acl
from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.client.producer import AsyncProducer
from tidemq.client.results import (
    BrokerInfo,
    BrokerStatus,
    CommittedOffset,
    GroupDescription,
    LeaderHandover,
    NewTopic,
    PopStatus,
    ResumeResult,
    TierFile,
    TierStatus,
    TimerStatus,
    TopicInfo,
    TransactionStatus,
    UserInfo,
    broker_info_from_wire,
    broker_status_from_wire,
    committed_offset_from_wire,
    group_description_from_wire,
    pop_status_from_wire,
    resume_result_from_wire,
    tier_status_from_wire,
    timer_status_from_wire,
    topic_info_from_wire,
    transaction_status_from_wire,
    user_info_from_wire,
)
from tidemq.client.stream_consumer import AsyncStreamConsumer
from tidemq.core import limits
from tidemq.core.errors import (
    BrokerNotAvailable,
    ConfigError,
    InvalidRequest,
    RequestTimeout,
    TidemqError,
    TopicAlreadyExists,
    TopicNotFound,
    UnknownTransaction,
)
from tidemq.core.message import Message
from tidemq.core.offsets import check_reset_target, reset_target
from tidemq.core.scram import DEFAULT_ITERATIONS, ScramError, make_credentials, new_salt
from tidemq.protocol.commands import (
    AlterTopicRequest,
    ClusterStatusRequest,
    ClusterStatusResponse,
    CommitOffsetsRequest,
    CommitOffsetsResponse,
    CreateTopicRequest,
    DeleteTopicRequest,
    DescribeGroupRequest,
    DescribeGroupResponse,
    DescribeTopicRequest,
    Empty,
    EndTxnRequest,
    EndTxnResponse,
    FetchOffsetsRequest,
    FetchOffsetsResponse,
    GroupOffset,
    ListGroupsRequest,
    ListGroupsResponse,
    PopQueueStatus,
    PopResumeRequest,
    PopResumeResponse,
    PopStatusRequest,
    PopStatusResponse,
    QueueOffset,
    ResetOffsetsRequest,
    ResetOffsetsResponse,
    StatusRequest,
    StatusResponse,
    TimerStatusRequest,
    TimerStatusResponse,
    TimerTopicStatus,
    TopicInfoMsg,
    TxnStatusRequest,
    TxnStatusResponse,
    UserDeleteRequest,
    UserListRequest,
    UserListResponse,
    UserUpsertRequest,
)
from tidemq.protocol.replica_messages import ElectLeaderRequest, ElectLeaderResponse
from tidemq.protocol.tier_messages import (
    TierFilesRequest,
    TierFilesResponse,
    TierOffloadRequest,
    TierStatusRequest,
    TierStatusResponse,
)

__all__ = [
    "DLQ_HEADER_PREFIX",
    "REDRIVEN_FROM_HEADER",
    "AsyncAdmin",
    "dlq_topic",
    "redrive_group",
]

log = logging.getLogger(__name__)

#: Headers the broker adds to a dead letter: tidemq.dlq.topic, .queue, .offset,
#: .message_id, .attempts, .error.
DLQ_HEADER_PREFIX = "tidemq.dlq."
#: Header of a redriven message: the id of the dead letter it was sent from.
REDRIVEN_FROM_HEADER = "tidemq.redriven_from"
#: Messages sent per redrive step, between two commits of the redrive position.
_REDRIVE_CHUNK = 256
#: A handover's answer may take its catch-up time plus this.
_ELECT_SLACK_MS = 10_000
#: Between two looks at the name server for a handover's new leader.
_ELECT_POLL_S = 0.05
#: Longest a dead-letter read may go without progress before it gives up.
_READ_STALL_S = 30.0


def dlq_topic(group: str) -> str:
    """The dead-letter topic of a consumer group."""
    return f"%DLQ%{group}"


def redrive_group(group: str) -> str:
    """The group whose committed offset on `dlq_topic(group)` queue 0 is the redrive
    position: dead letters below it were sent back already."""
    return f"%REDRIVE%{group}"


class AsyncAdmin:
    def __init__(
        self, bootstrap: str = "127.0.0.1:9876", *, client_config: ClientConfig | None = None
    ) -> None:
        self._cluster = ClusterClient(bootstrap, client_config)

    async def _brokers(self) -> list[str]:
        routes = await self._cluster.refresh_routes(force=True)
        if not routes.brokers:
            raise BrokerNotAvailable("no live broker is registered with the name server")
        return [routes.brokers[name] for name in sorted(routes.brokers)]

    async def _live_brokers(self) -> list[str]:
        """The live brokers' addresses, sorted by name, without fetching any topic's
        route (cheap with 100,000 topics)."""
        routes = await self._cluster.refresh_topics([])
        if not routes.brokers:
            raise BrokerNotAvailable("no live broker is registered with the name server")
        return [routes.brokers[name] for name in sorted(routes.brokers)]

    async def _hosting(self, name: str) -> dict[str, list[int]]:
        """Broker address -> queues of `name` it serves (its route fetched alone)."""
        routes = await self._cluster.topic_routes(name)
        out: dict[str, list[int]] = {}
        for q in routes.queues(name):
            address = routes.broker_for(name, q)
            if address is not None:
                out.setdefault(address, []).append(q)
        return out

    async def _holders(self, name: str) -> list[str]:
        """Addresses of the live brokers holding data of `name`: those serving its queues
        and, for a static topic, those holding older links of its chains."""
        out = set(await self._hosting(name))
        routes = self._cluster.routes
        for q in routes.queues(name):
            chain = routes.chain(name, q)
            for link in chain.links if chain is not None else ():
                address = routes.brokers.get(link.broker)
                if address is not None:
                    out.add(address)
        return sorted(out)

    async def create_topic(
        self,
        name: str,
        queues: int = 8,
        *,
        message_type: str = "MIXED",
        config: Mapping[str, str] | None = None,
        exist_ok: bool = False,
        static: bool = False,
        brokers: list[str] | None = None,
    ) -> TopicInfo:
        """Create topic `name` with `queues` queues spread over the live brokers.

        `exist_ok=True` (Kafka's `--if-not-exists`): when the topic exists already, return
        its info instead of raising `TopicAlreadyExists`. It is returned as it is, even if
        its queue count, message type or configs differ from the ones asked for; compare
        them if that matters.

        `static=True`: a static topic (docs/guide/static-topics.md), whose queue count never
        changes and whose queues move between brokers with `remap_topic`, without moving
        data; its queues start round robin over `brokers` (names; default: every live
        broker)."""
        checks.check_topic_name(name, "name")  # the broker checks it too; fail at the call
        if isinstance(queues, bool) or not isinstance(queues, int):
            raise TypeError(f"queues must be an int, got {type(queues).__name__}")
        if not 1 <= queues <= limits.MAX_QUEUES_PER_TOPIC:
            # The brokers check this too, but with no queue to place none would be asked.
            raise ConfigError(f"queues must be 1..{limits.MAX_QUEUES_PER_TOPIC}, got {queues}")
        if brokers is not None and not static:
            raise ConfigError("brokers= chooses where a static topic starts; pass static=True")
        if static:
            if exist_ok:
                with contextlib.suppress(TopicNotFound):
                    return await self.describe_topic(name)
            await static_admin.create_static(
                self._cluster,
                name,
                queues,
                message_type=message_type,
                config=dict(config or {}),
                brokers=brokers,
            )
            return await self.describe_topic(name)
        return await self._create_topic(
            name, queues, message_type=message_type, config=config, exist_ok=exist_ok
        )

    async def create_topics(
        self, topics: Iterable[NewTopic], *, exist_ok: bool = False
    ) -> list[TopicInfo]:
        """Create many topics at once (`NewTopic` items): one request per broker per
        `limits.MAX_TOPICS_PER_CREATE` topics, each broker creating them in one metadata
        transaction. Returns the topics created; with `exist_ok`, existing ones are
        skipped. A topic refused does not stop the others: the refusals are raised
        together at the end (the error of the first, naming them all). See
        `tidemq.client.topic_batch`."""
        return await topic_batch.create_topics(
            self._cluster, await self._live_brokers(), topics, exist_ok=exist_ok
        )

    async def remap_topic(
        self,
        name: str,
        *,
        brokers: list[str] | None = None,
        queue: int | None = None,
        to: str | None = None,
        repair: bool = False,
    ) -> static_admin.RemapReport:
        """Move the write ends of static topic `name`'s queues without moving data:
        spread over `brokers` (names; as few queues move as possible), or `queue` to broker
        `to`. Each moved queue's old link is sealed (read-only, still read from) and a new
        one opens on the target where it ended; producers pause briefly and retry by
        themselves. `repair=True` finishes switches a failed remap left half-way."""
        checks.check_topic_name(name, "name")
        if repair:
            if brokers is not None or queue is not None:
                raise ConfigError("repair takes no brokers or queue: it finishes what was begun")
            return await static_admin.repair(self._cluster, name)
        return await static_admin.remap(self._cluster, name, brokers=brokers, queue=queue, to=to)

    async def get_message(self, message_id: str) -> Message | None:
        """The message with this id (None: no longer stored). See `tidemq.client.lookup`."""
        return await lookup.message_by_id(self._cluster, message_id)

    async def message_at(
        self, topic: str, queue: int, *, offset: int | None = None, at: float | None = None
    ) -> Message | None:
        """The message at `offset` of the queue, or (`at`, seconds since the epoch) its
        first message stored with a timestamp at or after it; None when there is none."""
        checks.check_topic_name(topic, "topic")
        if (offset is None) == (at is None):
            raise ConfigError("give offset= or at=, one of them")
        if at is not None:
            return await lookup.message_at_time(self._cluster, topic, queue, int(at * 1000))
        assert offset is not None
        return await lookup.message_at(self._cluster, topic, queue, offset)

    async def messages(
        self,
        topic: str,
        queue: int,
        *,
        offset: int | None = None,
        at: float | None = None,
        limit: int = 20,
    ) -> list[Message]:
        """Browse a queue: up to `limit` (1..`lookup.MAX_BROWSE`) messages from `offset`,
        or from the first one stored at or after `at` (seconds since the epoch)."""
        checks.check_topic_name(topic, "topic")
        if (offset is None) == (at is None):
            raise ConfigError("give offset= or at=, one of them")
        if at is not None:
            at_ms = int(at * 1000)
            found = (await self._cluster.list_offsets(topic, queue, at_ms)).offset_for_time
            if found is None:
                return []
            offset = found
        assert offset is not None
        return await lookup.messages_from(self._cluster, topic, queue, offset, limit)

    async def query_messages(
        self,
        topic: str,
        key: str | bytes,
        *,
        start: float | datetime | None = None,
        end: float | datetime | None = None,
        limit: int = key_query.DEFAULT_QUERY_LIMIT,
    ) -> list[Message]:
        """Messages of `topic` whose `key` or one of whose `keys` is `key`, stored between
        `start` and `end` (seconds since the epoch or aware datetimes, both included;
        None: no bound), newest first, at most `limit` (1..1000), over every queue and
        broker. Found through the brokers' key indexes (a topic with key.index=false is
        refused); messages removed by retention or compaction are not returned."""
        request = key_query.query_request(topic, key, start=start, end=end, limit=limit)
        return await key_query.query_messages(self._cluster, request)

    async def remove_broker(self, name: str) -> list[static_leave.PrunedQueue]:
        """Take broker `name` out of every static topic's chains once it holds no data
        only it can serve: its links expired, or all in the object store (tiered storage;
        they are read from there afterwards). Refused, naming what it still holds,
        otherwise; then it can be stopped."""
        return await static_leave.remove_broker(self._cluster, name)

    async def _create_topic(
        self,
        name: str,
        queues: int,
        *,
        message_type: str,
        config: Mapping[str, str] | None,
        exist_ok: bool,
    ) -> TopicInfo:
        brokers = await self._live_brokers()
        plan: dict[str, list[int]] = {b: [] for b in brokers}
        for q in range(queues):
            plan[brokers[q % len(brokers)]].append(q)
        single = len(brokers) == 1

        async def create(address: str, hosted: list[int]) -> TopicInfoMsg:
            request = CreateTopicRequest(
                name=name,
                queues=queues,
                message_type=message_type,
                config=dict(config or {}),
                hosted_queues=[] if single else hosted,
            )
            return await self._cluster.call(address, request, TopicInfoMsg)

        if exist_ok:
            with contextlib.suppress(TopicNotFound):
                return await self.describe_topic(name)
        try:
            results = await asyncio.gather(*(create(a, h) for a, h in plan.items() if h))
        except TopicAlreadyExists:
            if not exist_ok:
                raise
            # Created meanwhile by someone else (or on some of the brokers only).
            return await self.describe_topic(name)
        finally:
            await self._cluster.refresh_topics([name])  # this topic's route alone
        return topic_info_from_wire(_merge(results))

    async def alter_topic(
        self,
        name: str,
        *,
        queues: int | None = None,
        config: Mapping[str, str] | None = None,
    ) -> TopicInfo:
        hosting = await self._hosting(name)
        brokers = await self._brokers()
        current = await self.describe_topic(name)
        plan = {address: list(qs) for address, qs in hosting.items()}
        if queues is not None and queues > current.queues and len(brokers) > 1:
            for q in range(current.queues, queues):
                plan.setdefault(brokers[q % len(brokers)], []).append(q)
        single = len(plan) == 1 and len(brokers) == 1

        async def alter(address: str, hosted: list[int]) -> TopicInfoMsg:
            request = AlterTopicRequest(
                name=name,
                queues=queues,
                config=dict(config or {}),
                hosted_queues=[] if single else hosted,
            )
            return await self._cluster.call(address, request, TopicInfoMsg)

        results = await asyncio.gather(*(alter(a, h) for a, h in plan.items()))
        await self._cluster.refresh_topics([name])
        return topic_info_from_wire(_merge(results))

    async def delete_topic(self, name: str) -> None:
        hosting = await self._hosting(name)
        routes = self._cluster.routes
        if routes.is_static(name):
            # Every broker holding a link, sealed ones too.
            holders = {
                link.broker
                for q in range(routes.queue_count(name))
                if (chain := routes.chain(name, q)) is not None
                for link in chain.links
            }
            away = sorted(holders - set(routes.brokers))
            if away:
                raise BrokerNotAvailable(
                    f"static topic {name!r} has links on {', '.join(away)}, not live: "
                    "start them so the topic is deleted everywhere"
                )
            hosting = {routes.brokers[b]: [] for b in holders}
        await asyncio.gather(
            *(
                self._cluster.call(address, DeleteTopicRequest(name=name), Empty)
                for address in hosting
            )
        )
        await self._cluster.refresh_topics([name])

    async def list_topics(
        self,
        prefix: str = "",
        *,
        after: str = "",
        limit: int | None = None,
        keep: Callable[[str], bool] | None = None,
    ) -> list[TopicInfo]:
        """Topics by name (without their per-queue details): those starting with
        `prefix`, after the name `after` (to page: the last name of the previous call), at
        most `limit` (None: every one; the brokers answer in pages of 10,000); with
        `keep`, only the names it keeps (tested before counting to `limit`)."""
        listed = await topic_pages.list_topics(
            self._cluster,
            await self._live_brokers(),
            prefix=prefix,
            after=after,
            limit=limit,
            keep=keep,
        )
        return [topic_info_from_wire(t) for t in listed]

    async def describe_topic(self, name: str) -> TopicInfo:
        hosting = await self._hosting(name)
        if not hosting:
            raise BrokerNotAvailable(f"no live broker serves topic {name!r}")
        results = await asyncio.gather(
            *(self._cluster.call(a, DescribeTopicRequest(name=name), TopicInfoMsg) for a in hosting)
        )
        merged = _merge(results)
        routes = self._cluster.routes
        if not routes.is_static(name):
            return topic_info_from_wire(merged)
        # Each queue as its write end's broker sees it (older links report too).
        merged.queue_info = [
            qi for qi in merged.queue_info if qi.broker == routes.broker_for(name, qi.queue)
        ]
        chains = (routes.chain(name, q) for q in range(routes.queue_count(name)))
        return dataclasses.replace(
            topic_info_from_wire(merged), chains=tuple(c for c in chains if c is not None)
        )

    async def list_groups(self) -> list[str]:
        """Every group some live broker knows (members, committed offsets or pop
        consumers), sorted: each group has its own coordinator (ADR 17), so every
        broker is asked."""
        routes = await self._cluster.refresh_routes(force=True)
        found: set[str] = set()
        for address in sorted(set(routes.brokers.values())):
            answer = await self._cluster.call(address, ListGroupsRequest(), ListGroupsResponse)
            found.update(answer.groups)
        return sorted(found)

    async def describe_group(self, group: str) -> GroupDescription:
        """Members, generation, and per queue the committed offset and lag. The group's
        coordinator knows the queues it hosts; the queues of the group's topics on other
        brokers are filled in here from their brokers."""
        answer = await self._cluster.group_call(
            group, DescribeGroupRequest(group=group), DescribeGroupResponse
        )
        committed = await self._committed(group)
        topics = {o.topic for o in answer.offsets} | {t for t, _ in committed}
        topics |= {t for m in answer.members for t, _ in m.assignment}
        have = {(o.topic, o.queue) for o in answer.offsets}
        routes = await self._cluster.refresh_routes(force=True)
        extra: list[GroupOffset] = []
        for topic in sorted(t for t in topics if t in routes):
            for queue in routes.queues(topic):
                if (topic, queue) in have:
                    continue
                bounds = await self._cluster.list_offsets(topic, queue)
                done = committed.get((topic, queue), -1)
                lag = bounds.max_offset - max(done, 0)
                extra.append(
                    GroupOffset(
                        topic=topic, queue=queue, committed=done, max_offset=bounds.max_offset,
                        lag=lag,
                    )
                )  # fmt: skip
        if extra:
            answer.offsets = sorted([*answer.offsets, *extra], key=lambda o: (o.topic, o.queue))
        return group_description_from_wire(answer)

    async def _committed(self, group: str) -> dict[tuple[str, int], int]:
        answer = await self._cluster.group_call(
            group, FetchOffsetsRequest(group=group), FetchOffsetsResponse
        )
        return {(o.topic, o.queue): o.offset for o in answer.offsets}

    async def reset_offsets(
        self, group: str, topic: str, *, to: str, value: int = 0, execute: bool = False
    ) -> list[CommittedOffset]:
        """Plan (execute=False, the default: a dry run) or apply new committed offsets for
        every queue of `topic`: to "earliest", "latest", "timestamp" (value = ms),
        "offset" (value) or "shift" (by value). Refused while the group has members.

        The coordinator plans (and applies) the queues it hosts; queues on other brokers
        are planned here from their brokers' bounds and committed through the coordinator
        outside any generation, which it accepts only while the group has no members."""
        check_reset_target(to)
        request = ResetOffsetsRequest(group=group, topic=topic, to=to, value=value, execute=execute)
        answer = await self._cluster.group_call(group, request, ResetOffsetsResponse)
        planned = {(o.topic, o.queue): o.offset for o in answer.offsets}
        routes = await self._cluster.refresh_routes(force=True)
        others = [q for q in routes.queues(topic) if (topic, q) not in planned]
        if not others:
            return [committed_offset_from_wire(o) for o in answer.offsets]
        committed = await self._committed(group)
        extra: dict[tuple[str, int], int] = {}
        for queue in others:
            at = value if to == "timestamp" else None
            bounds = await self._cluster.list_offsets(topic, queue, at)
            extra[(topic, queue)] = reset_target(
                to,
                value,
                min_offset=bounds.min_offset,
                max_offset=bounds.max_offset,
                committed=committed.get((topic, queue)),
                offset_for_time=bounds.offset_for_time,
            )
        if execute:
            commit = CommitOffsetsRequest(
                group=group,
                offsets=[QueueOffset(topic=t, queue=q, offset=o) for (t, q), o in extra.items()],
            )
            await self._cluster.group_call(group, commit, CommitOffsetsResponse)
        planned.update(extra)
        return [
            CommittedOffset(topic=t, queue=q, offset=o) for (t, q), o in sorted(planned.items())
        ]

    # ------------------------------------------------------------------ dead letters

    async def _dlq_bounds(self, group: str) -> tuple[int, int] | None:
        """(first, end) offsets of the group's dead-letter queue; None if it has none."""
        if not group:
            raise ValueError("a group name is needed")
        topic = dlq_topic(group)
        routes = await self._cluster.refresh_routes(force=True)
        if topic not in routes:
            return None
        bounds = await self._cluster.list_offsets(topic, 0)
        return bounds.min_offset, bounds.max_offset

    async def _read_dlq(self, group: str, start: int, end: int, limit: int) -> list[Message]:
        """Dead letters of `group` at offsets [start, end), at most `limit`."""
        topic = dlq_topic(group)
        out: list[Message] = []
        reader = AsyncStreamConsumer(cluster=self._cluster, start="earliest", fetch_wait_ms=100)
        try:
            reader.assign([(topic, 0)])
            reader.seek(topic, 0, start)
            stalled_since = time.monotonic()
            while len(out) < limit:
                position = reader.position(topic, 0)
                if position is not None and position >= end:
                    break
                got = [m for m in await reader.poll(200) if m.offset < end]
                if got:
                    stalled_since = time.monotonic()
                elif time.monotonic() - stalled_since > _READ_STALL_S:
                    raise TidemqError(f"reading {topic} stalled at offset {position} (end {end})")
                out.extend(got[: limit - len(out)])
        finally:
            await reader.close()
        return out

    async def dead_letters(self, group: str, *, limit: int = 100) -> list[Message]:
        """The first `limit` dead letters of `group` (from the start of `%DLQ%<group>`),
        redriven or not. Their `tidemq.dlq.*` headers say where each came from (topic,
        queue, offset, message_id), after how many attempts, and the last error."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        bounds = await self._dlq_bounds(group)
        if bounds is None:
            return []
        first, end = bounds
        return await self._read_dlq(group, first, end, limit)

    async def redrive_position(self, group: str) -> int:
        """The offset in `%DLQ%<group>` queue 0 below which dead letters were redriven."""
        committed = await self._committed(redrive_group(group))
        return committed.get((dlq_topic(group), 0), 0)

    async def redrive(self, group: str, *, limit: int | None = None) -> int:
        """Send the dead letters of `group` not redriven yet (at most `limit`) back to their
        origin topics; returns how many were sent.

        Each keeps its value, key, tag, keys and headers, less the `tidemq.dlq.*` ones,
        plus `tidemq.redriven_from` = the dead letter's message id; the producer picks the
        queue as for a new message. Progress is committed (group `%REDRIVE%<group>`) after
        every few hundred sends, so a second redrive sends only what arrived since. A dead
        letter without an origin header is skipped. If a send fails, the position stays at
        the first unsent message and the error is raised."""
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1 or None, got {limit}")
        bounds = await self._dlq_bounds(group)
        if bounds is None:
            return 0
        first, end = bounds
        topic = dlq_topic(group)
        position = max(first, await self.redrive_position(group))
        left = limit
        sent = 0
        producer = AsyncProducer(cluster=self._cluster)
        try:
            while position < end and (left is None or left > 0):
                chunk = _REDRIVE_CHUNK if left is None else min(left, _REDRIVE_CHUNK)
                letters = await self._read_dlq(group, position, end, chunk)
                if not letters:
                    break
                done, error = await _resend(producer, letters)
                sent += sum(1 for m in letters[:done] if _origin(m))
                if done:
                    position = letters[done - 1].offset + 1
                    commit = CommitOffsetsRequest(
                        group=redrive_group(group),
                        offsets=[QueueOffset(topic=topic, queue=0, offset=position)],
                    )
                    await self._cluster.group_call(
                        redrive_group(group), commit, CommitOffsetsResponse
                    )
                if error is not None:
                    raise error
                if left is not None:
                    left -= done
        finally:
            await producer.close()
        return sent

    async def cluster_status(self) -> list[BrokerInfo]:
        """The live brokers, as the name server knows them."""
        answer = await self._cluster.call(
            self._cluster.bootstrap, ClusterStatusRequest(), ClusterStatusResponse
        )
        return [broker_info_from_wire(b) for b in answer.brokers]

    async def elect_leader(
        self, group: str, member: str, *, timeout_ms: int = 10_000, wait_ms: int = 30_000
    ) -> LeaderHandover:
        """Move replica group `group`'s leadership to `member`, an in-sync follower,
        without losing an acknowledged message: the leader refuses new writes (clients
        retry) until `member` holds its whole log (at most `timeout_ms`), then steps
        down for it. Returns once the name server routes the group to `member` (at most
        `wait_ms` more)."""
        started = time.monotonic()
        address = (await self._cluster.refresh_topics([])).brokers.get(group)
        if address is None:
            raise InvalidRequest(f"no live broker is registered as replica group {group!r}")
        answer = await self._cluster.call(
            address,
            ElectLeaderRequest(group=group, member=member, timeout_ms=timeout_ms),
            ElectLeaderResponse,
            timeout_ms=timeout_ms + _ELECT_SLACK_MS,
        )
        deadline = started + (timeout_ms + wait_ms) / 1000
        while (now := (await self._cluster.refresh_topics([])).brokers.get(group)) in (
            None,
            address,
        ):
            if time.monotonic() > deadline:
                raise RequestTimeout(
                    f"{answer.previous} handed group {group} over to {member}, but the name "
                    f"server did not route it there within {wait_ms} ms"
                )
            await asyncio.sleep(_ELECT_POLL_S)
        return LeaderHandover(
            group=group,
            previous=answer.previous,
            member=member,
            address=now or "",
            paused_ms=answer.paused_ms,
            took_ms=(time.monotonic() - started) * 1000,
        )

    async def broker_status(self, address: str) -> BrokerStatus:
        """The report of the broker at `address`: version, log positions, connections."""
        return broker_status_from_wire(
            await self._cluster.call(address, StatusRequest(), StatusResponse)
        )

    async def timer_status(self, topic: str = "") -> TimerStatus:
        """Pending delayed messages per topic (count, next due time), over all brokers."""
        merged: dict[str, TimerTopicStatus] = {}
        total: TimerStatusResponse | None = None
        for address in await self._brokers():
            s = await self._cluster.call(
                address, TimerStatusRequest(topic=topic), TimerStatusResponse
            )
            if total is None:
                total = s
            else:
                total.delivered_batches += s.delivered_batches
                total.cancelled_batches += s.cancelled_batches
            for t in s.topics:
                m = merged.get(t.topic)
                if m is None:
                    merged[t.topic] = t
                    continue
                m.pending_batches += t.pending_batches
                m.pending_messages += t.pending_messages
                m.next_due_ms = min(m.next_due_ms, t.next_due_ms)
        assert total is not None
        total.topics = sorted(merged.values(), key=lambda t: t.topic)
        return timer_status_from_wire(total)

    async def tier_status(self, topic: str = "") -> list[TierStatus]:
        """Tiered storage on every broker (one entry each, by broker name): what each
        offloaded queue holds remotely and locally, and the last upload error if any."""
        out = [
            tier_status_from_wire(
                await self._cluster.call(
                    address, TierStatusRequest(topic=topic), TierStatusResponse
                )
            )
            for address in await self._brokers()
        ]
        return sorted(out, key=lambda s: s.broker)

    async def tier_offload(self, topic: str) -> list[TierStatus]:
        """Upload every durable batch of `topic` to the object store now, whatever its
        size and age (before maintenance; local copies then go per local.retention.*);
        returns the status of each broker holding its data, once done."""
        out = [
            tier_status_from_wire(
                await self._cluster.call(
                    address, TierOffloadRequest(topic=topic), TierStatusResponse
                )
            )
            for address in await self._holders(topic)
        ]
        return sorted(out, key=lambda s: s.broker)

    async def tier_files(
        self, topic: str, *, queue: int | None = None, start: int = 0, end: int | None = None
    ) -> list[TierFile]:
        """The remote (Parquet) files of `topic` holding offsets in [start, end), by queue
        and offset: their URLs open in pyarrow, DuckDB and Spark. (For a static topic,
        each broker's files of its own links, in that broker's offsets.)"""
        checks.check_offset(start, "start")
        if end is not None:
            checks.check_offset(end, "end")
        request = TierFilesRequest(
            topic=topic, queue=-1 if queue is None else queue, start=start,
            end=-1 if end is None else end,
        )  # fmt: skip
        files: list[TierFile] = []
        for address in await self._holders(topic):
            answer = await self._cluster.call(address, request, TierFilesResponse)
            files.extend(
                TierFile(**{f: getattr(w, f) for f in w.__struct_fields__}) for w in answer.files
            )
        return sorted(files, key=lambda f: (f.queue, f.start))

    async def transaction_status(self) -> TransactionStatus:
        """Open transactions, and those the brokers rolled back after their check-backs."""
        total: TxnStatusResponse | None = None
        for address in await self._brokers():
            s = await self._cluster.call(address, TxnStatusRequest(), TxnStatusResponse)
            if total is None:
                total = s
                continue
            total.open.extend(s.open)
            total.discarded.extend(s.discarded)
            total.committed += s.committed
            total.rolled_back += s.rolled_back
        assert total is not None
        return transaction_status_from_wire(total)

    async def rollback_transaction(self, txn_id: str) -> None:
        """Roll back an open transaction by its id (`transaction_status().open`), as its
        producer would: its half messages are never published, and the producer's later
        commit fails. Every broker is asked; the one holding it answers. UnknownTransaction
        when none does; a transaction already committed cannot be rolled back."""
        if not isinstance(txn_id, str) or not txn_id:
            raise InvalidRequest(f"txn_id must be a non-empty str, got {txn_id!r}")
        request = EndTxnRequest(txn_ids=[txn_id], commit=False)
        for address in await self._brokers():
            try:
                await self._cluster.call(address, request, EndTxnResponse)
            except UnknownTransaction:
                continue
            return
        raise UnknownTransaction(f"no broker holds transaction {txn_id[:64]!r}")

    async def pop_status(self, group: str) -> list[PopStatus]:
        """Per queue of every broker, the pop consumption of `group`: acknowledged below,
        next offset, messages in flight, dead-lettered, and suspended messages."""
        out: list[PopQueueStatus] = []
        for address in await self._brokers():
            s = await self._cluster.call(address, PopStatusRequest(group=group), PopStatusResponse)
            out.extend(s.queues)
        return [pop_status_from_wire(q) for q in sorted(out, key=lambda q: (q.topic, q.queue))]

    async def resume(self, group: str, message_id: str, *, action: str = "retry") -> ResumeResult:
        """Resume a message that `group` suspended after its last attempt: "retry"
        delivers it again with a fresh count of attempts, "dead-letter" moves it to
        `%DLQ%<group>` now. Either way its FIFO message group moves on after it."""
        if action not in ("retry", "dead-letter"):
            raise ValueError(f"action must be 'retry' or 'dead-letter', got {action!r}")
        last: InvalidRequest | None = None
        for address in await self._brokers():
            try:
                answer = await self._cluster.call(
                    address,
                    PopResumeRequest(group=group, message_id=message_id, action=action),
                    PopResumeResponse,
                )
            except InvalidRequest as exc:  # not on this broker
                last = exc
            else:
                return resume_result_from_wire(answer)
        raise last or InvalidRequest(f"no broker holds a suspended message {message_id}")

    async def create_user(
        self, name: str, password: str, *, iterations: int = DEFAULT_ITERATIONS
    ) -> None:
        """Create a user of SCRAM authentication, or set a new password for an existing
        one, in the cluster: on its security writer (ADR 20), whence the change
        reaches every broker and name server within a few heartbeats, those that are
        down or join later included (ADR 15). Only the salted keys leave this process
        (use TLS all the same); with `broker.auth_enabled`, only a super user may."""
        try:
            c = make_credentials(password, new_salt(os.urandom), iterations)
        except ScramError as exc:
            raise ValueError(str(exc)) from None
        request = UserUpsertRequest(
            name=name,
            salt=c.salt,
            iterations=c.iterations,
            stored_key=c.stored_key,
            server_key=c.server_key,
        )
        await acls_api.writer_call(self._cluster, request, Empty)

    async def delete_user(self, name: str) -> None:
        """Delete a user in the cluster (InvalidRequest if there is none of that name).
        Connections it has open stay open; new logins are refused on every broker once
        the change has reached it."""
        await acls_api.writer_call(self._cluster, UserDeleteRequest(name=name), Empty, gone=Empty)

    async def list_users(self) -> list[UserInfo]:
        """The cluster's users (the writer's), by name (names and iterations only)."""
        answer = await acls_api.writer_call(self._cluster, UserListRequest(), UserListResponse)
        return [user_info_from_wire(u) for u in sorted(answer.users, key=lambda u: u.name)]

    async def create_acls(self, acls: Iterable[Acl]) -> int:
        """Add ACL entries in the cluster (on its writer, as `create_user`); how many
        were new. With `broker.authorization_enabled`, this needs ALTER on the cluster
        (a super user)."""
        return await acls_api.create_acls(self._cluster, acls)

    async def delete_acls(self, acls: Iterable[Acl]) -> int:
        """Remove ACL entries (exactly these) in the cluster; how many were there."""
        return await acls_api.delete_acls(self._cluster, acls)

    async def list_acls(
        self, *, principal: str | None = None, resource_type: str | None = None
    ) -> list[Acl]:
        """The cluster's ACL entries, optionally of one principal or type."""
        return await acls_api.list_acls(
            self._cluster, principal=principal, resource_type=resource_type
        )

    async def get(self, topic: str, key: bytes) -> bytes | None:
        """The latest value of `key` in compact topic `topic`, from the key index of the
        broker serving its queue (a few reads, not a scan); None for a deleted (tombstone)
        or unknown key. ConfigError for a topic whose cleanup.policy is delete."""
        found = await kv.lookup(self._cluster, topic, key)
        return None if found is None else found.value

    async def lookup(self, topic: str, key: bytes) -> kv.KeyLookup | None:
        """`get` with where the value is: queue, offset, timestamp (value None: a
        tombstone not yet compacted away)."""
        return await kv.lookup(self._cluster, topic, key)

    async def compact(self, topic: str) -> list[kv.CompactionReport]:
        """Compact every queue of compact topic `topic` now (the brokers also compact in
        the background, by the topic's min.cleanable.dirty.ratio and lag settings)."""
        return await kv.compact(self._cluster, topic, await self._hosting(topic))

    async def close(self) -> None:
        await self._cluster.close()

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _origin(letter: Message) -> str:
    return letter.headers.get(DLQ_HEADER_PREFIX + "topic", b"").decode(errors="replace")


async def _resend(
    producer: AsyncProducer, letters: list[Message]
) -> tuple[int, BaseException | None]:
    """Send dead letters back to their origin topics, concurrently (the producer batches
    them). Returns how many, from the first, were sent (or skipped), and the first error."""

    async def one(letter: Message) -> None:
        origin = _origin(letter)
        if not origin:
            log.warning("dead letter %s has no origin topic: skipped", letter.message_id)
            return
        headers = {k: v for k, v in letter.headers.items() if not k.startswith(DLQ_HEADER_PREFIX)}
        headers[REDRIVEN_FROM_HEADER] = letter.message_id.encode()
        await producer.send(
            origin, letter.value, key=letter.key, tag=letter.tag, keys=letter.keys,
            headers=headers,
        )  # fmt: skip

    results = await asyncio.gather(*(one(m) for m in letters), return_exceptions=True)
    for i, result in enumerate(results):
        if isinstance(result, BaseException):
            return i, result
    return len(letters), None


def _merge(parts: list[TopicInfoMsg]) -> TopicInfoMsg:
    first = parts[0]
    queue_info = sorted((qi for p in parts for qi in p.queue_info), key=lambda qi: qi.queue)
    return TopicInfoMsg(
        name=first.name,
        queues=max(p.queues for p in parts),
        message_type=first.message_type,
        config=first.config,
        queue_info=queue_info,
    )
