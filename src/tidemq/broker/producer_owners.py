"""Which principal a producer id belongs to, with authentication on (issue 16: a PRODUCE
with another producer's id can poison that producer's sequence, or pass a forged batch as
its own; docs/design/security.md, section 2, row 8).

INIT_PRODUCER binds the id it issues to the connection's principal; a PRODUCE with an id
bound to another principal is refused (FencedProducer, naming neither). Ids are issued in
order, so guessing one is easy: the binding, not the id, is what protects it.

Kept in memory, bounded (`MAX_PRODUCER_OWNERS`, least recently used forgotten first), and
durably (`producer_owner_topic.py`: records of a compact internal topic, so they
replicate with the log), so a restart, a failover or a forgotten entry does not unbind an
id: an id the memory does not know is looked up there. Only an id the durable copy does
not know either (issued before owners were stored, or among the oldest) is bound to the
first principal that produces with it (trust on first use). Not thread-safe: owned by the
broker's loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Final

from tidemq.core.errors import FencedProducer

__all__ = ["MAX_PRODUCER_OWNERS", "ProducerOwners"]

#: Producer ids whose owner is remembered at once (about 100 bytes each).
MAX_PRODUCER_OWNERS: Final = 1_000_000


class ProducerOwners:
    def __init__(
        self,
        max_owners: int = MAX_PRODUCER_OWNERS,
        *,
        save: Callable[[int, str], Awaitable[None]] | None = None,
        load: Callable[[int], Awaitable[str | None]] | None = None,
    ) -> None:
        """`save(id, principal)` and `load(id)`: the durable copy (None: memory only)."""
        if max_owners < 1:
            raise ValueError(f"max_owners must be >= 1, got {max_owners}")
        self._max = max_owners
        self._owners: OrderedDict[int, str] = OrderedDict()
        self._save = save
        self._load = load

    async def issued(self, producer_id: int, principal: str) -> None:
        """INIT_PRODUCER gave `producer_id` to `principal`: returns once that is durable
        (the id may be handed out then)."""
        self._remember(producer_id, principal)
        if self._save is not None:
            await self._save(producer_id, principal)

    def known(self, producer_id: int, principal: str) -> bool:
        """Whether memory binds `producer_id` to `principal` (the produce path's check,
        with no wait); raise FencedProducer if it binds it to another principal. False:
        ask `check`."""
        owner = self._owners.get(producer_id)
        if owner is None:
            return False
        if owner != principal:
            raise _fenced(producer_id)
        self._owners.move_to_end(producer_id)
        return True

    async def check(self, producer_id: int, principal: str) -> None:
        """Raise FencedProducer if `producer_id` belongs to another principal; bind an
        id nobody knows to `principal`."""
        if self.known(producer_id, principal):
            return
        owner = None if self._load is None else await self._load(producer_id)
        if owner is None:
            owner = self._owners.get(producer_id)  # bound meanwhile, by another request
        if owner is None:
            self._remember(producer_id, principal)
            if self._save is not None:
                await self._save(producer_id, principal)
            return
        self._remember(producer_id, owner)
        if owner != principal:
            raise _fenced(producer_id)

    def _remember(self, producer_id: int, principal: str) -> None:
        self._owners[producer_id] = principal
        self._owners.move_to_end(producer_id)
        while len(self._owners) > self._max:
            self._owners.popitem(last=False)

    def __len__(self) -> int:
        return len(self._owners)


def _fenced(producer_id: int) -> FencedProducer:
    return FencedProducer(
        f"producer id {producer_id} was issued to another user; ask for one with INIT_PRODUCER"
    )
