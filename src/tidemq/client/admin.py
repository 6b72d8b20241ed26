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
from tidemq.protocol.commands import (
    AlterTopicRequest,
    BrokerStatus,
    ClusterStatusRequest,
    ClusterStatusResponse,
    CreateTopicRequest,
    DeleteTopicRequest,
    DescribeGroupRequest,
    DescribeGroupResponse,
    DescribeTopicRequest,
    Empty,
    ListGroupsRequest,
    ListGroupsResponse,
    ListTopicsRequest,
    ListTopicsResponse,
    QueueOffset,
    ResetOffsetsRequest,
    ResetOffsetsResponse,
    StatusRequest,
    StatusResponse,
    TopicInfoMsg,
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
        message_type: str = "NORMAL",
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
        coordinator = await self._cluster.coordinator()
        return await self._cluster.call(
            coordinator, DescribeGroupRequest(group=group), DescribeGroupResponse
        )

    async def reset_offsets(
        self, group: str, topic: str, *, to: str, value: int = 0, execute: bool = False
    ) -> list[QueueOffset]:
        """Plan (execute=False, the default: a dry run) or apply new committed offsets for
        every queue of `topic`: to "earliest", "latest", "timestamp" (value = ms),
        "offset" (value) or "shift" (by value). Refused while the group has members."""
        coordinator = await self._cluster.coordinator()
        request = ResetOffsetsRequest(group=group, topic=topic, to=to, value=value, execute=execute)
        answer = await self._cluster.call(coordinator, request, ResetOffsetsResponse)
        return answer.offsets

    async def cluster_status(self) -> list[BrokerStatus]:
        answer = await self._cluster.call(
            self._cluster.bootstrap, ClusterStatusRequest(), ClusterStatusResponse
        )
        return answer.brokers

    async def broker_status(self, address: str) -> StatusResponse:
        return await self._cluster.call(address, StatusRequest(), StatusResponse)

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
