"""Static topics: each logical queue is a chain of links, physical queues on brokers.

A static topic has a fixed number of logical queues. Logical queue Q is stored as queue Q
of the topic on one or more brokers; each stretch of it on one broker is a *link* that
covers a range of logical offsets::

    link 0: broker-a  logical [0, 1200)     physical [0, 1200)     sealed
    link 1: broker-b  logical [1200, 1750)  physical [0, 550)      sealed
    link 2: broker-a  logical [1750, ...)   physical [1200, ...)   open (the write end)

* The links are dense: each starts at the logical offset where the previous one ended, so
  logical offsets are strictly increasing with no gap (RocketMQ's "seal the old, then open
  the new").
* Only the last link may be open (written); every other link is sealed (read-only) at the
  physical offset its queue had when it was sealed.
* A broker may hold several links of a queue (a queue that moved away and came back): its
  physical queue just goes on, so its links cover disjoint, increasing physical ranges.
* `epoch` grows by one at every switch of the write end; a chain is newer than another
  when its `version` (epoch, links ever opened, links pruned) is larger: a switch writes
  the sealed chain and the opened one under the same epoch, the opened one has one link
  more; pruning expired links from the front keeps the count of links ever opened.
* `target`: the last link was sealed toward this broker and the new link is not opened
  yet (a switch in progress, or one that failed half-way: `topic remap --repair` opens it).

Every broker stores the chains of the queues it holds links of; the name server gives
clients the newest chain of every queue. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

import msgspec

from tidemq.core.errors import InvalidRequest

__all__ = [
    "MAX_LINKS",
    "STATIC_KEY",
    "Link",
    "QueueChain",
    "check_chain",
    "decode_chain",
    "encode_chain",
    "link_for",
    "newest",
    "own_link_for_logical",
    "plan_remap",
    "prune_through",
    "retire",
    "to_logical",
]

#: Topic config key (internal) marking a static topic on a broker.
STATIC_KEY: Final = "tidemq.static"
#: Links one logical queue may have: a remap adds one; retention prunes expired ones.
MAX_LINKS: Final = 1024


class Link(msgspec.Struct, frozen=True, kw_only=True):
    """One stretch of a logical queue, on one broker."""

    broker: str
    logical_start: int
    physical_start: int
    #: Physical offset where the link was sealed (exclusive); -1 while it is open.
    physical_end: int = -1
    #: When it was opened and sealed (epoch ms; 0: not yet sealed).
    opened_ms: int = 0
    sealed_ms: int = 0
    #: The broker has left the cluster (`retire`); the link's data is read from the object
    #: store, from that broker's manifest, by any broker of the same tier.
    tiered: bool = False

    @property
    def is_open(self) -> bool:
        return self.physical_end < 0

    @property
    def logical_end(self) -> int | None:
        """The first logical offset after the link; None while it is open."""
        if self.physical_end < 0:
            return None
        return self.logical_start + self.physical_end - self.physical_start

    def holds_logical(self, offset: int) -> bool:
        end = self.logical_end
        return self.logical_start <= offset and (end is None or offset < end)

    def holds_physical(self, offset: int) -> bool:
        return self.physical_start <= offset and (self.is_open or offset < self.physical_end)


class QueueChain(msgspec.Struct, frozen=True, kw_only=True):
    queue: int
    epoch: int
    links: tuple[Link, ...]
    #: Sealed toward this broker, not opened there yet ("": no switch in progress).
    target: str = ""
    #: Links dropped from the front so far (their data had expired; `prune_through`).
    pruned: int = 0
    #: Times a broker's links were handed to the object store (`retire`).
    retired: int = 0

    @property
    def write_end(self) -> Link | None:
        last = self.links[-1] if self.links else None
        return last if last is not None and last.is_open else None

    @property
    def version(self) -> tuple[int, int, int, int]:
        """Newer chains compare larger: a switch raises the epoch; within one, the opened
        chain has a link more than the sealed one; pruning keeps the count of links ever
        opened and breaks the tie, as retiring does after it."""
        return (self.epoch, self.pruned + len(self.links), self.pruned, self.retired)

    @property
    def logical_end(self) -> int | None:
        """Where the sealed last link ended (the next link starts there); None if open."""
        return self.links[-1].logical_end if self.links else 0


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(QueueChain)


def encode_chain(chain: QueueChain) -> bytes:
    return _ENCODER.encode(chain)


def decode_chain(raw: bytes) -> QueueChain:
    return _DECODER.decode(raw)


def check_chain(chain: QueueChain, queues: int) -> None:
    """Raise InvalidRequest unless `chain` is well formed for a topic of `queues` queues:
    dense links, only the last one open, physical ranges that make sense."""
    where = f"chain of queue {chain.queue}"
    if not 0 <= chain.queue < queues:
        raise InvalidRequest(f"{where}: queue id outside [0, {queues})")
    if chain.epoch < 1:
        raise InvalidRequest(f"{where}: epoch must be >= 1, got {chain.epoch}")
    if not 1 <= len(chain.links) <= MAX_LINKS:
        raise InvalidRequest(f"{where}: 1..{MAX_LINKS} links, got {len(chain.links)}")
    if chain.links[0].logical_start < 0:
        raise InvalidRequest(f"{where}: logical offsets start at 0 or later")
    for n, link in enumerate(chain.links):
        last = n == len(chain.links) - 1
        if not link.broker:
            raise InvalidRequest(f"{where}: link {n} names no broker")
        if link.physical_start < 0:
            raise InvalidRequest(f"{where}: link {n} has no physical start")
        if link.is_open and not last:
            raise InvalidRequest(f"{where}: link {n} is open but is not the last link")
        if link.tiered and link.is_open:
            raise InvalidRequest(f"{where}: link {n} is open but marked as in the object store")
        if not link.is_open and link.physical_end < link.physical_start:
            raise InvalidRequest(f"{where}: link {n} ends before it starts")
        if n and link.logical_start != chain.links[n - 1].logical_end:
            raise InvalidRequest(
                f"{where}: link {n} starts at logical offset {link.logical_start}, not where "
                f"link {n - 1} ended ({chain.links[n - 1].logical_end})"
            )
    if chain.target and chain.write_end is not None:
        raise InvalidRequest(f"{where}: a switch target with an open last link")


def link_for(chain: QueueChain, offset: int) -> Link | None:
    """The link holding logical `offset`: the write end for offsets at or past its start,
    None for offsets past a sealed last link (a switch in progress) or before the chain."""
    for link in reversed(chain.links):
        if link.logical_start <= offset:
            return link if link.holds_logical(offset) else None
    return None


def own_link_for_logical(chain: QueueChain, broker: str, offset: int) -> Link | None:
    """The link of `broker` holding logical `offset`, if `broker` holds it."""
    link = link_for(chain, offset)
    return link if link is not None and link.broker == broker else None


def to_logical(chain: QueueChain, broker: str, physical: int) -> int | None:
    """The logical offset of `broker`'s physical `physical` in this queue: the own link
    whose physical range holds it, or the end of the own sealed link it ends exactly.
    None when no own link is there (the physical queue's own history before the chain)."""
    ended = None
    for link in chain.links:
        if link.broker != broker:
            continue
        if link.holds_physical(physical):
            return link.logical_start + physical - link.physical_start
        if physical == link.physical_end:
            ended = link.logical_end
    return ended


def newest(chains: Iterable[QueueChain]) -> dict[int, QueueChain]:
    """Per queue, the newest of `chains` (largest epoch, then most links)."""
    found: dict[int, QueueChain] = {}
    for chain in chains:
        have = found.get(chain.queue)
        if have is None or chain.version > have.version:
            found[chain.queue] = chain
    return found


def prune_through(chain: QueueChain, broker: str) -> QueueChain:
    """`chain` without its leading links up to and including `broker`'s last one (a broker
    leaving the cluster once their data has expired). Raises InvalidRequest when that
    would take the write end or a switch's target away."""
    own = [n for n, link in enumerate(chain.links) if link.broker == broker]
    if not own:
        return chain
    if chain.target == broker or chain.links[own[-1]].is_open or own[-1] == len(chain.links) - 1:
        raise InvalidRequest(
            f"queue {chain.queue}: broker {broker} holds its write end (or a switch to it "
            "is unfinished); remap the queue elsewhere first"
        )
    keep = chain.links[own[-1] + 1 :]
    return msgspec.structs.replace(chain, links=keep, pruned=chain.pruned + own[-1] + 1)


def retire(chain: QueueChain, broker: str) -> QueueChain:
    """`chain` with `broker`'s links marked as read from the object store (the broker
    leaves; its links are sealed and offloaded, which the broker itself checks). Raises
    InvalidRequest when it holds the write end or is a switch's target."""
    own = [n for n, link in enumerate(chain.links) if link.broker == broker and not link.tiered]
    if not own:
        return chain
    if chain.target == broker or chain.links[own[-1]].is_open:
        raise InvalidRequest(
            f"queue {chain.queue}: broker {broker} holds its write end (or a switch to it "
            "is unfinished); remap the queue elsewhere first"
        )
    links = tuple(
        msgspec.structs.replace(link, tiered=True) if n in own else link
        for n, link in enumerate(chain.links)
    )
    return msgspec.structs.replace(chain, links=links, retired=chain.retired + 1)


def plan_remap(write_ends: Mapping[int, str], targets: list[str]) -> dict[int, str]:
    """Queue -> new broker for the queues whose write end must move so that the queues are
    spread evenly over `targets` (sorted, distinct): queues already on a target stay while
    it has room, so as few queues move as possible. Pure and deterministic."""
    if not targets:
        raise InvalidRequest("a remap needs at least one target broker")
    queues = sorted(write_ends)
    base, extra = divmod(len(queues), len(targets))
    # The first `extra` targets (in order) take one queue more.
    room = {b: base + (1 if n < extra else 0) for n, b in enumerate(targets)}
    moves: dict[int, str] = {}
    leftover: list[int] = []
    for queue in queues:
        broker = write_ends[queue]
        if room.get(broker, 0) > 0:
            room[broker] -= 1
        else:
            leftover.append(queue)
    for queue in leftover:
        broker = max(targets, key=lambda b: (room[b], -targets.index(b)))
        room[broker] -= 1
        moves[queue] = broker
    return moves
