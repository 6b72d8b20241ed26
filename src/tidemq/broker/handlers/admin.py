"""Topic admin and broker status."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from tidemq.broker.config import BrokerConfig
from tidemq.broker.static_view import LinkView
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.topics import TopicTable, check_user_topic
from tidemq.core import limits
from tidemq.core.errors import InvalidRequest
from tidemq.core.version import __version__
from tidemq.protocol.commands import (
    AlterTopicRequest,
    CreateTopicRequest,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicRequest,
    DescribeTopicRequest,
    Empty,
    ListTopicsRequest,
    ListTopicsResponse,
    QueueInfo,
    StatusResponse,
    TopicFailure,
    TopicInfoMsg,
)
from tidemq.store.message_store import MessageStore
from tidemq.store.metadata import TopicInfo

__all__ = ["AdminHandlers"]


def _public_config(info: TopicInfo) -> dict[str, str]:
    # Internal keys (tidemq.hosted.queues, tidemq.static) are the broker's own.
    config = {k: v for k, v in info.config.items() if not k.startswith("tidemq.")}
    config["cleanup.policy"] = info.cleanup_policy.value
    if info.retention_ms is not None:
        config["retention.ms"] = str(info.retention_ms)
    if info.retention_bytes is not None:
        config["retention.bytes"] = str(info.retention_bytes)
    return config


def _summary(info: TopicInfo) -> TopicInfoMsg:
    """A topic without its per-queue information (lists, batch creates)."""
    return TopicInfoMsg(
        name=info.name,
        queues=info.queues,
        message_type=info.message_type.value,
        config=_public_config(info),
    )


async def _nothing() -> None:
    return None


class AdminHandlers:
    def __init__(
        self,
        config: BrokerConfig,
        gateway: StoreGateway,
        topics: TopicTable,
        address: str,
        *,
        static_view: Callable[[str, int], LinkView | None] = lambda topic, queue: None,
        register_now: Callable[[], Awaitable[None]] = _nothing,
    ) -> None:
        """`register_now`: registers the broker with its name servers, returning once they
        have it (topic changes are answered after it)."""
        self._config = config
        self._gateway = gateway
        self._topics = topics
        self.address = address
        self._started = time.monotonic()
        self.connections: Callable[[], int] = lambda: 0
        #: A static queue's chain view: describe speaks logical offsets.
        self.static_view = static_view
        self._register_now = register_now

    async def _describe(self, info: TopicInfo) -> TopicInfoMsg:
        hosted = self._topics.hosted(info.name)
        views = {q: self.static_view(info.name, q) for q in hosted}

        def logical(q: int, lo: int, hi: int) -> tuple[int, int]:
            view = views[q]
            return (lo, hi) if view is None else view.bounds(lo, hi)

        def bounds(store: MessageStore) -> list[tuple[int, int, int]]:
            return [
                (*logical(q, *store.queue_bounds(info.name, q)), store.compacted_end(info.name, q))
                for q in hosted
            ]

        ranges = await self._gateway.call(bounds)
        return TopicInfoMsg(
            name=info.name,
            queues=info.queues,
            message_type=info.message_type.value,
            config=_public_config(info),
            queue_info=[
                QueueInfo(
                    queue=q,
                    min_offset=lo,
                    max_offset=hi,
                    broker=self.address,
                    compacted_end=compacted,
                )
                for q, (lo, hi, compacted) in zip(hosted, ranges, strict=True)
            ],
            chains=[v.chain for v in views.values() if v is not None],
        )

    async def create_topic(self, req: CreateTopicRequest) -> TopicInfoMsg:
        check_user_topic(req.name)  # internal topics are created by the broker alone
        info = await self._topics.create(
            req.name,
            req.queues,
            message_type=req.message_type,
            config=dict(req.config),
            hosted=list(req.hosted_queues),
        )
        # Answered once the name servers route the topic: a client that sends right after
        # the create must not be told the topic does not exist.
        await self._register_now()
        return await self._describe(info)

    async def create_topics(self, req: CreateTopicsRequest) -> CreateTopicsResponse:
        """Many topics at once: one metadata transaction and one registration for them
        all (a hundred thousand topics are ten such requests)."""
        if len(req.topics) > limits.MAX_TOPICS_PER_CREATE:
            raise InvalidRequest(
                f"{len(req.topics)} topics in one request; at most "
                f"{limits.MAX_TOPICS_PER_CREATE} (Admin.create_topics splits larger batches)"
            )
        created, failed = await self._topics.create_many(list(req.topics))
        if created:
            await self._register_now()
        return CreateTopicsResponse(
            created=[_summary(t) for t in created],
            failed=[TopicFailure(name=n, code=int(e.code), message=str(e)) for n, e in failed],
        )

    async def alter_topic(self, req: AlterTopicRequest) -> TopicInfoMsg:
        info = await self._topics.alter(
            req.name, queues=req.queues, config=dict(req.config), hosted=list(req.hosted_queues)
        )
        await self._register_now()
        return await self._describe(info)

    async def delete_topic(self, req: DeleteTopicRequest) -> Empty:
        await self._topics.delete(req.name)
        await self._register_now()
        return Empty()

    async def list_topics(self, req: ListTopicsRequest) -> ListTopicsResponse:
        if not 0 <= req.limit <= limits.MAX_LIST_TOPICS:
            raise InvalidRequest(
                f"limit must be 0-{limits.MAX_LIST_TOPICS} topics per page, got {req.limit}"
            )
        for what, value in (("prefix", req.prefix), ("after", req.after)):
            if len(value) > limits.MAX_TOPIC_NAME_BYTES:
                raise InvalidRequest(
                    f"{what} is longer than a topic name ({limits.MAX_TOPIC_NAME_BYTES})"
                )
        page, after = self._topics.page(req.prefix, req.after, req.limit or limits.MAX_LIST_TOPICS)
        return ListTopicsResponse(topics=[_summary(t) for t in page], next=after)

    async def describe_topic(self, req: DescribeTopicRequest) -> TopicInfoMsg:
        return await self._describe(self._topics.get(req.name))

    async def status(self) -> StatusResponse:
        def positions(store: MessageStore) -> tuple[int, int]:
            return store.end_position, store.flushed_position

        end, flushed = await self._gateway.call(positions)
        return StatusResponse(
            broker_name=self._config.broker_name,
            version=__version__,
            flush_mode=self._config.store.flush_mode.value,
            topics=len(self._topics.all()),
            log_end_position=end,
            log_flushed_position=flushed,
            connections=self.connections(),
            uptime_ms=int((time.monotonic() - self._started) * 1000),
        )
