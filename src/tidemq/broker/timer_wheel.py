"""A hashed timing wheel for delayed messages: keys waiting for a due time, in milliseconds.

The broker holds one entry per scheduled message (the key is the offset of its timer
record) and asks, as its clock moves, which entries are now due. A heap of every entry
would do, but a wheel makes the common operations O(1): adding, moving or cancelling an
entry only touches one slot, and firing takes whole slots at a time.

Layout. Time is cut into ticks of `precision_ms`; the wheel has `slots` slots and covers
the window of ticks ``[tick, tick + slots)`` from the current tick, one tick per slot
(slot index ``tick % slots``). An entry due beyond the window waits in an overflow heap
of ``(due_ms, key)`` and rolls over into its slot when `advance` brings its tick into the
window. An entry due at or before the current tick (past due) sits in the current slot.
So, for the current tick ``T`` and an entry due at tick ``t``:

* ``t >= T + slots``: in the overflow heap;
* ``t <= T``: in slot ``T % slots``;
* otherwise: in slot ``t % slots``.

Non-empty slots. Wheels are configured wide (an hour of 100 ms ticks is 36,000 slots) and
are usually sparse, so walking slot by slot to find the next busy one would cost more than
the entries. A small heap of the ticks whose slots became non-empty (lazy: an item whose
slot emptied or whose tick passed is dropped when it reaches the top) finds the next busy
slot in O(log n), for `advance` and `next_due_ms` alike.

Guarantees. `advance(now_ms)` returns exactly the entries with ``due_ms <= now_ms``,
sorted by ``(due_ms, key)``, never one that is not yet due: slots only narrow the search,
the due time decides. The wheel's tick never goes back: an `advance` to an earlier time
than before only looks at the current slot (where anything added since with a due time in
the past sits) and moves nothing. The work of an `advance` is bounded by the entries it
fires or rolls over and the slots it empties, never by how far time jumped, so a broker
that restarts hours later pays for its entries, not for the hours.

`next_due_ms` is cached: adding keeps the cache (a new minimum replaces it), and only
removing or firing the earliest entry drops it; recomputing looks at the first busy slot's
entries (or the overflow heap's top when the wheel is empty).

Memory per entry (CPython, 64-bit): one dict item key -> due (about 50-100 bytes with the
table's slack) plus either a reference in its slot's set (about 20-60 bytes) or, in the
overflow, one ``(due_ms, key)`` 2-tuple (56 bytes) and a list pointer (8 bytes); the key
and due int objects are shared, not copied. Per non-empty slot: a set (216 bytes empty)
and one heap item. Slots are created on first use and dropped when they empty, so an idle
wheel costs one list of `slots` pointers. Removing an entry from the overflow leaves its
tuple behind (lazy deletion); both heaps are compacted once stale items outnumber live
ones (and exceed 64), so they stay within twice their live size plus 64.

Not thread-safe; the broker calls it from its one event loop. No I/O, no clock: every
time is passed in.
"""

from __future__ import annotations

import heapq
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["TimerWheel"]

# A heap with lazy deletion is compacted only past this many stale items, so a small heap
# is not rebuilt on every other cancellation.
_MIN_STALE_TO_COMPACT = 64


class _OrderedKey(Protocol):
    """A key: hashable (dict and set member) and orderable (ties on due time sort by key)."""

    def __hash__(self) -> int: ...

    def __lt__(self, other: Any, /) -> bool: ...


K = TypeVar("K", bound=_OrderedKey)


def _checked_int(name: str, value: object, *, positive: bool) -> int:
    # bool is an int subclass; precision_ms=True is a bug, not 1 ms.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


class TimerWheel(Generic[K]):
    """Keys with due times; `advance` hands back the ones that are due, in due order."""

    def __init__(self, *, precision_ms: int, slots: int, now_ms: int) -> None:
        self._precision = _checked_int("precision_ms", precision_ms, positive=True)
        self._nslots = _checked_int("slots", slots, positive=True)
        self._tick = _checked_int("now_ms", now_ms, positive=False) // self._precision
        self._due: dict[K, int] = {}
        self._slots: list[set[K] | None] = [None] * self._nslots
        self._in_wheel = 0  # entries in slots (the rest are in the overflow)
        # Ticks of non-empty slots (a min-heap, with stale items: see the module docstring).
        self._busy: list[int] = []
        self._busy_slots = 0  # non-empty slots, i.e. live items of `_busy`
        self._overflow: list[tuple[int, K]] = []
        self._overflow_live = 0  # tuples in `_overflow` that are live entries
        # Earliest due time, or None when empty; meaningful only while `_earliest_ok`.
        self._earliest: int | None = None
        self._earliest_ok = True

    # ------------------------------------------------------------------ queries

    @property
    def precision_ms(self) -> int:
        return self._precision

    @property
    def slots(self) -> int:
        return self._nslots

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, key: object) -> bool:
        return key in self._due

    def due_of(self, key: K) -> int | None:
        return self._due.get(key)

    def next_due_ms(self) -> int | None:
        """The earliest due time of any entry (None when empty); may already be past."""
        if not self._earliest_ok:
            self._earliest = self._find_earliest()
            self._earliest_ok = True
        return self._earliest

    # ------------------------------------------------------------------ changes

    def add(self, key: K, due_ms: int) -> None:
        """Schedule `key` at `due_ms`, moving it if it is already scheduled."""
        old = self._due.get(key)
        if old == due_ms:
            return
        if old is not None:
            del self._due[key]  # first, so a compaction in `_unlink` drops its tuple
            self._unlink(key, old)
        self._due[key] = due_ms
        self._link(key, due_ms)
        if self._earliest_ok and (self._earliest is None or due_ms < self._earliest):
            self._earliest = due_ms

    def remove(self, key: K) -> bool:
        """Cancel `key`; True if it was scheduled."""
        due = self._due.pop(key, None)
        if due is None:
            return False
        self._unlink(key, due)
        return True

    def advance(self, now_ms: int) -> list[tuple[int, K]]:
        """Remove and return every entry due at or before `now_ms`, by (due_ms, key).

        An earlier `now_ms` than before is allowed (a clock step back): it fires what is
        due by then, if anything, and the wheel's tick stays where it was."""
        new_tick = now_ms // self._precision
        earliest = self.next_due_ms()
        if earliest is None or earliest > now_ms:
            # Nothing is due, so every slot the tick passes over is empty: moving the
            # tick only needs the overflow to roll into the wider window.
            if new_tick > self._tick:
                self._tick = new_tick
                self._roll_over(now_ms, [])
            return []
        fired: list[tuple[int, K]] = []
        if new_tick <= self._tick:
            # Same tick, or time went back: everything due is in the current slot.
            index = self._tick % self._nslots
            slot = self._slots[index]
            if slot is not None:
                self._fire_due(index, slot, now_ms, fired)
        else:
            self._sweep(new_tick, now_ms, fired)
            self._tick = new_tick
            self._roll_over(now_ms, fired)
        # The earliest entry was due (earliest <= now_ms), so it is gone now.
        self._earliest_ok = not self._due
        self._earliest = None
        fired.sort()
        return fired

    # ------------------------------------------------------------------ internals

    def _link(self, key: K, due_ms: int) -> None:
        """Put an entry already in `_due` where it belongs for the current tick."""
        tick = due_ms // self._precision
        if tick >= self._tick + self._nslots:
            heapq.heappush(self._overflow, (due_ms, key))
            self._overflow_live += 1
        else:
            self._slot_for(max(tick, self._tick)).add(key)
            self._in_wheel += 1

    def _slot_for(self, tick: int) -> set[K]:
        """The slot of `tick` (in the window), created and marked busy if it was empty."""
        index = tick % self._nslots
        slot = self._slots[index]
        if slot is None:
            slot = self._slots[index] = set()
            heapq.heappush(self._busy, tick)
            self._busy_slots += 1
        return slot

    def _drop_slot(self, index: int) -> None:
        # Its `_busy` item goes stale: the one place busy items go stale (a tick passes
        # only once its slot was emptied), so the one place to think of compacting.
        self._slots[index] = None
        self._busy_slots -= 1
        stale = len(self._busy) - self._busy_slots
        if stale > _MIN_STALE_TO_COMPACT and stale > self._busy_slots:
            slots, n, now_tick = self._slots, self._nslots, self._tick
            # A sorted list is a heap; the set drops a tick pushed again after its slot
            # emptied and refilled.
            self._busy = sorted({t for t in self._busy if t >= now_tick and slots[t % n]})

    def _unlink(self, key: K, due_ms: int) -> None:
        """Take an entry out of its slot or the overflow (the caller updates `_due`)."""
        if self._earliest_ok and due_ms == self._earliest:
            self._earliest_ok = False
        tick = due_ms // self._precision
        if tick >= self._tick + self._nslots:
            # Its tuple stays in the heap; a tuple is live only while `_due` agrees.
            self._overflow_live -= 1
            self._maybe_compact_overflow()
            return
        index = max(tick, self._tick) % self._nslots
        slot = self._slots[index]
        assert slot is not None
        slot.remove(key)
        if not slot:
            self._drop_slot(index)
        self._in_wheel -= 1

    def _maybe_compact_overflow(self) -> None:
        """Compact once stale tuples outnumber live ones (after a cancellation made one
        more stale, or a roll over took live ones out)."""
        stale = len(self._overflow) - self._overflow_live
        if stale <= _MIN_STALE_TO_COMPACT or stale <= self._overflow_live:
            return
        seen: set[K] = set()
        live: list[tuple[int, K]] = []
        for due, key in self._overflow:
            # A key removed and re-added at the same due time has two matching tuples.
            if self._due.get(key) == due and key not in seen:
                seen.add(key)
                live.append((due, key))
        heapq.heapify(live)
        self._overflow = live

    def _first_busy_tick(self) -> int | None:
        """The earliest tick with a non-empty slot, dropping stale items on the way.

        An item is stale once its slot emptied or its tick passed (the slot index then
        belongs to a later tick, whose own item was pushed when that slot filled)."""
        busy, slots, n = self._busy, self._slots, self._nslots
        while busy:
            tick = busy[0]
            if tick >= self._tick and slots[tick % n] is not None:
                return tick
            heapq.heappop(busy)
        return None

    def _fire_due(self, index: int, slot: set[K], now_ms: int, fired: list[tuple[int, K]]) -> None:
        """Fire the entries of one slot that are due; the later ones stay."""
        due_of = self._due
        ready = [key for key in slot if due_of[key] <= now_ms]
        for key in ready:
            slot.remove(key)
            fired.append((due_of.pop(key), key))
        if not slot:
            self._drop_slot(index)
        self._in_wheel -= len(ready)

    def _sweep(self, new_tick: int, now_ms: int, fired: list[tuple[int, K]]) -> None:
        """Fire the busy slots of ticks ``tick .. new_tick``, busy slot by busy slot.

        Every entry in a slot of a tick before `new_tick` is due; the slot of `new_tick`
        itself may hold entries later within that tick, which stay."""
        due_of = self._due
        while (tick := self._first_busy_tick()) is not None and tick <= new_tick:
            index = tick % self._nslots
            slot = self._slots[index]
            assert slot is not None
            if tick == new_tick:
                self._fire_due(index, slot, now_ms, fired)
                return
            for key in slot:
                fired.append((due_of.pop(key), key))
            self._in_wheel -= len(slot)
            self._drop_slot(index)

    def _roll_over(self, now_ms: int, fired: list[tuple[int, K]]) -> None:
        """Move overflow entries whose tick is now inside the window into their slots,
        or straight into `fired` when they are already due (after a long jump)."""
        horizon = self._tick + self._nslots
        heap = self._overflow
        precision = self._precision
        while heap and heap[0][0] // precision < horizon:
            due, key = heapq.heappop(heap)
            if self._due.get(key) != due:
                continue  # removed or moved since: a stale tuple
            if due <= now_ms:
                del self._due[key]
                fired.append((due, key))
                self._overflow_live -= 1
                continue
            slot = self._slot_for(due // precision)  # not due, so not before the tick
            if key in slot:
                continue  # the duplicate of a removed-and-re-added entry, placed already
            slot.add(key)
            self._overflow_live -= 1
            self._in_wheel += 1
        self._maybe_compact_overflow()

    def _find_earliest(self) -> int | None:
        if self._in_wheel:
            # Slots hold their ticks in order from the current one, and the current slot
            # also holds every past-due entry, so the first busy slot has the minimum.
            tick = self._first_busy_tick()
            assert tick is not None
            slot = self._slots[tick % self._nslots]
            assert slot is not None
            due_of = self._due
            return min(due_of[key] for key in slot)
        heap = self._overflow
        while heap:
            due, key = heap[0]
            if self._due.get(key) == due:
                return due
            heapq.heappop(heap)  # stale: drop it now rather than look at it again
        return None
