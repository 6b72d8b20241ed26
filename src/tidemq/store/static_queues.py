"""The chains of a broker's static queues (`tidemq.core.static_chain`), kept in metadata.

A queue of a static topic is writable on this broker only while this broker holds the
open link of its chain; a sealed queue refuses appends (QueueMoved) in the store itself, so
nothing slips in between a seal and the end offset it records.
"""

from __future__ import annotations

from tidemq.core.static_chain import QueueChain, decode_chain, encode_chain
from tidemq.store.metadata import Metadata

__all__ = ["StaticQueues"]


class StaticQueues:
    def __init__(self, metadata: Metadata) -> None:
        self._meta = metadata
        self._chains: dict[tuple[int, int], QueueChain] = {}
        #: (topic id, queue) of the static queues not writable here: appends are refused.
        self.read_only: set[tuple[int, int]] = set()
        #: Keys set since the broker last wrote them into the replicated log
        #: (`broker/member_tables.py`).
        self.changed: set[tuple[int, int]] = set()
        for key, (writable, raw) in metadata.static_chains().items():
            self._chains[key] = decode_chain(raw)
            if not writable:
                self.read_only.add(key)

    def keys(self) -> list[tuple[int, int]]:
        return list(self._chains)

    def get(self, topic_id: int, queue: int) -> QueueChain | None:
        return self._chains.get((topic_id, queue))

    def is_writable(self, topic_id: int, queue: int) -> bool:
        return (topic_id, queue) in self._chains and (topic_id, queue) not in self.read_only

    def of_topic(self, topic_id: int) -> dict[int, QueueChain]:
        return {q: c for (t, q), c in self._chains.items() if t == topic_id}

    def set(self, topic_id: int, queue: int, chain: QueueChain, *, writable: bool) -> None:
        """Store `chain` durably; `writable`: this broker holds its open link."""
        key = (topic_id, queue)
        if not writable:
            # Refuse appends before the write reaches the disk: a crash between the two
            # leaves a queue read-only in memory only, which the restart re-reads.
            self.read_only.add(key)
        self._meta.set_static_chain(topic_id, queue, writable, encode_chain(chain))
        self._chains[key] = chain
        if writable:
            self.read_only.discard(key)
        self.changed.add(key)

    def drop_topic(self, topic_id: int) -> None:
        for key in [k for k in self._chains if k[0] == topic_id]:
            del self._chains[key]
            self.read_only.discard(key)
