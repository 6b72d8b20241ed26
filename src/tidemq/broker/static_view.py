"""A broker's view of a static queue's chain: logical <-> physical offsets of its own
links, the bounds it reports, and records rebased onto logical offsets (fetch and pop
answers). Pure: no I/O."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from tidemq.core.errors import InvalidRequest, QueueMoved
from tidemq.core.record import parse_header, rebase_record
from tidemq.core.static_chain import Link, QueueChain, link_for, to_logical
from tidemq.protocol.commands import PopReceiveResponse

__all__ = ["LinkView", "own_links", "rebase_popped"]


@dataclass(frozen=True, slots=True)
class LinkView:
    """One queue's chain as seen from this broker: logical <-> physical offsets."""

    chain: QueueChain
    broker: str

    @property
    def writable(self) -> bool:
        """Whether this broker holds the queue's write end."""
        end = self.chain.write_end
        return end is not None and end.broker == self.broker

    def physical(self, offset: int) -> tuple[Link, int]:
        """This broker's link holding logical `offset` and the physical offset there.
        Raises QueueMoved when another broker's link holds it (or none does yet)."""
        link = link_for(self.chain, offset)
        if link is None or link.broker != self.broker:
            where = f"broker {link.broker}" if link is not None else "no broker yet"
            raise QueueMoved(
                f"offset {offset} of queue {self.chain.queue} is held by {where} (chain "
                f"epoch {self.chain.epoch}); refresh the routes"
            )
        return link, link.physical_start + offset - link.logical_start

    def logical(self, physical: int) -> int:
        found = to_logical(self.chain, self.broker, physical)
        if found is None:
            raise InvalidRequest(f"physical offset {physical} is in no link of this broker")
        return found

    def bounds(self, lo: int, hi: int) -> tuple[int, int]:
        """The logical (min, max) to report for this broker's physical bounds [lo, hi):
        the min is the start of the first link still readable as far as this broker
        knows (another broker's link counts as readable from its start); the max is where
        this broker's part ends (the write end's next offset when it is here)."""
        own = own_links(self.chain, self.broker)
        if not own:
            first = self.chain.links[0]
            return first.logical_start, first.logical_start  # pruned away from here
        last = own[-1]
        high = last.logical_start + hi - last.physical_start if last.is_open else last.logical_end
        assert high is not None
        return self._low(lo), high

    def _low(self, lo: int) -> int:
        for link in self.chain.links:
            if link.broker != self.broker or lo <= link.physical_start:
                return link.logical_start
            if link.is_open or lo < link.physical_end:
                return link.logical_start + lo - link.physical_start
            # This own link's data has expired entirely: the next link.
        end = self.chain.logical_end
        return end if end is not None else self.chain.links[-1].logical_start

    def records(self, link: Link, records: Sequence[bytes | memoryview]) -> list[bytes]:
        """`records` read from `link`'s physical queue, cut at its end and rebased onto
        logical offsets (the header only; the payload is not touched)."""
        out: list[bytes] = []
        for record in records:
            base = parse_header(record).base_offset
            if not link.is_open and base >= link.physical_end:
                break  # the same physical queue's later link: not this one's
            out.append(rebase_record(record, link.logical_start + base - link.physical_start))
        return out


def own_links(chain: QueueChain, broker: str) -> list[Link]:
    return [link for link in chain.links if link.broker == broker]


def rebase_popped(
    response: PopReceiveResponse,
    body: bytes,
    view_of: Callable[[str, int], LinkView | None],
) -> tuple[PopReceiveResponse, bytes]:
    """A pop answer with the records and leased offsets of static queues in logical
    offsets (leases and handles stay physical: they never leave this broker's view)."""
    views = {(r.topic, r.queue): view_of(r.topic, r.queue) for r in response.records}
    if not any(views.values()):
        return response, body
    parts: list[bytes] = []
    pos = 0
    for rec in response.records:
        record = body[pos : pos + rec.size]
        pos += rec.size
        view = views[(rec.topic, rec.queue)]
        if view is not None:
            record = rebase_record(record, view.logical(parse_header(record).base_offset))
        parts.append(record)
    messages = []
    for m in response.messages:
        view = views.get((m.topic, m.queue)) or view_of(m.topic, m.queue)
        offset = m.offset if view is None else view.logical(m.offset)
        messages.append(msgspec.structs.replace(m, offset=offset))
    return msgspec.structs.replace(response, messages=messages), b"".join(parts)
