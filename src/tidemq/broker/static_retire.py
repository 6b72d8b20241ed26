"""Static-topic links handed to the object store when their broker leaves the cluster.

`tidemq cluster remove-broker X` marks X's links `tiered` (`core.static_chain.retire`)
when their data is still readable but all of it is in the bucket: X checks that here
(`check_retire`) before it stores the chain, and afterwards any broker of the same tier
serves those offsets from X's files (`tier_links`). Nobody runs X's remote retention
once X is gone, so the broker holding the queue's write end expires X's links
(`RetiredLinks.expire`): a whole link once its last message is past the topic's
`retention.ms`; its files go, then the link leaves the chain. See
docs/design/static-topics.md, "A broker leaves".
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec

from tidemq.broker.topics import TopicTable
from tidemq.core.clock import Clock
from tidemq.core.errors import InvalidRequest
from tidemq.core.static_chain import Link, QueueChain
from tidemq.store.message_store import MessageStore

if TYPE_CHECKING:
    from tidemq.broker.tier_service import TierService

__all__ = ["RetiredLinks", "check_retire"]

log = logging.getLogger(__name__)


def check_retire(
    store: MessageStore,
    topic: str,
    queue: int,
    links: list[Link],
    unfinished: Callable[[str, int, int], list[str]],
) -> None:
    """Raise InvalidRequest unless this broker's `links` of the queue may be read from
    the object store from now on: sealed, and every offset of them that has not expired
    is in the bucket (verified, `remote_end`); no pop group has unfinished messages there
    (nobody would pop them any more)."""
    info, _ = store.index_of(topic, queue)
    low = store.queue_bounds(topic, queue)[0]
    remote = store.remote.get((info.id, queue))
    offloaded = remote.remote_end if remote is not None else 0
    for link in links:
        if link.is_open:
            raise InvalidRequest(f"queue {queue} of {topic!r}: an open link cannot be retired")
        if link.physical_end > max(low, offloaded):
            first = max(offloaded, low, link.physical_start) - link.physical_start
            raise InvalidRequest(
                f"queue {queue} of {topic!r}: logical offsets from {link.logical_start + first}"
                " are on this broker's disk only, not in the object store yet (topic config "
                f"remote.storage.enable=true, then `tidemq tier offload {topic}`)"
            )
    groups = unfinished(topic, queue, links[-1].physical_end)
    if groups:
        raise InvalidRequest(
            f"queue {queue} of {topic!r}: pop group(s) {', '.join(groups)} have not finished "
            "the messages of this broker's links; nobody would pop them after it leaves"
        )


class RetiredLinks:
    """The write end's broker expires the links of brokers that have left."""

    def __init__(
        self,
        broker: str,
        store: Callable[[], MessageStore],
        topics: TopicTable,
        clock: Clock,
        register_now: Callable[[], Awaitable[None]],
    ) -> None:
        self._me = broker
        self._store = store
        self._topics = topics
        self._clock = clock
        self._register_now = register_now
        self.tier: TierService | None = None

    async def expire(self) -> int:
        """Drop the leading retired links of the queues written here whose last message
        is past the topic's `retention.ms`: their files first, then the links. Returns
        how many links were dropped."""
        if self.tier is None:
            return 0
        store = self._store()
        now = self._clock.now_ms()
        dropped = 0
        for info in self._topics.all():
            if not self._topics.is_static(info.name):
                continue
            retention_ms = info.retention_ms
            if retention_ms is None:
                retention_ms = store.config.retention_ms
            if retention_ms < 0:
                continue
            for chain in store.static.of_topic(info.id).values():
                end = chain.write_end
                if end is None or end.broker != self._me:
                    continue
                n = 0
                for link in chain.links[:-1]:
                    if not link.tiered or link.sealed_ms + retention_ms >= now:
                        break
                    n += 1
                if n and await self._drop(info.name, chain, n):
                    dropped += n
        if dropped:
            await self._register_now()
        return dropped

    async def _drop(self, topic: str, chain: QueueChain, n: int) -> bool:
        """Delete the files of `chain`'s first `n` links, then drop the links; False
        when the chain changed meanwhile (the next run looks again)."""
        assert self.tier is not None
        rest = chain.links[n:]
        for broker in sorted({link.broker for link in chain.links[:n]}):
            later = [link for link in rest if link.broker == broker]
            below = later[0].physical_start if later else None
            await self.tier.links.drop_through(topic, chain.queue, broker, below)
        # The chain may have changed while the files went (a remap): only a chain still
        # starting with those links loses them.
        store = self._store()
        have = store.static_chain(topic, chain.queue)
        if have is None or have.links[:n] != chain.links[:n]:
            return False
        pruned = msgspec.structs.replace(have, links=have.links[n:], pruned=have.pruned + n)
        writable = store.static_writable(topic, chain.queue)
        store.set_static_chain(topic, chain.queue, pruned, writable=writable)
        log.info(
            "static topic %s queue %d: %d link(s) of brokers that left expired; it now "
            "starts at logical offset %d",
            topic,
            chain.queue,
            n,
            pruned.links[0].logical_start,
        )
        return True
