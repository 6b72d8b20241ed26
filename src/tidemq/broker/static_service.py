"""A broker's side of static topics: open links, seal its write end, learn newer chains
(STATIC_OPEN, STATIC_SEAL, STATIC_UPDATE), hand delayed messages of a sealed queue over
(STATIC_TIMERS_*, `timer_handover`), prune expired links, and give the data handlers each
static queue's view (`static_view.LinkView`: logical offsets over this broker's physical
queue).

The switch protocol (docs/design/static-topics.md): the admin seals the write end on the
old broker (epoch + 1, target named), which refuses appends from that moment, makes its
queue durable and stores the sealed chain; then it opens the new link on the target with
that chain plus one open link starting at the sealed logical end. Both requests are
idempotent, so a switch that failed half-way is finished by repeating them
(`tidemq topic remap --repair`). A queue never has two writable links: the target opens
only a chain whose previous link is sealed, and a broker's write end is fenced by the
epoch (a seal must name the next epoch, an open must be newer than what the broker has).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec

from tidemq.broker.static_pop import StaticFifoPop
from tidemq.broker.static_retire import RetiredLinks, check_retire
from tidemq.broker.static_view import LinkView, own_links
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.timer_service import TimerService
from tidemq.broker.topics import TopicTable, check_user_topic
from tidemq.broker.transaction_service import TransactionService
from tidemq.core.clock import Clock
from tidemq.core.errors import (
    InvalidRequest,
    QueueMoved,
    RequestTimeout,
    TopicAlreadyExists,
    TopicNotFound,
)
from tidemq.core.static_chain import (
    Link,
    QueueChain,
    check_chain,
)
from tidemq.protocol.static_messages import (
    StaticChainsResponse,
    StaticOpenRequest,
    StaticSealRequest,
    StaticTimersAdoptRequest,
    StaticTimersAdoptResponse,
    StaticTimersHandedRequest,
    StaticTimersHandedResponse,
    StaticTimersPage,
    StaticTimersTakeRequest,
    StaticUpdateRequest,
)
from tidemq.store.message_store import MessageStore
from tidemq.store.metadata import TopicInfo

__all__ = ["SEAL_TRANSACTIONS_WAIT_S", "StaticService"]


log = logging.getLogger(__name__)

#: How long a seal waits for the transactions holding batches for its queue (they
#: publish there when committed) before it gives up, sealing nothing.
SEAL_TRANSACTIONS_WAIT_S: Final = 10.0


class StaticService:
    def __init__(
        self,
        broker_name: str,
        gateway: StoreGateway,
        topics: TopicTable,
        clock: Clock,
        *,
        transactions: TransactionService,
        timers: TimerService,
        register_now: Callable[[], Awaitable[None]],
        pop_unfinished: Callable[[str, int, int], list[str]],
    ) -> None:
        """`register_now`: registers this broker with its name servers and returns when
        they have the registration, so a remap's answer means the routes show it;
        `pop_unfinished(topic, queue, below)`: the pop groups with messages below `below`
        not finished yet."""
        self._me = broker_name
        self._register_now = register_now
        self._gateway = gateway
        self._topics = topics
        self._clock = clock
        self._transactions = transactions
        self._timers = timers
        #: FIFO pop consumption across links (`static_pop`).
        self.fifo = StaticFifoPop(broker_name, lambda: gateway.store, topics)
        #: Queues being sealed: new sends are refused (QueueMoved) while the seal waits
        #: for the transactions that will publish to them.
        self.sealing: set[tuple[str, int]] = set()
        self._pop_unfinished = pop_unfinished
        #: Links of brokers that left, expired by the write end's broker (needs the tier:
        #: the broker sets `retired.tier`).
        self.retired = RetiredLinks(broker_name, lambda: gateway.store, topics, clock, register_now)

    @property
    def _store(self) -> MessageStore:
        return self._gateway.store

    def view(self, topic: str, queue: int) -> LinkView | None:
        """The chain view of a static queue (None for a queue of an ordinary topic)."""
        if not self._topics.is_static(topic):
            return None
        chain = self._store.static_chain(topic, queue)
        if chain is None:
            raise QueueMoved(f"queue {queue} of static topic {topic!r} has no link here")
        return LinkView(chain, self._me)

    def logical_offset(self, topic: str, queue: int, physical: int) -> int:
        """`physical` as clients know it: its logical offset on a static queue."""
        view = self.view(topic, queue) if self._topics.is_static(topic) else None
        return physical if view is None else view.logical(physical)

    async def prune_expired(self) -> int:
        """After retention: drop from each static chain its leading links that are this
        broker's, sealed, and entirely expired here (a chain's start moves on without
        them, and this broker stops being named for data it no longer has). Returns how
        many links were dropped."""
        store = self._store
        dropped = 0
        for info in self._topics.all():
            if not self._topics.is_static(info.name):
                continue
            for queue, chain in store.static.of_topic(info.id).items():
                low = store.queue_bounds(info.name, queue)[0]
                n = 0
                if self._timers.holding(info.name, queue):
                    continue  # its delayed messages wait here to be handed over
                for link in chain.links[:-1]:  # never the last link
                    if link.broker != self._me or link.is_open or link.physical_end > low:
                        break
                    n += 1
                if n:
                    pruned = msgspec.structs.replace(
                        chain, links=chain.links[n:], pruned=chain.pruned + n
                    )
                    writable = store.static_writable(info.name, queue)
                    store.set_static_chain(info.name, queue, pruned, writable=writable)
                    dropped += n
                    log.info(
                        "static topic %s queue %d: %d expired link(s) pruned; it now starts "
                        "at logical offset %d",
                        info.name,
                        queue,
                        n,
                        pruned.links[0].logical_start,
                    )
        if dropped:
            await self._register_now()  # the routes show it when this returns
        return dropped + await self.retired.expire()

    def chains(self, topic: str) -> list[QueueChain]:
        info = self._topics.get(topic)
        found = self._store.static.of_topic(info.id)
        return [found[q] for q in sorted(found)]

    # ------------------------------------------------------------------ requests

    async def open(self, req: StaticOpenRequest) -> StaticChainsResponse:
        check_user_topic(req.topic)
        if not req.chains or len({c.queue for c in req.chains}) != len(req.chains):
            raise InvalidRequest("STATIC_OPEN needs one chain per queue to open, at least one")
        for chain in req.chains:
            end = chain.write_end
            if end is None or end.broker != self._me:
                raise InvalidRequest(
                    f"chain of queue {chain.queue}: its last link must be open on {self._me}"
                )
            check_chain(_with_start(chain, 0), req.queues)
        await self._ensure_topic(req)
        opened = [self._open_one(req.topic, chain) for chain in req.chains]
        for chain in opened:
            self._timers.unpark(req.topic, chain.queue)  # back here: deliver them here
        await self._register_now()
        return StaticChainsResponse(chains=opened)

    async def _ensure_topic(self, req: StaticOpenRequest) -> None:
        queues = sorted(c.queue for c in req.chains)
        try:
            info: TopicInfo | None = self._topics.get(req.topic)
        except TopicNotFound:
            info = None
        if info is None:
            try:
                await self._topics.create(
                    req.topic,
                    req.queues,
                    message_type=req.message_type,
                    config=dict(req.config),
                    hosted=queues,
                    static=True,
                )
                return
            except TopicAlreadyExists:
                info = self._topics.get(req.topic)
        if not self._topics.is_static(req.topic):
            raise TopicAlreadyExists(f"topic {req.topic!r} exists on {self._me} and is not static")
        if info.queues != req.queues:
            raise InvalidRequest(
                f"static topic {req.topic!r} has {info.queues} queues here, not {req.queues}"
            )
        hosted = sorted(set(self._topics.hosted(req.topic)) | set(queues))
        if hosted != self._topics.hosted(req.topic):
            await self._topics.alter(req.topic, queues=None, config={}, hosted=hosted)

    def _open_one(self, topic: str, chain: QueueChain) -> QueueChain:
        store = self._store
        have = store.static_chain(topic, chain.queue)
        if have is not None:
            end = have.write_end
            if have.version == chain.version and end is not None and end.broker == self._me:
                return have  # opened already: a repeated request
            if have.version >= chain.version:
                raise InvalidRequest(
                    f"queue {chain.queue} of {topic!r}: this broker has chain epoch "
                    f"{have.epoch} with {len(have.links)} links, newer than the one to open"
                )
            if have.write_end is not None and have.write_end.broker == self._me:
                raise InvalidRequest(
                    f"queue {chain.queue} of {topic!r} is writable here already; seal it first"
                )
        start = store.queue_bounds(topic, chain.queue)[1]
        opened = _with_start(chain, start, opened_ms=self._clock.now_ms())
        store.set_static_chain(topic, chain.queue, opened, writable=True)
        log.info(
            "static topic %s queue %d: write end opened here at logical %d (epoch %d)",
            topic,
            chain.queue,
            opened.links[-1].logical_start,
            opened.epoch,
        )
        return opened

    async def seal(self, req: StaticSealRequest) -> StaticChainsResponse:
        store = self._store
        self._topics.get(req.topic)
        have = store.static_chain(req.topic, req.queue)
        if have is None:
            raise QueueMoved(f"queue {req.queue} of {req.topic!r} has no link here")
        if have.epoch == req.epoch and have.target == req.target and have.write_end is None:
            return StaticChainsResponse(chains=[have])  # sealed already: a repeated request
        end = have.write_end
        if end is None or end.broker != self._me:
            raise QueueMoved(
                f"queue {req.queue} of {req.topic!r}: this broker does not hold its write end"
            )
        if req.epoch != have.epoch + 1:
            raise InvalidRequest(
                f"queue {req.queue} of {req.topic!r} is at epoch {have.epoch}; a seal must "
                f"name epoch {have.epoch + 1}, got {req.epoch} (another remap ran meanwhile?)"
            )
        if not req.target or req.target == self._me:
            raise InvalidRequest("a seal must name another broker as its target")
        given = req.chain
        if (
            given is not None
            and given.queue == req.queue
            and given.epoch == have.epoch
            and given.write_end == end
            and given.version > have.version
        ):
            check_chain(given, self._topics.get(req.topic).queues)
            have = given  # pruned elsewhere since this broker stored its chain
        key = (req.topic, req.queue)
        self.sealing.add(key)
        try:
            return await self._seal(req, have, end)
        finally:
            self.sealing.discard(key)

    async def _seal(
        self, req: StaticSealRequest, have: QueueChain, end: Link
    ) -> StaticChainsResponse:
        # A committed transaction publishes to the queue here: let those that hold
        # batches for it end first (no new ones start: sends are refused meanwhile).
        held = await self._transactions.wait_none_holding(
            req.topic, req.queue, SEAL_TRANSACTIONS_WAIT_S
        )
        if held:
            raise RequestTimeout(
                f"queue {req.queue} of {req.topic!r} has {held} transaction(s) on {self._me} "
                f"still open after {SEAL_TRANSACTIONS_WAIT_S:g} s; nothing was sealed, try "
                "the remap again when they have ended"
            )
        now = self._clock.now_ms()

        def sealed(physical_end: int) -> QueueChain:
            last = msgspec.structs.replace(end, physical_end=physical_end, sealed_ms=now)
            return msgspec.structs.replace(
                have, epoch=req.epoch, target=req.target, links=(*have.links[:-1], last)
            )

        chain = await self._gateway.call(
            lambda s: s.seal_static_queue(req.topic, req.queue, sealed)
        )
        log.info(
            "static topic %s queue %d: sealed here at logical %s (epoch %d, next on %s)",
            req.topic,
            req.queue,
            chain.logical_end,
            chain.epoch,
            req.target,
        )
        await self._register_now()
        return StaticChainsResponse(chains=[chain])

    def _check_own_links(self, topic: str, have: QueueChain, chain: QueueChain) -> None:
        """A newer chain may change this broker's links only by dropping leading sealed
        ones whose data has expired here (pruning); opening and sealing have their own
        requests."""
        mine, theirs = own_links(have, self._me), own_links(chain, self._me)
        dropped = mine[: len(mine) - len(theirs)]
        kept = mine[len(dropped) :]
        plain = [msgspec.structs.replace(link, tiered=False) for link in theirs]
        if [msgspec.structs.replace(link, tiered=False) for link in kept] != plain or any(
            a.tiered and not b.tiered for a, b in zip(kept, theirs, strict=True)
        ):
            raise InvalidRequest(
                f"queue {chain.queue} of {topic!r}: the chain changes this broker's own "
                "links (open and seal do that)"
            )
        retired = [b for a, b in zip(kept, theirs, strict=True) if b.tiered and not a.tiered]
        if retired:
            self._check_no_timers(topic, chain.queue)
            check_retire(self._store, topic, chain.queue, retired, self._pop_unfinished)
        low = self._store.queue_bounds(topic, chain.queue)[0]
        held = [link for link in dropped if link.is_open or link.physical_end > low]
        if dropped:
            self._check_no_timers(topic, chain.queue)
        if held:
            raise InvalidRequest(
                f"queue {chain.queue} of {topic!r}: {self._me} still holds readable data of "
                f"logical offsets from {held[0].logical_start} (retention has not removed "
                "it yet; with tiered storage, offloaded links are left in the object store)"
            )

    def _check_no_timers(self, topic: str, queue: int) -> None:
        waiting = self._timers.holding(topic, queue)
        if waiting:
            raise InvalidRequest(
                f"queue {queue} of {topic!r}: {self._me} holds {waiting} delayed "
                f"batch(es) not handed over to its write end yet; run `tidemq topic remap "
                f"{topic} --repair` first"
            )

    async def update(self, req: StaticUpdateRequest) -> StaticChainsResponse:
        info = self._topics.get(req.topic)
        store = self._store
        out = []
        for chain in req.chains:
            check_chain(chain, info.queues)
            have = store.static_chain(req.topic, chain.queue)
            if have is None:
                raise InvalidRequest(f"queue {chain.queue} of {req.topic!r} has no link here")
            if chain.version > have.version:
                self._check_own_links(req.topic, have, chain)
                writable = have.write_end is not None and chain.write_end == have.write_end
                store.set_static_chain(req.topic, chain.queue, chain, writable=writable)
                have = chain
            out.append(have)
        await self._register_now()
        return StaticChainsResponse(chains=out)

    # ------------------------------------------------------------------ delayed messages

    async def take_timers(self, req: StaticTimersTakeRequest) -> StaticTimersPage:
        self._own_queue(req.topic, req.queue)
        return await self._timers.take(req.topic, req.queue, req.dest, req.max_bytes)

    async def adopt_timers(self, req: StaticTimersAdoptRequest) -> StaticTimersAdoptResponse:
        self._own_queue(req.topic, req.queue)
        adopted, skipped = await self._timers.adopt(req.topic, req.queue, req.source, req.timers)
        return StaticTimersAdoptResponse(adopted=adopted, skipped=skipped)

    async def timers_handed(self, req: StaticTimersHandedRequest) -> StaticTimersHandedResponse:
        self._own_queue(req.topic, req.queue)
        dropped = await self._timers.handed(req.topic, req.queue, req.through)
        return StaticTimersHandedResponse(dropped=dropped)

    def _own_queue(self, topic: str, queue: int) -> None:
        if not self._topics.is_static(topic):
            self._topics.get(topic)  # TopicNotFound for an unknown topic
            raise InvalidRequest(f"topic {topic!r} is not static")
        if self._store.static_chain(topic, queue) is None:
            raise QueueMoved(f"queue {queue} of {topic!r} has no link here")


def _with_start(chain: QueueChain, physical_start: int, *, opened_ms: int = 0) -> QueueChain:
    """`chain` with its last (open) link starting at `physical_start` here."""
    last = chain.links[-1]
    filled = msgspec.structs.replace(
        last, physical_start=physical_start, opened_ms=opened_ms or last.opened_ms
    )
    return msgspec.structs.replace(chain, links=(*chain.links[:-1], filled), target="")
