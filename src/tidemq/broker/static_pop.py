"""The broker's side of FIFO pop consumption of static topics (`core/static_fifo`): what
pop consumers said about the group's progress on other brokers, the limit it puts on this
broker's pops, and this broker's own progress for the answer."""

from __future__ import annotations

from collections.abc import Callable

from tidemq.broker.topics import TopicTable
from tidemq.core.errors import QueueNotFound, TopicNotFound
from tidemq.core.static_chain import QueueChain
from tidemq.core.static_fifo import finished_logical, pop_limit
from tidemq.store.message_store import MessageStore
from tidemq.store.metadata import MessageType

__all__ = ["MAX_FIFO_REPORTS", "StaticFifoPop"]

#: Queue reports one pop request may carry (a consumer of many static FIFO queues sends
#: one per queue whose chain spans brokers).
MAX_FIFO_REPORTS = 4096


class StaticFifoPop:
    def __init__(self, broker: str, store: Callable[[], MessageStore], topics: TopicTable) -> None:
        self._me = broker
        self._store = store
        self._topics = topics
        #: (pop group, topic, queue) -> logical offset below which a consumer said every
        #: message is finished (only grows; lost on restart, when consumers say it again).
        self._finished: dict[tuple[str, str, int], int] = {}

    def _chain(self, topic: str, queue: int) -> QueueChain | None:
        """The chain of a static FIFO queue with links here; None for any other queue."""
        if not self._topics.is_static(topic):
            return None
        try:
            if self._topics.get(topic).message_type is not MessageType.FIFO:
                return None
            return self._store().static_chain(topic, queue)
        except (TopicNotFound, QueueNotFound):
            return None

    def note(self, group: str, finished: list[tuple[str, int, int]]) -> None:
        """What a consumer's receive says about the group's progress."""
        for topic, queue, offset in finished[:MAX_FIFO_REPORTS]:
            key = (group, topic, queue)
            if offset > self._finished.get(key, -1):
                self._finished[key] = offset

    def limit(self, group: str, topic: str, queue: int) -> int | None:
        """The physical offset this broker's pop of the queue may not read past."""
        chain = self._chain(topic, queue)
        if chain is None:
            return None
        return pop_limit(chain, self._me, self._finished.get((group, topic, queue), -1))

    def reports(
        self,
        group: str,
        topics: list[str],
        finished_below: Callable[[str, str, int], int],
    ) -> list[tuple[str, int, int]]:
        """(topic, queue, logical offset) for each static FIFO queue of `topics` with links
        here: every message of this broker's links below it is finished for the group
        (`finished_below`: the pop service's physical answer)."""
        out = []
        for topic in topics:
            if not self._topics.is_static(topic):
                continue
            for queue in self._topics.hosted(topic):
                chain = self._chain(topic, queue)
                if chain is not None and len({link.broker for link in chain.links}) > 1:
                    physical = finished_below(group, topic, queue)
                    out.append((topic, queue, finished_logical(chain, self._me, physical)))
        return out
