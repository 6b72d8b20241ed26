"""Pop's lease tables, pure: no asyncio, no store, no wall clock (`pop_service` has the
whole story). One `PopQueue` per (group, topic, queue); every change to one is a `PopOp`,
applied by `APPLY[op.kind]` the same way live and in replay. Also the receipt handles
that name a lease.

A lease's deadline codes its state: below `HELD` it is invisible until then (in the
expiry heap); `HELD`, `SUSPENDED` and `MOVING` are parked and never due.
"""

from __future__ import annotations

import base64
import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import msgspec

from tidemq.broker.done_set import DoneSet
from tidemq.core.errors import InvalidRequest

__all__ = [
    "APPLY",
    "HELD",
    "MOVING",
    "OP_DECODER",
    "SUSPENDED",
    "Lease",
    "PopOp",
    "PopQueue",
    "decode_handle",
    "encode_handle",
    "push_back",
    "take_due",
]

#: The deadline of a FIFO message waiting behind an earlier one of its message group.
HELD: Final = 1 << 62
#: The deadline of a suspended message (attempts used up, waiting for `resume`). Both
#: are never due: a lease with a deadline >= HELD is parked, not in the expiry heap.
SUSPENDED: Final = HELD + 1
#: The deadline of a lease whose message is being moved to the retry topic (the schedule
#: record is not durable yet). Parked too; saved as due now, so that if the record never
#: became durable the restart delivers the message again.
MOVING: Final = HELD + 2
#: Due leases one receive looks at (to deliver again, or to dead-letter when exhausted).
_MAX_DUE_SCAN: Final = 10_000


class PopOp(msgspec.Struct, array_like=True, omit_defaults=True):
    """One change to one queue's lease table. Kinds:

    * ``lease``: `offsets` leased with `attempts`, `epochs`, until `deadline`; the queue's
      `next_offset` moved to `next_offset` (offsets passed over, not leased, are done);
    * ``ack`` / ``dlq``: `offsets` (with their `epochs`) finished (``dlq`` is only
      replayed from logs of earlier versions: a dead letter is now its own record);
    * ``change``: `offsets[0]` gets `epochs[0]` and `deadline`;
    * ``nack``: `offsets[0]` available again at `deadline`, with `attempts[0]` deliveries
      counted (a release does not count its delivery);
    * ``suspend``: `offsets` used up their attempts and wait for an operator, with new
      `epochs` (so no handle of theirs is current);
    * ``resume``: suspended `offsets[0]` is deliverable now, with epoch `epochs[0]` and
      its attempts counted from zero again.
    """

    kind: str
    group: str
    topic: str
    queue: int
    offsets: list[int]
    epochs: list[int] = []
    attempts: list[int] = []
    deadline: int = 0
    next_offset: int = -1
    error: str = ""
    #: FIFO topics: the message group of each leased offset, and offsets held back behind
    #: an earlier message of their group (with their groups).
    groups: list[str] = []
    held: list[int] = []
    held_groups: list[str] = []


OP_DECODER: Final = msgspec.msgpack.Decoder(PopOp)
_HANDLE_DECODER: Final = msgspec.msgpack.Decoder(tuple[str, int, int, int])


@dataclass(slots=True)
class Lease:
    deadline: int
    attempt: int
    epoch: int
    error: str = ""


@dataclass(slots=True)
class PopQueue:
    next_offset: int
    done: DoneSet
    leases: dict[int, Lease] = field(default_factory=dict)
    #: (deadline, offset, epoch), lazily pruned: an entry counts only while its lease
    #: still has that epoch and deadline.
    expiry: list[tuple[int, int, int]] = field(default_factory=list)
    dead: int = 0
    #: Messages a nack moved to the group's retry topic.
    retried: int = 0
    #: FIFO topics: per message group (its key, hex), its unfinished offsets in order. Only
    #: the first is ever leased; the others wait as leases with attempt 0 and a deadline
    #: that never comes (`HELD`) until the one before them finishes.
    fifo_groups: dict[str, deque[int]] = field(default_factory=dict)
    fifo_of: dict[int, str] = field(default_factory=dict)

    def set_lease(self, offset: int, lease: Lease) -> None:
        self.leases[offset] = lease
        if lease.deadline < HELD:
            heapq.heappush(self.expiry, (lease.deadline, offset, lease.epoch))

    def join_group(self, offset: int, group: str) -> None:
        self.fifo_groups.setdefault(group, deque()).append(offset)
        self.fifo_of[offset] = group

    def busy(self, group: str) -> bool:
        return bool(self.fifo_groups.get(group))

    def finish(self, offset: int) -> None:
        self.leases.pop(offset, None)
        self.done.mark(offset)
        group = self.fifo_of.pop(offset, None)
        if group is None:
            return
        waiting = self.fifo_groups[group]
        waiting.remove(offset)
        if not waiting:
            del self.fifo_groups[group]
            return
        # The group moves on: its next message becomes deliverable now.
        head = self.leases.get(waiting[0])
        if head is not None and head.deadline == HELD:
            head.deadline = 0
            heapq.heappush(self.expiry, (0, waiting[0], head.epoch))


def _apply_lease(table: PopQueue, op: PopOp) -> None:
    leased = set(op.offsets) | set(op.held)
    for i, offset in enumerate(op.offsets):
        if op.groups and op.groups[i] and offset not in table.fifo_of:
            table.join_group(offset, op.groups[i])
        table.set_lease(offset, Lease(op.deadline, op.attempts[i], op.epochs[i]))
    for offset, group in zip(op.held, op.held_groups, strict=True):
        table.join_group(offset, group)
        table.set_lease(offset, Lease(HELD, 0, 0))
    if op.next_offset > table.next_offset:
        # Offsets passed over (filtered out) are finished: mark the runs between leases.
        start = table.next_offset
        for offset in sorted(o for o in leased if start <= o < op.next_offset):
            if offset > start:
                table.done.mark(start, offset - start)
            start = offset + 1
        if op.next_offset > start:
            table.done.mark(start, op.next_offset - start)
        table.next_offset = op.next_offset


def _apply_ack(table: PopQueue, op: PopOp) -> None:
    for offset in op.offsets:
        table.finish(offset)


def _apply_dlq(table: PopQueue, op: PopOp) -> None:
    _apply_ack(table, op)
    table.dead += len(op.offsets)


def _apply_change(table: PopQueue, op: PopOp) -> None:
    lease = table.leases.get(op.offsets[0])
    if lease is not None:
        lease.deadline, lease.epoch = op.deadline, op.epochs[0]
        heapq.heappush(table.expiry, (op.deadline, op.offsets[0], op.epochs[0]))


def _apply_nack(table: PopQueue, op: PopOp) -> None:
    lease = table.leases.get(op.offsets[0])
    if lease is not None:
        lease.deadline, lease.attempt, lease.error = op.deadline, op.attempts[0], op.error
        if op.epochs:
            lease.epoch = op.epochs[0]
        heapq.heappush(table.expiry, (op.deadline, op.offsets[0], lease.epoch))


def _apply_suspend(table: PopQueue, op: PopOp) -> None:
    for i, offset in enumerate(op.offsets):
        lease = table.leases.get(offset)
        if lease is not None:
            lease.deadline = SUSPENDED
            if op.epochs:
                lease.epoch = op.epochs[i]
            if op.error:  # the last nack's reason, when that nack suspended it
                lease.error = op.error


def _apply_resume(table: PopQueue, op: PopOp) -> None:
    lease = table.leases.get(op.offsets[0])
    if lease is not None and lease.deadline == SUSPENDED:
        lease.deadline, lease.attempt, lease.epoch = 0, 0, op.epochs[0]
        heapq.heappush(table.expiry, (0, op.offsets[0], lease.epoch))


APPLY: Final[dict[str, Callable[[PopQueue, PopOp], None]]] = {
    "lease": _apply_lease,
    "ack": _apply_ack,
    "dlq": _apply_dlq,
    "change": _apply_change,
    "nack": _apply_nack,
    "suspend": _apply_suspend,
    "resume": _apply_resume,
}


def push_back(table: PopQueue, offsets: list[int]) -> None:
    """Put taken-but-unused leases back into the expiry heap."""
    for offset in offsets:
        lease = table.leases.get(offset)
        if lease is not None and lease.deadline < HELD:
            heapq.heappush(table.expiry, (lease.deadline, offset, lease.epoch))


def take_due(
    table: PopQueue, want: int, max_attempts: int, now: int
) -> tuple[list[tuple[int, int]], list[int]]:
    """Leases that ran out, to deliver again: up to `want` (offset, attempt) pairs, and
    every due offset whose attempts are used up (for the dead-letter topic, or to
    suspend), so that none of those stays acknowledgeable because the receive was full
    (up to `_MAX_DUE_SCAN` entries looked at)."""
    chosen: list[tuple[int, int]] = []
    to_dlq: list[int] = []
    later: list[int] = []
    seen: set[int] = set()
    scanned = 0
    while table.expiry and table.expiry[0][0] <= now and scanned < _MAX_DUE_SCAN:
        deadline, offset, epoch = heapq.heappop(table.expiry)
        lease = table.leases.get(offset)
        if lease is None or lease.epoch != epoch or lease.deadline != deadline:
            continue  # acked, changed or re-leased since
        if offset in seen:
            continue  # the same entry twice (a replayed operation pushes it again)
        seen.add(offset)
        scanned += 1
        if lease.attempt >= max_attempts:
            to_dlq.append(offset)
        elif len(chosen) < want:
            chosen.append((offset, lease.attempt + 1))
        else:
            later.append(offset)
    push_back(table, later)
    return chosen, to_dlq


def encode_handle(topic: str, queue: int, offset: int, epoch: int) -> str:
    raw = msgspec.msgpack.encode((topic, queue, offset, epoch))
    return base64.urlsafe_b64encode(raw).decode()


def decode_handle(handle: str) -> tuple[str, int, int, int]:
    try:
        return _HANDLE_DECODER.decode(base64.urlsafe_b64decode(handle.encode()))
    except (ValueError, msgspec.DecodeError, msgspec.ValidationError):
        raise InvalidRequest(f"not a receipt handle: {handle[:40]!r}") from None
