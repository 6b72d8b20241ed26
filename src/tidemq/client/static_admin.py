"""Creating and remapping static topics (docs/design/static-topics.md).

A remap moves the write end of logical queues to other brokers without moving data: for
each queue, seal the old write end (STATIC_SEAL, epoch + 1, naming the target), then open
the new link on the target where the sealed one ended (STATIC_OPEN), then tell the other
holders of the queue's links the finished chain (STATIC_UPDATE, best effort), and move
the delayed messages still pending on the sealed side to the new write end
(`static_timers`). Queues switch concurrently. A remap that failed half-way leaves chains
sealed toward a target: `repair` finishes them (every step is idempotent); it never rolls
back, because the target may have opened and taken writes already.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from tidemq.client.cluster import ClusterClient, RouteTable
from tidemq.client.static_timers import hand_over_delayed
from tidemq.core import limits
from tidemq.core.errors import (
    BrokerNotAvailable,
    ConfigError,
    InvalidRequest,
    TidemqError,
    TopicAlreadyExists,
)
from tidemq.core.static_chain import Link, QueueChain, plan_remap
from tidemq.protocol.commands import DescribeTopicRequest, TopicInfoMsg
from tidemq.protocol.static_messages import (
    StaticChainsResponse,
    StaticOpenRequest,
    StaticSealRequest,
    StaticUpdateRequest,
)

__all__ = [
    "QueueSwitch",
    "RemapReport",
    "create_static",
    "remap",
    "repair",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class QueueSwitch:
    """One queue's write end moved: from `source` to `target`, whose link starts at
    logical offset `at` (where the sealed link ended)."""

    queue: int
    source: str
    target: str
    at: int
    #: Batches of delayed messages handed over from the sealed side to the new write end.
    delayed: int = 0


@dataclass(frozen=True, slots=True)
class RemapReport:
    topic: str
    switches: tuple[QueueSwitch, ...]
    #: Epoch of the chains after the remap (the largest, when queues differ).
    epoch: int
    elapsed_ms: float


def _live(routes: RouteTable, names: list[str], what: str) -> list[str]:
    unknown = sorted(set(names) - set(routes.brokers))
    if unknown:
        raise ConfigError(
            f"{what}: no live broker named {', '.join(unknown)} (live: "
            f"{', '.join(sorted(routes.brokers)) or 'none'})"
        )
    return sorted(set(names))


async def create_static(
    cluster: ClusterClient,
    name: str,
    queues: int,
    *,
    message_type: str,
    config: Mapping[str, str],
    brokers: list[str] | None,
) -> list[QueueChain]:
    """Create static topic `name`: queue q's first link on the q-th chosen broker (round
    robin over `brokers`, default every live broker), all at epoch 1."""
    if not 1 <= queues <= limits.MAX_QUEUES_PER_TOPIC:
        raise ConfigError(f"queues must be 1..{limits.MAX_QUEUES_PER_TOPIC}, got {queues}")
    routes = await cluster.refresh_routes(force=True)
    if name in routes:
        raise TopicAlreadyExists(f"topic {name!r} exists already")
    chosen = _live(routes, brokers if brokers is not None else list(routes.brokers), "brokers")
    if not chosen:
        raise BrokerNotAvailable("no live broker is registered with the name server")
    plan: dict[str, list[QueueChain]] = {}
    for q in range(queues):
        broker = chosen[q % len(chosen)]
        link = Link(broker=broker, logical_start=0, physical_start=-1)
        plan.setdefault(broker, []).append(QueueChain(queue=q, epoch=1, links=(link,)))

    async def open_on(broker: str, chains: list[QueueChain]) -> list[QueueChain]:
        request = StaticOpenRequest(
            topic=name,
            queues=queues,
            message_type=message_type,
            config=dict(config),
            chains=chains,
        )
        answer = await cluster.call(routes.brokers[broker], request, StaticChainsResponse)
        return answer.chains

    try:
        answers = await asyncio.gather(*(open_on(b, c) for b, c in plan.items()))
    finally:
        await cluster.refresh_routes(force=True)
    return sorted((c for part in answers for c in part), key=lambda c: c.queue)


async def _current(cluster: ClusterClient, name: str) -> tuple[RouteTable, list[QueueChain]]:
    routes = await cluster.topic_routes(name)
    if not routes.is_static(name):
        raise InvalidRequest(
            f"topic {name!r} is not static: only static topics are remapped (create one "
            "with --static)"
        )
    chains = [routes.chain(name, q) for q in range(routes.queue_count(name))]
    missing = [q for q, c in enumerate(chains) if c is None]
    if missing:
        raise BrokerNotAvailable(
            f"the chains of queues {missing} of {name!r} are not known: every broker "
            "holding them is away"
        )
    return routes, [c for c in chains if c is not None]


async def remap(
    cluster: ClusterClient,
    name: str,
    *,
    brokers: list[str] | None = None,
    queue: int | None = None,
    to: str | None = None,
) -> RemapReport:
    """Move write ends: all queues spread over `brokers`, or one `queue` to broker `to`."""
    started = time.monotonic()
    if (brokers is None) == (queue is None):
        raise InvalidRequest("remap takes either brokers, or a queue and the broker to move to")
    routes, chains = await _current(cluster, name)
    pending = {c.queue: c.target for c in chains if c.write_end is None}
    if pending:
        raise InvalidRequest(
            f"topic {name!r} has queues mid-switch {pending} (queue: target); finish them "
            f"with `tidemq topic remap {name} --repair`"
        )
    ends = {c.queue: c.write_end.broker for c in chains if c.write_end is not None}
    if queue is not None:
        if not 0 <= queue < len(chains):
            raise InvalidRequest(f"topic {name!r} has {len(chains)} queues, no queue {queue}")
        if not to:
            raise InvalidRequest("moving one queue needs the broker to move it to")
        _live(routes, [to], "target")
        if ends[queue] == to:
            raise InvalidRequest(f"broker {to} holds the write end of queue {queue} already")
        moves = {queue: to}
    else:
        assert brokers is not None
        moves = plan_remap(ends, _live(routes, brokers, "brokers"))
    away = sorted({ends[q] for q in moves} - set(routes.brokers))
    if away:
        raise BrokerNotAvailable(
            f"broker {', '.join(away)} holds write ends to move but is not live: a write end "
            "is sealed by its own broker before another may open"
        )
    config = await _topic_config(cluster, routes, name, ends[min(moves)] if moves else "")
    switch = _Switch(cluster, routes, name, len(chains), config)
    results = await asyncio.gather(
        *(switch.move(chains[q], to) for q, to in sorted(moves.items())), return_exceptions=True
    )
    await cluster.refresh_routes(force=True)
    return _report(name, chains, results, started)


async def repair(cluster: ClusterClient, name: str) -> RemapReport:
    """Finish every switch left half-way (sealed, not opened) and tell every holder of a
    queue's links its newest chain. Needs each pending switch's target live."""
    started = time.monotonic()
    routes, chains = await _current(cluster, name)
    pending = [c for c in chains if c.write_end is None]
    away = sorted({c.target for c in pending} - set(routes.brokers))
    if away:
        raise BrokerNotAvailable(
            f"switches of {name!r} wait for broker {', '.join(away)} to open their write "
            "ends; start it again, then repair"
        )
    config = await _topic_config(cluster, routes, name, "")
    switch = _Switch(cluster, routes, name, len(chains), config)
    results: list[QueueSwitch | BaseException] = []
    for chain in chains:
        try:
            if chain.write_end is None:
                results.append(await switch.open(chain))
            else:
                await switch.inform(chain)
                await hand_over_delayed(cluster, routes, name, chain)
        except TidemqError as exc:
            results.append(exc)
    await cluster.refresh_routes(force=True)
    return _report(name, chains, results, started)


def _report(
    name: str,
    chains: list[QueueChain],
    results: list[QueueSwitch | BaseException],
    started: float,
) -> RemapReport:
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        first = failures[0]
        raise (
            type(first)(
                f"{len(failures)} queue switch(es) of {name!r} failed ({first}); what was sealed "
                f"is finished by `tidemq topic remap {name} --repair`"
            )
            if isinstance(first, TidemqError)
            else first
        )
    switches = tuple(r for r in results if isinstance(r, QueueSwitch))
    epoch = max(c.epoch for c in chains) + (1 if switches else 0)
    return RemapReport(name, switches, epoch, (time.monotonic() - started) * 1000)


async def _topic_config(
    cluster: ClusterClient, routes: RouteTable, name: str, broker: str
) -> dict[str, str]:
    """The topic's user configs (retention, ...), for the brokers that receive links."""
    address = routes.brokers.get(broker) or next(
        (routes.broker_for(name, q) for q in routes.queues(name)), None
    )
    if address is None:
        return {}
    info = await cluster.call(address, DescribeTopicRequest(name=name), TopicInfoMsg)
    return {k: v for k, v in info.config.items() if not k.startswith("tidemq.")}


class _Switch:
    def __init__(
        self,
        cluster: ClusterClient,
        routes: RouteTable,
        topic: str,
        queues: int,
        config: dict[str, str],
    ) -> None:
        self._cluster = cluster
        self._routes = routes
        self._topic = topic
        self._queues = queues
        self._config = config

    def _address(self, broker: str) -> str:
        address = self._routes.brokers.get(broker)
        if address is None:
            raise BrokerNotAvailable(f"broker {broker} is not live")
        return address

    async def move(self, chain: QueueChain, to: str) -> QueueSwitch:
        end = chain.write_end
        assert end is not None
        request = StaticSealRequest(
            topic=self._topic, queue=chain.queue, epoch=chain.epoch + 1, target=to, chain=chain
        )
        # One try: a failure is reported and finished by repair, never guessed at.
        answer, _ = await self._cluster.request(
            self._address(end.broker), request, StaticChainsResponse
        )
        return await self.open(answer.chains[0])

    async def open(self, sealed: QueueChain) -> QueueSwitch:
        """Open the link a sealed chain names as its target, then tell the other holders."""
        start = sealed.logical_end
        assert start is not None
        assert sealed.target
        link = Link(broker=sealed.target, logical_start=start, physical_start=-1)
        chain = msgspec.structs.replace(sealed, links=(*sealed.links, link), target="")
        request = StaticOpenRequest(
            topic=self._topic,
            queues=self._queues,
            message_type=self._routes.message_type(self._topic),
            config=self._config,
            chains=[chain],
        )
        answer, _ = await self._cluster.request(
            self._address(sealed.target), request, StaticChainsResponse
        )
        opened = answer.chains[0]
        await self.inform(opened)
        delayed = await hand_over_delayed(self._cluster, self._routes, self._topic, opened)
        return QueueSwitch(sealed.queue, sealed.links[-1].broker, sealed.target, start, delayed)

    async def inform(self, chain: QueueChain) -> None:
        """Best effort: the brokers holding sealed links learn the newest chain (the name
        server takes the newest anyway; this keeps describe right when the writer is away)."""
        end = chain.write_end
        holders = {link.broker for link in chain.links} - {end.broker if end else ""}
        for broker in sorted(holders):
            address = self._routes.brokers.get(broker)
            if address is None:
                continue
            request = StaticUpdateRequest(topic=self._topic, chains=[chain])
            try:
                await self._cluster.request(address, request, StaticChainsResponse)
            except TidemqError as exc:
                log.warning("telling %s the chain of queue %d failed: %s", broker, chain.queue, exc)
