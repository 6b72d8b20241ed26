"""What a broker tells its name servers about its topics: the whole lists (ordinary and
static topics), one topic's registration for a delta, and the journal of changes
(cluster/topic_journal.py); with an embedded name server, the registration itself
(`register_local`: the changes since the version it holds, or everything)."""

from __future__ import annotations

from collections.abc import Callable

from tidemq.broker.topics import TopicTable
from tidemq.cluster.nameserver import NameServer
from tidemq.cluster.topic_journal import STATIC, StaticMark, TopicJournal, TopicRegistration
from tidemq.core.static_chain import QueueChain
from tidemq.protocol.commands import StaticTopicReg

__all__ = ["TopicRegistrations"]


class TopicRegistrations:
    def __init__(self, topics: TopicTable, chains: Callable[[str], list[QueueChain]]) -> None:
        """`chains(topic)`: a static topic's chains, as this broker holds them."""
        self._topics = topics
        self._chains = chains
        self.journal = TopicJournal()
        #: The version the embedded name server holds (None: none yet).
        self._local_acked: int | None = None

    def topic_list(self) -> list[TopicRegistration]:
        return [
            (t.name, t.queues, t.message_type.value, self._topics.hosted(t.name))
            for t in self._topics.all()
            if not self._topics.is_static(t.name)
        ]

    def static_list(self) -> list[StaticTopicReg]:
        return [
            StaticTopicReg(
                topic=t.name,
                queues=t.queues,
                message_type=t.message_type.value,
                chains=self._chains(t.name),
            )
            for t in self._topics.all()
            if self._topics.is_static(t.name)
        ]

    def lookup(self, name: str) -> TopicRegistration | StaticMark | None:
        """One topic's registration now, for a delta; STATIC for a static topic."""
        info = self._topics.find(name)
        if info is None:
            return None
        if self._topics.is_static(name):
            return STATIC
        return (name, info.queues, info.message_type.value, self._topics.hosted(name))

    def register_local(
        self, ns: NameServer, broker_name: str, address: str, *, created_ms: int
    ) -> None:
        """Register with the embedded name server: the changes since the version it
        holds, or everything when it holds none (or refuses the delta)."""
        journal = self.journal
        delta = journal.delta(self._local_acked, self.lookup)
        if delta is not None and ns.update(
            broker_name,
            address,
            epoch=journal.epoch,
            base_version=delta.base_version,
            version=delta.version,
            topics=delta.upserts,
            removed=delta.removed,
        ):
            self._local_acked = delta.version
            return
        ns.register(
            broker_name,
            address,
            self.topic_list(),
            created_ms=created_ms,
            static_topics=self.static_list(),
            epoch=journal.epoch,
            version=journal.version,
        )
        self._local_acked = journal.version
