"""Reads of static topics' links held by other brokers, from the object store (tiered
storage, `broker/tier_links.py`): a fetch of such a link, and the bounds and lookups by
time that must cover those links when their broker is down or has left."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidemq.broker.static_view import LinkView
from tidemq.broker.store_gateway import StoreGateway
from tidemq.core.errors import QueueMoved
from tidemq.core.static_chain import Link
from tidemq.net.budget import ConnectionBudget
from tidemq.protocol.commands import FetchRequest, ListOffsetsRequest
from tidemq.store.message_store import ReadResult, ReadStatus
from tidemq.store.metadata import TopicInfo

if TYPE_CHECKING:
    from tidemq.broker.tier_service import TierService

__all__ = ["foreign_bounds", "read_link"]


async def read_link(
    tier: TierService,
    gateway: StoreGateway,
    req: FetchRequest,
    *,
    info: TopicInfo,
    link: Link,
    tag_mask: int,
    budget: ConnectionBudget | None,
) -> tuple[ReadResult, int]:
    """The read of another broker's sealed `link` at `req.offset` (logical) from its files
    in the object store, in that link's physical offsets with this broker's bounds, and
    that broker's first offset still in the bucket. QueueMoved when the bucket does not
    hold the offset (only its broker can serve it)."""
    physical = link.physical_start + req.offset - link.logical_start
    max_bytes = req.max_bytes if budget is None else await budget.acquire(req.max_bytes)
    got = await tier.links.read(
        req.topic,
        topic_id=info.id,
        queue=req.queue,
        link=link,
        physical=physical,
        max_bytes=max_bytes,
        tag_mask=tag_mask,
    )
    if got is None:
        if budget is not None:
            budget.release()
        raise QueueMoved(
            f"offset {req.offset} of queue {req.queue} of {req.topic!r} is held by broker "
            f"{link.broker}, and not in the object store yet; refresh the routes"
        )
    if budget is not None:
        budget.hold(sum(len(b.record) for b in got.batches))
    lo, hi = await gateway.call(lambda s: s.queue_bounds(req.topic, req.queue))
    status = ReadStatus.FOUND if got.batches else ReadStatus.NO_NEW_MESSAGE
    if physical < got.log_start:
        status = ReadStatus.OFFSET_OUT_OF_RANGE
    return ReadResult(status, got.batches, got.next_offset, lo, hi), got.log_start


async def foreign_bounds(
    tier: TierService, req: ListOffsetsRequest, view: LinkView, low: int
) -> tuple[int, int | None]:
    """The chain's start where it begins with another broker's sealed link (that
    broker's first offset still in the bucket), and the logical offset for the time found
    in the other brokers' offloaded links before this broker's first (None: not there).
    Such links are read from the bucket when their broker is down or gone, so this
    broker's answer must cover them too."""
    links = tier.links
    first = view.chain.links[0]
    if first.broker != view.broker and first.logical_end is not None:
        manifest = await links.manifest(first.broker, req.topic, req.queue)
        if manifest is not None and low == first.logical_start:
            start = first.logical_start + max(manifest.log_start - first.physical_start, 0)
            low = min(start, first.logical_end)
    if req.timestamp_ms is None:
        return low, None
    for link in view.chain.links:
        if link.broker == view.broker or link.is_open:
            break
        found = await links.offset_for_time(req.topic, req.queue, link, req.timestamp_ms)
        if found is not None:
            return low, link.logical_start + found - link.physical_start
        if await links.covered(req.topic, req.queue, link) is None:
            break  # not all in the bucket: its broker answers for it
    return low, None
