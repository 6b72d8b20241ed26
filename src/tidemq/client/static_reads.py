"""Offsets of a static topic's queue, which spans the brokers of its chain's links
(`tidemq.core.static_chain`): the range runs from the first link's oldest readable
message to the write end, and a time is looked up link by link, oldest first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidemq.core.errors import BrokerNotAvailable
from tidemq.core.static_chain import Link, QueueChain
from tidemq.protocol.commands import ListOffsetsRequest, ListOffsetsResponse

if TYPE_CHECKING:
    from tidemq.client.cluster import ClusterClient

__all__ = ["static_list_offsets"]


async def static_list_offsets(
    cluster: ClusterClient, chain: QueueChain, topic: str, timestamp_ms: int | None
) -> ListOffsetsResponse:
    async def ask(link: Link, at: int | None) -> ListOffsetsResponse:
        address = cluster.routes.brokers.get(link.broker)
        if address is None and not link.is_open:
            # Away: the write end's broker answers for a sealed link from the tier.
            address = cluster.routes.broker_for(topic, chain.queue)
        if address is None:
            raise BrokerNotAvailable(
                f"broker {link.broker}, holding offsets from {link.logical_start} of "
                f"{topic}/{chain.queue}, is not live"
            )
        request = ListOffsetsRequest(topic=topic, queue=chain.queue, timestamp_ms=at)
        return await cluster.call(address, request, ListOffsetsResponse)

    first, last = chain.links[0], chain.links[-1]
    low = (await ask(first, None)).min_offset
    if last.is_open:
        high = (await ask(last, None)).max_offset
    else:
        high = chain.logical_end or last.logical_start  # a switch in progress
    found = None
    if timestamp_ms is not None:
        found = high
        for link in chain.links:
            at = (await ask(link, timestamp_ms)).offset_for_time
            end = link.logical_end
            if at is not None and (end is None or at < end):
                found = at
                break
        found = min(max(found, low), high)
    return ListOffsetsResponse(min_offset=low, max_offset=high, offset_for_time=found)
