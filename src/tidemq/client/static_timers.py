"""Handing a static queue's pending delayed messages over to its write end.

A delayed send is scheduled on the broker holding the queue's write end; once a remap
seals that queue there, the broker can no longer deliver it, so every remap (and
`repair`) ends by moving such batches to the new write end, page by page: reserve a page
on the holder (STATIC_TIMERS_TAKE), schedule it on the write end (STATIC_TIMERS_ADOPT),
drop it on the holder (STATIC_TIMERS_HANDED). Each step can be repeated after a failure:
the holder answers the same reserved page until it is handed, the adopter skips what it
adopted already (docs/design/static-topics.md, "Delayed messages").
"""

from __future__ import annotations

import logging
from typing import Final

from tidemq.client.cluster import ClusterClient, RouteTable
from tidemq.core.errors import BrokerNotAvailable
from tidemq.core.static_chain import QueueChain
from tidemq.protocol.static_messages import (
    StaticTimersAdoptRequest,
    StaticTimersAdoptResponse,
    StaticTimersHandedRequest,
    StaticTimersHandedResponse,
    StaticTimersPage,
    StaticTimersTakeRequest,
)

__all__ = ["hand_over_delayed"]

log = logging.getLogger(__name__)

#: Bytes of delayed messages per page handed over.
PAGE_BYTES: Final = 1 << 20


async def hand_over_delayed(
    cluster: ClusterClient, routes: RouteTable, topic: str, chain: QueueChain
) -> int:
    """Move the delayed batches of `chain`'s queue pending on the brokers of its links to
    its write end; returns how many batches moved. A holder that is not live keeps its
    batches (a later repair moves them); a page reserved earlier for another broker goes
    there, and that broker's batches are moved on in a later round."""
    end = chain.write_end
    if end is None:
        return 0  # mid-switch: the repair that opens it hands them over
    holders = list(dict.fromkeys(link.broker for link in chain.links))
    moved = 0
    # Each round empties every live holder; another round runs only when a page went to a
    # holder other than the write end. Bounded: such pages exist only from earlier remaps.
    for _ in range(len(holders) + 1):
        round_moved = 0
        for holder in holders:
            round_moved += await _drain(
                cluster, routes, topic, chain.queue, holder=holder, dest=end.broker
            )
        moved += round_moved
        if not round_moved:
            break
    return moved


async def _drain(
    cluster: ClusterClient, routes: RouteTable, topic: str, queue: int, *, holder: str, dest: str
) -> int:
    address = routes.brokers.get(holder)
    if address is None:
        log.warning(
            "broker %s is not live: delayed messages of %s queue %d it may hold wait for a repair",
            holder,
            topic,
            queue,
        )
        return 0
    moved = 0
    while True:  # each page moves at least one batch off the holder
        take = StaticTimersTakeRequest(topic=topic, queue=queue, dest=dest, max_bytes=PAGE_BYTES)
        page, _ = await cluster.request(address, take, StaticTimersPage)
        if page.through < 0:
            return moved
        target = routes.brokers.get(page.dest)
        if target is None:
            raise BrokerNotAvailable(
                f"delayed messages of {topic} queue {queue} on {holder} are reserved for "
                f"broker {page.dest}, which is not live; repair once it is back"
            )
        adopt = StaticTimersAdoptRequest(
            topic=topic, queue=queue, source=holder, timers=page.timers
        )
        await cluster.request(target, adopt, StaticTimersAdoptResponse)
        handed = StaticTimersHandedRequest(topic=topic, queue=queue, through=page.through)
        await cluster.request(address, handed, StaticTimersHandedResponse)
        moved += len(page.timers)
