"""The pop service's lease tables of every (group, topic, queue), the operation log that
makes each change durable (records in `POP_TOPIC`), the saved state, and the rebuild at
start from the saved state, the log, and the commit-log scan (`pop_service` tells how).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import msgspec

from tidemq.broker.done_set import DoneSet
from tidemq.broker.moves import InFlightMoves
from tidemq.broker.pop_leases import (
    APPLY,
    HELD,
    MOVING,
    OP_DECODER,
    SUSPENDED,
    Lease,
    PopOp,
    PopQueue,
    decode_handle,
)
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.system_topics import MovedRecord, read_internal
from tidemq.core.batch import MessageRecord, decode_messages, encode_batch
from tidemq.core.errors import InvalidRequest
from tidemq.core.properties import POP_TOPIC
from tidemq.core.record import RecordFlags
from tidemq.store.message_store import MessageStore

__all__ = ["LeaseBook", "PopCounts"]

#: The pop service's one logger, as before it was split (operators filter by its name).
log = logging.getLogger("tidemq.broker.pop_service")


class _SavedQueue(msgspec.Struct, array_like=True):
    group: str
    topic: str
    queue: int
    next_offset: int
    done: list[tuple[int, int]]
    leases: list[tuple[int, int, int, int]]  # offset, deadline, attempt, epoch
    dead: int
    fifo: list[tuple[str, list[int]]] = []
    #: The last failure reason of leases that have one (shown for suspended messages).
    errors: list[tuple[int, str]] = []
    retried: int = 0


class _SavedState(msgspec.Struct):
    op_offset: int
    epoch: int
    queues: list[_SavedQueue]
    #: The restart scans the commit log from here for retries and dead letters (FROM_POP
    #: records): every one before it is finished in `queues`.
    position: int = 0


_STATE_DECODER: Final = msgspec.msgpack.Decoder(_SavedState)


class LeaseBook:
    """Every lease table of one broker's pop service, and the epoch counter of its leases.
    Owned by `PopService`, on the broker's loop (`rebuild` before serving)."""

    def __init__(self, gateway: StoreGateway) -> None:
        self._gateway = gateway
        self.tables: dict[tuple[str, str, int], PopQueue] = {}
        #: Retries and dead letters being written: the saved state's scan position stays
        #: at or before each until its lease is finished in the tables.
        self.in_flight = InFlightMoves()
        self._epoch = 0

    @staticmethod
    def scan_position(saved: bytes | None) -> int:
        """Where the restart scan for retries and dead letters starts."""
        return 0 if saved is None else _STATE_DECODER.decode(saved).position

    def rebuild(
        self, store: MessageStore, saved: bytes | None, moved: Iterable[MovedRecord]
    ) -> None:
        """Saved tables, then the op records since, then the retries and dead letters the
        log scan found (each finishes its lease, once). Runs before serving."""
        op_offset = 0 if saved is None else self._restore(_STATE_DECODER.decode(saved))
        replayed = 0
        for rec in read_internal(store, POP_TOPIC, op_offset):
            for m in decode_messages(rec.payload):
                if m.value:
                    self.apply(OP_DECODER.decode(m.value))
                    replayed += 1
        finished = 0
        for moved_rec in moved:
            lease = moved_rec.props.pop_lease
            if moved_rec.flags & RecordFlags.FROM_POP and lease is not None:
                retried = bool(moved_rec.flags & RecordFlags.DELAYED)
                finished += self.finish_moved(*lease, retried=retried)
        if replayed or finished:
            log.info(
                "pop: replayed %d lease operations; %d retries or dead letters found in the log",
                replayed,
                finished,
            )

    def _restore(self, state: _SavedState) -> int:
        """Load the saved tables; returns the op-topic offset to replay from."""
        self._epoch = state.epoch
        for q in state.queues:
            table = PopQueue(q.next_offset, DoneSet.restore(q.done), dead=q.dead, retried=q.retried)
            for offset, deadline, attempt, epoch in q.leases:
                table.set_lease(offset, Lease(deadline, attempt, epoch))
            for g, offsets in q.fifo:
                for offset in offsets:
                    table.join_group(offset, g)
            for offset, error in q.errors:
                if offset in table.leases:
                    table.leases[offset].error = error
            self.tables[(q.group, q.topic, q.queue)] = table
        return state.op_offset

    def finish_moved(
        self, group: str, topic: str, queue: int, offset: int, *, retried: bool
    ) -> int:
        """A retry or dead letter of (group, topic, queue, offset) exists: its lease is
        finished (once: a second sighting changes nothing)."""
        table = self.tables.get((group, topic, queue))
        if table is None or table.done.is_done(offset):
            return 0
        table.finish(offset)
        if retried:
            table.retried += 1
        else:
            table.dead += 1
        return 1

    def save_state(self, flushed_position: int) -> tuple[bytes, int, int]:
        """The state to save, the op-topic offset it includes (to trim below), and the
        log position the restart scans from (to keep the log from)."""
        store = self._gateway.store
        _, op_offset = store.queue_bounds(POP_TOPIC, 0)
        position = self.in_flight.scan_position(flushed_position)
        queues = [
            _SavedQueue(
                group,
                topic,
                queue,
                t.next_offset,
                t.done.export(),
                [
                    # A move in progress is saved as due now: if its record never becomes
                    # durable, the message is delivered again; if it does, the scan finds it.
                    (o, 0 if ls.deadline == MOVING else ls.deadline, ls.attempt, ls.epoch)
                    for o, ls in t.leases.items()
                ],
                t.dead,
                [(g, list(offsets)) for g, offsets in t.fifo_groups.items()],
                [(o, ls.error) for o, ls in t.leases.items() if ls.error],
                t.retried,
            )
            for (group, topic, queue), t in self.tables.items()
        ]
        state = _SavedState(op_offset, self._epoch, queues, position)
        return msgspec.msgpack.encode(state), op_offset, position

    def finished_below(self, group: str, topic: str, queue: int) -> int:
        """Every message of the queue below this offset is finished for the group (acked,
        dead-lettered, or skipped by its filter); none of those from it on is leased."""
        table = self.table(group, topic, queue)
        return min([table.next_offset, *table.leases])

    def unfinished(self, topic: str, queue: int, below: int) -> list[str]:
        """The pop groups of the queue with messages below `below` not finished yet."""
        return sorted(
            g
            for (g, t, q), table in self.tables.items()
            if t == topic and q == queue and min([table.next_offset, *table.leases]) < below
        )

    def table(self, group: str, topic: str, queue: int) -> PopQueue:
        key = (group, topic, queue)
        table = self.tables.get(key)
        if table is None:
            # A new group starts at the first retained message of each queue.
            low, _ = self._gateway.store.queue_bounds(topic, queue)
            table = self.tables[key] = PopQueue(low, DoneSet(low))
        return table

    def apply(self, op: PopOp) -> None:
        """Apply one operation (live, after the change was decided, and in replay)."""
        table = self.tables.get((op.group, op.topic, op.queue))
        if table is None:
            start = min(op.offsets, default=op.next_offset)
            table = self.tables[(op.group, op.topic, op.queue)] = PopQueue(start, DoneSet(start))
        for epoch in op.epochs:
            self._epoch = max(self._epoch, epoch)
        APPLY[op.kind](table, op)

    async def log(self, op: PopOp) -> None:
        """Make `op` durable (it is applied already)."""
        await self.log_many([op])

    async def log_many(self, ops: list[PopOp]) -> None:
        """Make `ops` durable, in one record (one flush)."""
        if not ops:
            return
        payload = encode_batch(
            [MessageRecord(msgspec.msgpack.encode(op), None, None, (), (), 0) for op in ops]
        )
        await self._gateway.append(POP_TOPIC, 0, payload, flags=RecordFlags.CONTROL)

    def next_epoch(self) -> int:
        self._epoch += 1
        return self._epoch

    def lease_for(self, group: str, handle: str) -> tuple[PopQueue, str, int, int, int, Lease]:
        topic, queue, offset, epoch = decode_handle(handle)
        table = self.tables.get((group, topic, queue))
        lease = None if table is None else table.leases.get(offset)
        if table is None or lease is None:
            if table is not None and table.done.is_done(offset):
                raise InvalidRequest(
                    f"{topic}/{queue} offset {offset} was already acknowledged for group "
                    f"{group!r} (or, after a nack, moved to its retry topic or dead-lettered)"
                )
            raise InvalidRequest(
                f"no lease of group {group!r} on {topic}/{queue} offset {offset}: "
                "a handle from another group, or never leased here"
            )
        if lease.epoch != epoch:
            raise InvalidRequest(
                f"stale handle for {topic}/{queue} offset {offset}: the message was "
                "delivered again since (or its invisible time changed); use the newest handle"
            )
        return table, topic, queue, offset, epoch, lease

    def groups(self) -> Iterable[str]:
        return sorted({g for g, _, _ in self.tables})

    def counts(self) -> dict[tuple[str, str, int], PopCounts]:
        """(group, topic, queue) -> its lease counts (for metrics; one pass, no lists)."""
        out: dict[tuple[str, str, int], PopCounts] = {}
        for key, t in self.tables.items():
            c = PopCounts(dead_lettered=t.dead, retried=t.retried)
            for lease in t.leases.values():
                if lease.deadline < HELD:
                    c.invisible += 1
                elif lease.deadline == HELD:
                    c.held += 1
                elif lease.deadline == SUSPENDED:
                    c.suspended += 1
            out[key] = c
        return out


@dataclass(slots=True)
class PopCounts:
    """One queue's pop leases by state, and what left it for the retry and dead-letter
    topics."""

    invisible: int = 0
    held: int = 0
    suspended: int = 0
    dead_lettered: int = 0
    retried: int = 0
