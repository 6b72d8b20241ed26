"""Which principal a producer id belongs to, with authentication on (issue 16: a PRODUCE
with another producer's id can poison that producer's sequence, or pass a forged batch as
its own; docs/design/security.md, section 2, row 8).

INIT_PRODUCER binds the id it issues to the connection's principal; a PRODUCE with an id
bound to another principal is refused (FencedProducer, naming neither). Ids are issued in
order, so guessing one is easy: the binding, not the id, is what protects it.

Kept in memory, bounded (`MAX_PRODUCER_OWNERS`, least recently used forgotten first), and
in the store's metadata (the `MAX_PRODUCER_OWNERS` newest ids), so a restart or a
forgotten entry does not unbind an id: an id the memory does not know is looked up there.
Only an id the store does not know either (issued before owners were stored, or among the
oldest) is bound to the first principal that produces with it (trust on first use). Not
thread-safe: owned by the broker's loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
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
        save: Callable[[int, str], None] | None = None,
        load: Callable[[int], str | None] | None = None,
    ) -> None:
        """`save(id, principal)` and `load(id)`: the durable copy (None: memory only)."""
        if max_owners < 1:
            raise ValueError(f"max_owners must be >= 1, got {max_owners}")
        self._max = max_owners
        self._owners: OrderedDict[int, str] = OrderedDict()
        self._save = save
        self._load = load

    def issued(self, producer_id: int, principal: str) -> None:
        """INIT_PRODUCER gave `producer_id` to `principal`."""
        if self._save is not None:
            self._save(producer_id, principal)
        self._remember(producer_id, principal)

    def check(self, producer_id: int, principal: str) -> None:
        """Raise FencedProducer if `producer_id` belongs to another principal; bind an
        id nobody knows to `principal`."""
        owner = self._owners.get(producer_id)
        if owner is None and self._load is not None:
            owner = self._load(producer_id)
            if owner is not None:
                self._remember(producer_id, owner)
        if owner is None:
            self._remember(producer_id, principal)
            if self._save is not None:
                self._save(producer_id, principal)
            return
        if owner != principal:
            raise FencedProducer(
                f"producer id {producer_id} was issued to another user; ask for one with "
                "INIT_PRODUCER"
            )
        self._owners.move_to_end(producer_id)

    def _remember(self, producer_id: int, principal: str) -> None:
        self._owners[producer_id] = principal
        self._owners.move_to_end(producer_id)
        while len(self._owners) > self._max:
            self._owners.popitem(last=False)

    def __len__(self) -> int:
        return len(self._owners)
