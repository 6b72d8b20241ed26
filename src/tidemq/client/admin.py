"""Topic, group and cluster administration.

A topic's queues are spread over the live brokers (queue q on the q-th broker in name
order, round robin); each broker is told which queues it serves. With one broker it
serves them all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.core import limits
from tidemq.core.errors import BrokerNotAvailable, ConfigError, TopicNotFound
from tidemq.core.offsets import check_reset_target, reset_target
from tidemq.protocol.commands import (
    AlterTopicRequest,
    BrokerStatus,
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
    FetchOffsetsRequest,
    FetchOffsetsResponse,
    GroupOffset,
    ListGroupsRequest,
    ListGroupsResponse,
    ListTopicsRequest,
    ListTopicsResponse,
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
)

__all__ = ["AsyncAdmin"]


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

    async def _hosting(self, name: str) -> dict[str, list[int]]:
        """Broker address -> queues of `name` it serves."""
        routes = await self._cluster.refresh_routes(force=True)
        if name not in routes:
            raise TopicNotFound(f"topic {name!r} does not exist")
        out: dict[str, list[int]] = {}
        for q in routes.queues(name):
            address = routes.broker_for(name, q)
            if address is not None:
                out.setdefault(address, []).append(q)
        return out

    async def create_topic(
        self,
        name: str,
        queues: int = 8,
        *,
        message_type: str = "MIXED",
        config: Mapping[str, str] | None = None,
    ) -> TopicInfoMsg:
        if not 1 <= queues <= limits.MAX_QUEUES_PER_TOPIC:
            # The brokers check this too, but with no queue to place none would be asked.
            raise ConfigError(f"queues must be 1..{limits.MAX_QUEUES_PER_TOPIC}, got {queues}")
        brokers = await self._brokers()
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

        results = await asyncio.gather(*(create(a, h) for a, h in plan.items() if h))
        await self._cluster.refresh_routes(force=True)
        return _merge(results)

    async def alter_topic(
        self,
        name: str,
        *,
        queues: int | None = None,
        config: Mapping[str, str] | None = None,
    ) -> TopicInfoMsg:
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
        await self._cluster.refresh_routes(force=True)
        return _merge(results)

    async def delete_topic(self, name: str) -> None:
        hosting = await self._hosting(name)
        await asyncio.gather(
            *(
                self._cluster.call(address, DeleteTopicRequest(name=name), Empty)
                for address in hosting
            )
        )
        await self._cluster.refresh_routes(force=True)

    async def list_topics(self) -> list[TopicInfoMsg]:
        brokers = await self._brokers()
        answers = await asyncio.gather(
            *(self._cluster.call(b, ListTopicsRequest(), ListTopicsResponse) for b in brokers)
        )
        seen: dict[str, TopicInfoMsg] = {}
        for answer in answers:
            for topic in answer.topics:
                seen.setdefault(topic.name, topic)
        return [seen[n] for n in sorted(seen)]

    async def describe_topic(self, name: str) -> TopicInfoMsg:
        hosting = await self._hosting(name)
        if not hosting:
            raise BrokerNotAvailable(f"no live broker serves topic {name!r}")
        results = await asyncio.gather(
            *(self._cluster.call(a, DescribeTopicRequest(name=name), TopicInfoMsg) for a in hosting)
        )
        return _merge(results)

    async def list_groups(self) -> list[str]:
        coordinator = await self._cluster.coordinator()
        answer = await self._cluster.call(coordinator, ListGroupsRequest(), ListGroupsResponse)
        return answer.groups

    async def describe_group(self, group: str) -> DescribeGroupResponse:
        """Members, generation, and per queue the committed offset and lag. The coordinator
        knows the queues it hosts; the queues of the group's topics on other brokers are
        filled in here from their brokers."""
        coordinator = await self._cluster.coordinator()
        answer = await self._cluster.call(
            coordinator, DescribeGroupRequest(group=group), DescribeGroupResponse
        )
        committed = await self._committed(coordinator, group)
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
        return answer

    async def _committed(self, coordinator: str, group: str) -> dict[tuple[str, int], int]:
        answer = await self._cluster.call(
            coordinator, FetchOffsetsRequest(group=group), FetchOffsetsResponse
        )
        return {(o.topic, o.queue): o.offset for o in answer.offsets}

    async def reset_offsets(
        self, group: str, topic: str, *, to: str, value: int = 0, execute: bool = False
    ) -> list[QueueOffset]:
        """Plan (execute=False, the default: a dry run) or apply new committed offsets for
        every queue of `topic`: to "earliest", "latest", "timestamp" (value = ms),
        "offset" (value) or "shift" (by value). Refused while the group has members.

        The coordinator plans (and applies) the queues it hosts; queues on other brokers
        are planned here from their brokers' bounds and committed through the coordinator
        outside any generation, which it accepts only while the group has no members."""
        check_reset_target(to)
        coordinator = await self._cluster.coordinator()
        request = ResetOffsetsRequest(group=group, topic=topic, to=to, value=value, execute=execute)
        answer = await self._cluster.call(coordinator, request, ResetOffsetsResponse)
        planned = {(o.topic, o.queue): o.offset for o in answer.offsets}
        routes = await self._cluster.refresh_routes(force=True)
        others = [q for q in routes.queues(topic) if (topic, q) not in planned]
        if not others:
            return answer.offsets
        committed = await self._committed(coordinator, group)
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
            await self._cluster.call(coordinator, commit, CommitOffsetsResponse)
        planned.update(extra)
        return [QueueOffset(topic=t, queue=q, offset=o) for (t, q), o in sorted(planned.items())]

    async def cluster_status(self) -> list[BrokerStatus]:
        answer = await self._cluster.call(
            self._cluster.bootstrap, ClusterStatusRequest(), ClusterStatusResponse
        )
        return answer.brokers

    async def broker_status(self, address: str) -> StatusResponse:
        return await self._cluster.call(address, StatusRequest(), StatusResponse)

    async def timer_status(self, topic: str = "") -> TimerStatusResponse:
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
        return total

    async def transaction_status(self) -> TxnStatusResponse:
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
        return total

    async def close(self) -> None:
        await self._cluster.close()

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


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
