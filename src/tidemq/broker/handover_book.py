"""What the timer service knows about handing delayed batches of static queues over.

A delayed send to a static topic is scheduled on the broker that holds the queue's write
end. Once a remap seals that queue here, its pending batches can no longer be delivered
here (the link is read-only), so the remap hands them over to the new write end
(docs/design/static-topics.md, "Delayed messages"):

1. TAKE (to the sealed broker): the pending batches of the queue up to a page's size are
   reserved for the destination by a durable *handoff* record (``hop="handoff"``, ``tt``,
   ``tq``, ``ref`` the page's last timer offset, ``hb`` the destination). A reserved batch
   is never delivered or cancelled here, and the same page is answered to every TAKE until
   step 3, whatever destination that TAKE names.
2. ADOPT (to the destination): it schedules the page there, each record naming where it
   was sent (``ob``/``ho``: its messages' ids stay the same) and the broker and offset it
   was handed from (``hb``/``hx``: the dedup key). Pages arrive in increasing offsets of
   their source, so the adopter keeps per (topic, queue, source) the highest source offset
   adopted (`marks`) and skips what is at or below it: repeating an ADOPT is harmless.
3. HANDED (to the sealed broker): a *handed* record (``hop="handed"``) drops the page.

A crash between any two steps repeats from step 1 and ends the same: step 1 answers the
same page again, step 2 skips it. The marks survive restarts in the service's saved state
and in the adopted records above the done set's low watermark: an adopted batch goes on
the wheel only after its mark is in memory, so no state is saved that covers its delivery
(and lets retention drop its record) without its mark.

Batches of a queue that is no longer writable here and not reserved are *parked*: off the
wheel until taken, or until the queue is writable here again (a remap back), when they are
delivered here after all.

This module is the bookkeeping only (no I/O); `timer_service.TimerService` does the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["HANDED", "HANDOFF", "Handoff", "HandoverBook", "QueueKey"]

#: The ``hop`` of the timer topic's control records.
HANDOFF = "handoff"
HANDED = "handed"

QueueKey = tuple[str, int]


@dataclass(slots=True)
class Handoff:
    """A page reserved for `dest`: the pending batches of its queue at offsets <= through."""

    through: int
    dest: str
    #: The timer offset of the handoff record (-1 while it is being written).
    record: int = -1
    record_count: int = 1


@dataclass(slots=True)
class HandoverBook:
    #: Pending batches per static queue, by timer offset (insertion order = offset order,
    #: but for adopted batches, which are appended later; `pending_of` sorts).
    static: dict[QueueKey, dict[int, None]] = field(default_factory=dict)
    #: Batches taken off the wheel because their queue is not writable here.
    parked: dict[QueueKey, set[int]] = field(default_factory=dict)
    handoffs: dict[QueueKey, Handoff] = field(default_factory=dict)
    #: (topic, queue, source broker) -> highest source timer offset adopted here.
    marks: dict[tuple[str, int, str], int] = field(default_factory=dict)
    #: (hash of the origin topic, origin offset) -> timer offset here, for cancels by id
    #: of adopted batches.
    adopted: dict[tuple[int, int], int] = field(default_factory=dict)

    def add(self, key: QueueKey, offset: int) -> None:
        self.static.setdefault(key, {})[offset] = None

    def remove(self, key: QueueKey, offset: int) -> None:
        pending = self.static.get(key)
        if pending is not None:
            pending.pop(offset, None)
            if not pending:
                del self.static[key]
        parked = self.parked.get(key)
        if parked is not None:
            parked.discard(offset)
            if not parked:
                del self.parked[key]

    def park(self, key: QueueKey, offset: int) -> None:
        self.parked.setdefault(key, set()).add(offset)

    def unpark(self, key: QueueKey) -> set[int]:
        """The parked batches of `key` that are not reserved (they go back on the wheel)."""
        parked = self.parked.get(key, set())
        free = {o for o in parked if not self.reserved(key, o)}
        parked -= free
        if not parked:
            self.parked.pop(key, None)
        return free

    def reserved(self, key: QueueKey, offset: int) -> bool:
        handoff = self.handoffs.get(key)
        return handoff is not None and offset <= handoff.through

    def pending_of(self, key: QueueKey) -> list[int]:
        return sorted(self.static.get(key, ()))

    def holding(self, key: QueueKey) -> int:
        """How many batches of `key` are pending here (parked, reserved or scheduled)."""
        return len(self.static.get(key, ()))

    def adopted_mark(self, key: QueueKey, source: str) -> int:
        return self.marks.get((*key, source), -1)

    def mark_adopted(self, key: QueueKey, source: str, source_offset: int) -> None:
        mark = (*key, source)
        if source_offset > self.marks.get(mark, -1):
            self.marks[mark] = source_offset

    def export_marks(self) -> list[tuple[str, int, str, int]]:
        return [(t, q, s, o) for (t, q, s), o in sorted(self.marks.items())]
