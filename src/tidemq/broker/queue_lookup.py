"""What the timer and pop services ask of the broker's topics: which queues are hosted
here, which static queues this broker may write, and the per-group internal topics they
create on first use."""

from __future__ import annotations

import contextlib

from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.topics import TopicTable
from tidemq.core.errors import QueueNotFound, TopicAlreadyExists, TopicNotFound

__all__ = ["QueueLookup"]


class QueueLookup:
    """Answers from the topic table and the store (on the broker's loop)."""

    def __init__(self, topics: TopicTable, gateway: StoreGateway) -> None:
        self._topics = topics
        self._gateway = gateway

    def has_queue(self, topic: str, queue: int) -> bool:
        try:
            self._topics.get(topic)
        except TopicNotFound:
            return False
        return queue in self._topics.hosted(topic)

    def static_writable(self, topic: str, queue: int) -> bool | None:
        """None for a queue of an ordinary topic; for a static queue, whether this broker
        holds its write end (the timer service delivers there only then)."""
        if not self._topics.is_static(topic):
            return None
        try:
            return self._gateway.store.static_writable(topic, queue)
        except (TopicNotFound, QueueNotFound):
            return False

    def hosted_queues(self, topic: str) -> list[int]:
        """The queues pop consumers of `topic` read here: a static topic's, every queue
        with a link here (each broker pops its own links; on a FIFO topic, a link only
        once the links before it are finished, `static_pop`)."""
        self._topics.get(topic)  # TopicNotFound for an unknown topic
        return self._topics.hosted(topic)

    async def ensure_topic(self, topic: str) -> None:
        """Create an internal per-group topic (%DLQ%<group>) on first use."""
        try:
            self._topics.get(topic)
        except TopicNotFound:
            with contextlib.suppress(TopicAlreadyExists):
                await self._topics.create(topic, 1, hosted=[0])
