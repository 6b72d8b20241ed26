"""Offsets follow a moved group: pull on miss (ADR 17).

Each group's coordinator is picked by rendezvous hashing over the live brokers, so a
broker that joins (or a group's broker that stops) moves some groups to a broker that has
never stored their offsets. The first time this broker is asked about a group (join,
commit, fetch offsets, describe, reset) and its store holds no offset of that group, it
asks every other live broker for the group's committed offsets (`FetchOffsetsRequest`
with `local_only`, so they do not ask on in turn) and adopts, per (topic, queue), the
offset committed last (`newest_offsets`); then it answers the request. A group moved to
a new broker so keeps its offsets.

The rule, and its edges:

* at most one pull per group per broker run: the groups settled (found offsets here, or
  pulled) are remembered, up to `MAX_SETTLED_GROUPS`. Past it the least recently used
  are forgotten; a forgotten group is settled again by one look at the store (and, only
  if it still holds no offset of the group, one more pull);
* a broker that already holds offsets of the group never pulls. When a coordinator that
  was away returns, its groups come back to it with the offsets it had: commits made
  meanwhile on the stand-in are not carried back, so the group reads some messages again,
  never skips any;
* every wait is bounded: the live-broker list by the name servers' request timeout, each
  broker's answer by `request_timeout_ms`; a broker that cannot be reached is skipped with
  a log line, and the request goes on with what the others answered;
* offsets committed here while a pull is out are newer than anything pulled: they are
  kept, and only the queues still without an offset are adopted;
* adopted offsets are committed here like any commit (their commit time is the
  adoption's).

One per broker, on its loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Final, NamedTuple

from tidemq.broker.offset_book import OffsetBook
from tidemq.core.errors import TidemqError

__all__ = [
    "MAX_CONCURRENT_PULLS",
    "MAX_SETTLED_GROUPS",
    "PULL_REQUEST_TIMEOUT_MS",
    "HeldOffset",
    "OffsetPull",
    "PeerList",
    "PeerOffsets",
    "newest_offsets",
]

log = logging.getLogger(__name__)

#: Groups remembered as settled in one run. About 100 bytes each: 10 MB at most. Past it
#: the least recently used are forgotten, and re-settled by one look at the store.
MAX_SETTLED_GROUPS: Final = 100_000
#: Pulls out at once (each asks every live broker): a broker that just took over many
#: groups does not open thousands of requests in one burst.
MAX_CONCURRENT_PULLS: Final = 16
#: Longest wait for the live-broker list, and for each broker's answer (asked all at
#: once): a request that moves a group waits at most about twice this, far below the
#: client's request timeout (30 s by default).
PULL_REQUEST_TIMEOUT_MS: Final = 5_000


class HeldOffset(NamedTuple):
    """A group's committed offset of one queue as a broker holds it."""

    topic: str
    queue: int
    offset: int
    #: When it was committed, epoch ms (that broker's clock; 0: unknown).
    committed_ms: int


#: The other live brokers, name -> address (this broker left out).
PeerList = Callable[[], Awaitable[Mapping[str, str]]]
#: One broker's committed offsets of a group, from its own store (address, group).
PeerOffsets = Callable[[str, str], Awaitable[list[HeldOffset]]]


def newest_offsets(answers: Iterable[Iterable[HeldOffset]]) -> dict[tuple[str, int], int]:
    """Per (topic, queue), the offset committed last among the brokers' answers. Equal
    times: the smaller offset (read again rather than skip)."""
    best: dict[tuple[str, int], tuple[int, int]] = {}
    for answer in answers:
        for o in answer:
            key = (o.topic, o.queue)
            held = best.get(key)
            if held is None or (o.committed_ms, -o.offset) > (held[0], -held[1]):
                best[key] = (o.committed_ms, o.offset)
    return {key: offset for key, (_, offset) in best.items()}


class OffsetPull:
    def __init__(
        self,
        book: OffsetBook,
        *,
        peers: PeerList,
        peer_offsets: PeerOffsets,
        request_timeout_ms: int,
    ) -> None:
        self._book = book
        self._peers = peers
        self._peer_offsets = peer_offsets
        self._timeout_s = request_timeout_ms / 1000
        #: Groups settled in this run, least recently used first.
        self._settled: OrderedDict[str, None] = OrderedDict()
        #: Pulls out now, by group: a second request for the group waits for the first.
        self._pulling: dict[str, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_PULLS)

    async def ensure(self, group: str) -> None:
        """Return once `group`'s offsets are here: held already, or pulled from the other
        live brokers (see the module doc). Never raises for an unreachable broker."""
        if group in self._settled:
            self._settled.move_to_end(group)
            return
        task = self._pulling.get(group)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._settle(group))
            self._pulling[group] = task
            task.add_done_callback(lambda _: self._pulling.pop(group, None))
        # Shielded: a request that gives up does not cancel the pull others wait for.
        await asyncio.shield(task)

    async def close(self) -> None:
        """Cancel the pulls still out (the broker stops)."""
        tasks = list(self._pulling.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _settle(self, group: str) -> None:
        if not await self._book.committed(group):
            async with self._slots:
                await self._pull(group)
        self._settled[group] = None
        while len(self._settled) > MAX_SETTLED_GROUPS:
            self._settled.popitem(last=False)

    async def _pull(self, group: str) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                peers = dict(await self._peers())
        except (TidemqError, TimeoutError) as exc:
            log.warning(
                "group %s: no offsets pulled, the live brokers are unknown (%s)",
                group,
                exc or "no answer in time",
            )
            return
        if not peers:
            return
        answers = await asyncio.gather(
            *(self._ask(name, address, group) for name, address in sorted(peers.items()))
        )
        newest = newest_offsets(answers)
        if not newest:
            return
        adopted = await self._book.adopt(group, newest)
        sources = sorted(
            name for name, answer in zip(sorted(peers), answers, strict=True) if answer
        )
        log.info(
            "group %s: adopted %d committed offsets from %s (this broker now coordinates it)",
            group,
            len(adopted),
            ", ".join(sources),
        )

    async def _ask(self, name: str, address: str, group: str) -> list[HeldOffset]:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._peer_offsets(address, group)
        except (TidemqError, TimeoutError) as exc:
            log.warning(
                "group %s: broker %s (%s) did not give its offsets (%s); skipped",
                group,
                name,
                address,
                exc or "no answer in time",
            )
            return []
