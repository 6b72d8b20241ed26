"""Pop consumption: many consumers share a queue; each message is leased to one at a time.

Per (group, topic, queue) the broker keeps a lease table (`_PopQueue`):

* `next_offset`: the first offset never delivered to the group;
* `done`: a `DoneSet` of finished offsets (acknowledged, dead-lettered, or passed over by
  the group's filter); everything below its low watermark is finished;
* `leases`: offset -> (deadline, attempt, epoch). A leased message is invisible to the
  group's other consumers until its deadline; after it, the next receive delivers it
  again with attempt + 1. After `max_attempts` deliveries it goes to `%DLQ%<group>`,
  or, when the receive asks for it (`on_exhausted="suspend"`), stays suspended with the
  broker (on a FIFO topic, with its message group waiting behind it) until an operator
  resumes it (`resume`: retry with a fresh count, or dead-letter it now).

A consumer's `nack` on a plain topic moves the message to `%RETRY%<group>` through the
timer service: one schedule record in the timer topic, due after the retry delay, that
also names the lease it finishes (flag FROM_POP). Every receive of the group also takes
from its retry topic; a retried message keeps its id, topic and attempt count (headers
`tidemq.retry.*`). On a FIFO topic a nack stays in place (the lease's deadline moves),
because a copy elsewhere would let the message group's next message overtake it.

A lease's handle names (topic, queue, offset, epoch); epochs come from one counter of the
broker and are never reused, so a handle of an earlier lease (stale: the message was
delivered again since) or of another group (foreign) never touches a newer lease.

Durability: every change is an operation record (`_PopOp`) in the internal topic
`POP_TOPIC`, appended as the change is made and durable before the answer. The saved
state (every `service_checkpoint_interval_ms`) is the tables plus the op-topic offset they
include; a restart loads it and replays the op records from that offset. So neither an
acknowledged message nor an un-acknowledged one is forgotten: the first is never
delivered again, the second comes back after its lease. Retries and dead letters are
their own marks instead (one write per move): the restart's scan of the commit log from
the saved position finds them and finishes their leases.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import dataclasses
import heapq
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import msgspec

from tidemq.broker.config import BrokerConfig
from tidemq.broker.done_set import DoneSet
from tidemq.broker.filters import compile_filter, matches_messages, summary_mask
from tidemq.broker.filters import matches as record_matches
from tidemq.broker.groups import check_group_name
from tidemq.broker.long_polling import LongPolling
from tidemq.broker.moves import InFlightMoves
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.system_topics import MovedRecord, read_internal
from tidemq.core import names
from tidemq.core.batch import MessageRecord, decode_messages, encode_batch
from tidemq.core.clock import Clock
from tidemq.core.errors import InvalidRequest, TidemqError, TierUnavailable, TopicNotFound
from tidemq.core.filters import Sql92Filter, TagExpression
from tidemq.core.message import message_id, parse_message_id, record_offsets, topic_hash
from tidemq.core.properties import (
    POP_TOPIC,
    SystemProperties,
    decode_properties,
    encode_properties,
)
from tidemq.core.record import HEADER, RecordFlags, parse_header
from tidemq.core.retry_headers import (
    RETRY_ATTEMPTS_HEADER,
    RETRY_ERROR_HEADER,
    RETRY_HEADER_PREFIX,
    RETRY_ID_HEADER,
    RETRY_OFFSET_HEADER,
    RETRY_ORIGIN_HEADER,
    RETRY_PREFIX,
    RETRY_QUEUE_HEADER,
    RETRY_TOPIC_HEADER,
    format_retry_origin,
    parse_retry_origin,
    retry_topic,
)
from tidemq.protocol.commands import (
    PopAckResponse,
    PopChangeInvisibleResponse,
    PoppedMessage,
    PopQueueStatus,
    PopReceiveRequest,
    PopReceiveResponse,
    PopRecord,
    PopResumeResponse,
    PopSubscription,
    PopSuspended,
)
from tidemq.store.message_store import MessageStore, ReadResult, ReadStatus, StoredBatch

if TYPE_CHECKING:
    from tidemq.broker.tier_service import TierService

__all__ = ["PopCounts", "PopService", "Scheduler", "dlq_topic", "retry_topic"]

log = logging.getLogger(__name__)

#: Bytes read per queue per receive while looking for messages.
_READ_BYTES: Final = 1 << 20
#: The deadline of a FIFO message waiting behind an earlier one of its message group.
_HELD: Final = 1 << 62
#: The deadline of a suspended message (attempts used up, waiting for `resume`). Both
#: are never due: a lease with a deadline >= _HELD is parked, not in the expiry heap.
_SUSPENDED: Final = _HELD + 1
#: The deadline of a lease whose message is being moved to the retry topic (the schedule
#: record is not durable yet). Parked too; saved as due now, so that if the record never
#: became durable the restart delivers the message again.
_MOVING: Final = _HELD + 2
EXHAUSTED_ACTIONS: Final = ("dead-letter", "suspend")
RESUME_ACTIONS: Final = ("retry", "dead-letter")
#: Due leases one receive looks at (to deliver again, or to dead-letter when exhausted).
_MAX_DUE_SCAN: Final = 10_000
#: FIFO messages one receive may read past and hold back (behind their group's first).
_MAX_HELD_PER_RECEIVE: Final = 10_000
#: schedule(target topic, queue, payload, deliver-at ms, the lease it finishes)
Scheduler = Callable[[str, int, bytes, int, tuple[str, str, int, int]], Awaitable[object]]


def dlq_topic(group: str) -> str:
    return f"%DLQ%{group}"


class _PopOp(msgspec.Struct, array_like=True, omit_defaults=True):
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


#: `_take_new`'s limit when there is none.
_NO_LIMIT: Final = 1 << 62

#: The retry topic's filter: its messages passed a subscription's when first delivered.
_ALL: Final = compile_filter("tag", "*")

_OP_DECODER: Final = msgspec.msgpack.Decoder(_PopOp)
_HANDLE_DECODER: Final = msgspec.msgpack.Decoder(tuple[str, int, int, int])


@dataclass(slots=True)
class _Lease:
    deadline: int
    attempt: int
    epoch: int
    error: str = ""


@dataclass(slots=True)
class _PopQueue:
    next_offset: int
    done: DoneSet
    leases: dict[int, _Lease] = field(default_factory=dict)
    #: (deadline, offset, epoch), lazily pruned: an entry counts only while its lease
    #: still has that epoch and deadline.
    expiry: list[tuple[int, int, int]] = field(default_factory=list)
    dead: int = 0
    #: Messages a nack moved to the group's retry topic.
    retried: int = 0
    #: FIFO topics: per message group (its key, hex), its unfinished offsets in order. Only
    #: the first is ever leased; the others wait as leases with attempt 0 and a deadline
    #: that never comes (`_HELD`) until the one before them finishes.
    fifo_groups: dict[str, deque[int]] = field(default_factory=dict)
    fifo_of: dict[int, str] = field(default_factory=dict)

    def set_lease(self, offset: int, lease: _Lease) -> None:
        self.leases[offset] = lease
        if lease.deadline < _HELD:
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
        if head is not None and head.deadline == _HELD:
            head.deadline = 0
            heapq.heappush(self.expiry, (0, waiting[0], head.epoch))


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


def encode_handle(topic: str, queue: int, offset: int, epoch: int) -> str:
    raw = msgspec.msgpack.encode((topic, queue, offset, epoch))
    return base64.urlsafe_b64encode(raw).decode()


def decode_handle(handle: str) -> tuple[str, int, int, int]:
    try:
        return _HANDLE_DECODER.decode(base64.urlsafe_b64decode(handle.encode()))
    except (ValueError, msgspec.DecodeError, msgspec.ValidationError):
        raise InvalidRequest(f"not a receipt handle: {handle[:40]!r}") from None


class PopService:
    def __init__(
        self,
        config: BrokerConfig,
        gateway: StoreGateway,
        *,
        polling: LongPolling,
        clock: Clock,
        queues_of: Callable[[str], list[int]],
        ensure_topic: Callable[[str], Awaitable[None]],
        is_fifo: Callable[[str], bool],
        schedule: Scheduler,
        logical_offset: Callable[[str, int, int], int] = lambda topic, queue, offset: offset,
        pop_limit: Callable[[str, str, int], int | None] = lambda group, topic, queue: None,
    ) -> None:
        """`logical_offset`: a static topic's offset as clients know it (its chain's
        logical offset; the identity for other topics); retry and dead-letter headers
        name messages by it. `pop_limit(group, topic, queue)`: the offset a group's pop
        of the queue may not read past for now (static FIFO queues, `static_pop`)."""
        self._config = config
        self._clock = clock
        self._gateway = gateway
        self._polling = polling
        self._queues_of = queues_of
        self._ensure_topic = ensure_topic
        self._is_fifo = is_fifo
        self._schedule = schedule
        self._logical_offset = logical_offset
        self._pop_limit = pop_limit
        #: Tiered storage's reads of offloaded offsets (None: not configured).
        self.tier: TierService | None = None
        self._tables: dict[tuple[str, str, int], _PopQueue] = {}
        #: Retries and dead letters being written: the saved state's scan position stays
        #: at or before each until its lease is finished in the tables.
        self._moves = InFlightMoves()
        self._epoch = 0
        self._rr = 0

    # ------------------------------------------------------------------ state

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
                    self._apply(_OP_DECODER.decode(m.value))
                    replayed += 1
        finished = 0
        for moved_rec in moved:
            lease = moved_rec.props.pop_lease
            if moved_rec.flags & RecordFlags.FROM_POP and lease is not None:
                retried = bool(moved_rec.flags & RecordFlags.DELAYED)
                finished += self._finish_moved(*lease, retried=retried)
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
            table = _PopQueue(
                q.next_offset, DoneSet.restore(q.done), dead=q.dead, retried=q.retried
            )
            for offset, deadline, attempt, epoch in q.leases:
                table.set_lease(offset, _Lease(deadline, attempt, epoch))
            for g, offsets in q.fifo:
                for offset in offsets:
                    table.join_group(offset, g)
            for offset, error in q.errors:
                if offset in table.leases:
                    table.leases[offset].error = error
            self._tables[(q.group, q.topic, q.queue)] = table
        return state.op_offset

    def _finish_moved(
        self, group: str, topic: str, queue: int, offset: int, *, retried: bool
    ) -> int:
        """A retry or dead letter of (group, topic, queue, offset) exists: its lease is
        finished (once: a second sighting changes nothing)."""
        table = self._tables.get((group, topic, queue))
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
        position = self._moves.scan_position(flushed_position)
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
                    (o, 0 if ls.deadline == _MOVING else ls.deadline, ls.attempt, ls.epoch)
                    for o, ls in t.leases.items()
                ],
                t.dead,
                [(g, list(offsets)) for g, offsets in t.fifo_groups.items()],
                [(o, ls.error) for o, ls in t.leases.items() if ls.error],
                t.retried,
            )
            for (group, topic, queue), t in self._tables.items()
        ]
        state = _SavedState(op_offset, self._epoch, queues, position)
        return msgspec.msgpack.encode(state), op_offset, position

    def finished_below(self, group: str, topic: str, queue: int) -> int:
        """Every message of the queue below this offset is finished for the group (acked,
        dead-lettered, or skipped by its filter); none of those from it on is leased."""
        table = self._table(group, topic, queue)
        return min([table.next_offset, *table.leases])

    def unfinished(self, topic: str, queue: int, below: int) -> list[str]:
        """The pop groups of the queue with messages below `below` not finished yet."""
        return sorted(
            g
            for (g, t, q), table in self._tables.items()
            if t == topic and q == queue and min([table.next_offset, *table.leases]) < below
        )

    def _table(self, group: str, topic: str, queue: int) -> _PopQueue:
        key = (group, topic, queue)
        table = self._tables.get(key)
        if table is None:
            # A new group starts at the first retained message of each queue.
            low, _ = self._gateway.store.queue_bounds(topic, queue)
            table = self._tables[key] = _PopQueue(low, DoneSet(low))
        return table

    def _apply(self, op: _PopOp) -> None:
        """Apply one operation (live, after the change was decided, and in replay)."""
        table = self._tables.get((op.group, op.topic, op.queue))
        if table is None:
            start = min(op.offsets, default=op.next_offset)
            table = self._tables[(op.group, op.topic, op.queue)] = _PopQueue(start, DoneSet(start))
        for epoch in op.epochs:
            self._epoch = max(self._epoch, epoch)
        _APPLY[op.kind](table, op)

    async def _log(self, op: _PopOp) -> None:
        """Make `op` durable (it is applied already)."""
        await self._log_many([op])

    async def _log_many(self, ops: list[_PopOp]) -> None:
        """Make `ops` durable, in one record (one flush)."""
        if not ops:
            return
        payload = encode_batch(
            [MessageRecord(msgspec.msgpack.encode(op), None, None, (), (), 0) for op in ops]
        )
        await self._gateway.append(POP_TOPIC, 0, payload, flags=RecordFlags.CONTROL)

    def _next_epoch(self) -> int:
        self._epoch += 1
        return self._epoch

    # ------------------------------------------------------------------ receive

    def _first_stored(
        self,
        topic: str,
        queue: int,
        offset: int,
        found: tuple[MessageRecord, tuple[str, int, int] | None],
    ) -> _Origin:
        """Where the message was first stored, by the offset clients know it by."""
        origin = _first_stored_here(topic, queue, offset, found)
        if topic.startswith(RETRY_PREFIX):
            return origin  # its headers carry the first place, as clients know it
        return dataclasses.replace(origin, offset=self._logical_offset(topic, queue, offset))

    async def receive(self, req: PopReceiveRequest) -> tuple[PopReceiveResponse, bytes]:
        cfg = self._config
        _check_group(req.group)
        if not 1 <= req.max_messages <= cfg.pop_max_messages:
            raise InvalidRequest(f"max_messages must be 1..{cfg.pop_max_messages}")
        if not cfg.pop_min_invisible_ms <= req.invisible_ms <= cfg.pop_max_invisible_ms:
            raise InvalidRequest(
                f"invisible duration must be {cfg.pop_min_invisible_ms / 1000:g} s to "
                f"{cfg.pop_max_invisible_ms / 1000:g} s, got {req.invisible_ms / 1000:g} s"
            )
        if not 1 <= req.max_attempts <= cfg.pop_max_attempts_limit:
            raise InvalidRequest(f"max_attempts must be 1..{cfg.pop_max_attempts_limit}")
        if req.on_exhausted not in EXHAUSTED_ACTIONS:
            raise InvalidRequest(
                f"on_exhausted must be one of {', '.join(EXHAUSTED_ACTIONS)}, "
                f"got {req.on_exhausted!r}"
            )
        if not 0 <= req.max_wait_ms <= cfg.max_fetch_wait_ms:
            raise InvalidRequest(f"max_wait_ms must be 0..{cfg.max_fetch_wait_ms}")
        if not req.subscriptions:
            raise InvalidRequest("a receive needs at least one subscription")
        queues = self._subscribed_queues(req.group, req.subscriptions)
        deadline = time.monotonic() + req.max_wait_ms / 1000
        while True:
            seen = {(t, q): self._polling.version((t, q)) for t, q, _ in queues}
            response, body = await self._receive_once(req, queues)
            if response.messages:
                return response, body
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return response, body
            # Wake for new data, or when the earliest lease of these queues runs out.
            wait = min(remaining, self._next_expiry_s(req.group, queues))
            await self._polling.wait_any(seen, wait)

    def _subscribed_queues(
        self, group: str, subscriptions: list[PopSubscription]
    ) -> list[tuple[str, int, TagExpression | Sql92Filter]]:
        """The queues a receive takes from: the subscribed topics' queues on this broker,
        and the group's retry topic once it exists (its messages passed a subscription's
        filter when first delivered, so they are not filtered again)."""
        out = []
        for sub in subscriptions:
            flt = compile_filter(sub.kind, sub.expression)
            for q in self._queues_of(sub.topic):
                out.append((sub.topic, q, flt))
        try:
            retry_queues = self._queues_of(retry_topic(group))
        except TopicNotFound:
            retry_queues = []
        out.extend((retry_topic(group), q, _ALL) for q in retry_queues)
        return out

    def _next_expiry_s(
        self, group: str, queues: list[tuple[str, int, TagExpression | Sql92Filter]]
    ) -> float:
        now = self._clock.now_ms()
        soonest = 1.0
        for topic, q, _ in queues:
            table = self._tables.get((group, topic, q))
            if table is not None and table.expiry:
                soonest = min(soonest, max(0.0, (table.expiry[0][0] - now) / 1000))
        return max(soonest, 0.005)

    async def _receive_once(
        self, req: PopReceiveRequest, queues: list[tuple[str, int, TagExpression | Sql92Filter]]
    ) -> tuple[PopReceiveResponse, bytes]:
        want = req.max_messages
        records: list[PopRecord] = []
        bodies: list[bytes] = []
        messages: list[PoppedMessage] = []
        n = len(queues)
        self._rr += 1
        ops: list[_PopOp] = []
        for i in range(n):
            if len(messages) >= want:
                break
            topic, q, flt = queues[(self._rr + i) % n]
            got, popped, op = await self._receive_queue(req, topic, q, flt, want - len(messages))
            for record in got:
                records.append(PopRecord(topic=topic, queue=q, size=len(record)))
                bodies.append(record)
            messages.extend(popped)
            if op is not None:
                ops.append(op)
        try:
            await self._log_many(ops)  # one flush makes every queue's leases durable
        except TidemqError:
            for op in ops:  # not durable: hand them out again at once
                table = self._tables[(op.group, op.topic, op.queue)]
                for offset in op.offsets:
                    lease = table.leases.get(offset)
                    if lease is not None:
                        lease.deadline = 0
                        heapq.heappush(table.expiry, (0, offset, lease.epoch))
            raise
        return PopReceiveResponse(records=records, messages=messages), b"".join(bodies)

    async def _receive_queue(
        self,
        req: PopReceiveRequest,
        topic: str,
        queue: int,
        flt: TagExpression | Sql92Filter,
        want: int,
    ) -> tuple[list[bytes], list[PoppedMessage], _PopOp | None]:
        """Lease up to `want` messages of one queue: due redeliveries first, then new
        ones. Returns the records holding them, the leases, and the operation to log
        (applied already; the caller makes it durable before answering)."""
        store = self._gateway.store
        table = self._table(req.group, topic, queue)
        now = self._clock.now_ms()
        chosen, exhausted = _take_due(table, want, req.max_attempts, now)
        if exhausted:
            # Dead-letter (or suspend) first (a dead letter may free the next message of a
            # FIFO group), with the entries taken so far back in the heap meanwhile.
            _push_back(table, [o for o, _ in chosen])
            try:
                if req.on_exhausted == "suspend":
                    await self._suspend(req.group, topic, queue, exhausted)
                else:
                    await self._dead_letter(req.group, topic, queue, table, exhausted)
            except BaseException:
                _push_back(table, exhausted)
                raise
            chosen, later = _take_due(table, want, req.max_attempts, now)
            _push_back(table, later)  # beyond the scan limit: dead-lettered by a later receive
        taken = _Taken(chosen, [""] * len(chosen))
        start_next = table.next_offset
        fifo = self._is_fifo(topic)
        limit = self._pop_limit(req.group, topic, queue) if fifo else None
        first = await self._read_tier_first(topic, queue, table.next_offset, flt)
        records, next_offset = _take_new(
            store,
            topic,
            queue,
            read=_queue_reader(store, topic, queue, first, tiered=self.tier is not None),
            flt=flt,
            next_offset=table.next_offset,
            taken=taken,
            want=want,
            fifo_table=table if fifo else None,
            limit=_NO_LIMIT if limit is None else limit,  # 0 is a limit
        )
        if not chosen and next_offset == start_next:
            return [], [], None
        if topic.startswith(RETRY_PREFIX):
            # A retried message goes on counting the deliveries it had before its retry.
            chosen = [
                (o, a + _earlier_attempts(records, o) if o >= start_next else a) for o, a in chosen
            ]
        deadline = now + req.invisible_ms
        epochs = [self._next_epoch() for _ in chosen]
        op = _PopOp(
            "lease",
            req.group,
            topic,
            queue,
            [o for o, _ in chosen],
            epochs,
            [a for _, a in chosen],
            deadline,
            next_offset,
            groups=taken.groups if fifo else [],
            held=taken.held,
            held_groups=taken.held_groups,
        )
        self._apply(op)
        for offset, _ in chosen:
            if not any(offset in _offsets(r) for r in records.values()):
                found = await self._read_one(topic, queue, offset)
                if found is not None:
                    records[found.base_offset] = found.record
        popped = [
            PoppedMessage(
                topic=topic,
                queue=queue,
                offset=offset,
                attempt=attempt,
                handle=encode_handle(topic, queue, offset, epoch),
                deadline_ms=deadline,
            )
            for (offset, attempt), epoch in zip(chosen, epochs, strict=True)
        ]
        return [r for _, r in sorted(records.items())], popped, op

    async def _read_tier_first(
        self, topic: str, queue: int, offset: int, flt: TagExpression | Sql92Filter
    ) -> ReadResult | None:
        """The first read of a receive, from the object store when `offset` is only
        there (tiered storage); None when the store holds it (or no tier is set)."""
        store = self._gateway.store
        info, index = store.index_of(topic, queue)
        if self.tier is None or offset >= index.min_offset or (info.id, queue) not in store.remote:
            return None  # the usual case, known from the index alone: no read here
        mask = summary_mask(flt)
        result = store.read(topic, queue, offset, max_bytes=1, tag_mask=mask)
        if result.status is not ReadStatus.REMOTE:
            return None
        got = await self.tier.reads.read(store.topic(topic), queue, offset, _READ_BYTES, mask)
        if got is None:  # remote retention removed it meanwhile: the store says so
            return None
        batches, next_offset = got
        status = ReadStatus.FOUND if batches else ReadStatus.NO_NEW_MESSAGE
        return ReadResult(status, batches, next_offset, result.min_offset, result.max_offset)

    async def _read_one(self, topic: str, queue: int, offset: int) -> StoredBatch | None:
        """The stored batch holding `offset` (a redelivery), from the tier if need be."""
        store = self._gateway.store
        found = store.read(topic, queue, offset, max_bytes=1)
        if found.status is ReadStatus.REMOTE and self.tier is not None:
            got = await self.tier.reads.read(store.topic(topic), queue, offset, 1, 0)
            return got[0][0] if got and got[0] else None
        return found.batches[0] if found.batches else None

    async def _message_at(
        self, topic: str, queue: int, offset: int
    ) -> tuple[MessageRecord, tuple[str, int, int] | None] | None:
        """`_read_message`, from the tier too (a message leased from offloaded data)."""
        found = await self._read_one(topic, queue, offset)
        return None if found is None else _message_of(found, offset)

    async def _dead_letter(
        self, group: str, topic: str, queue: int, table: _PopQueue, offsets: list[int]
    ) -> None:
        """Move messages that used up their attempts to the group's dead-letter topic.
        Each dead letter names the lease it finishes (FROM_POP), so it is its own mark: a
        crash after it is durable cannot dead-letter the message twice."""
        store = self._gateway.store
        dlq = dlq_topic(group)
        await self._ensure_topic(dlq)
        items: list[tuple[str, int, bytes | memoryview, bytes, int]] = []
        moving: list[int] = []
        for offset in offsets:
            found = await self._message_at(topic, queue, offset)
            if found is None:
                continue
            m, _ = found
            lease = table.leases.get(offset)
            origin = self._first_stored(topic, queue, offset, found)
            extra = (
                ("tidemq.dlq.topic", origin.topic.encode()),
                ("tidemq.dlq.queue", str(origin.queue).encode()),
                ("tidemq.dlq.offset", str(origin.offset).encode()),
                ("tidemq.dlq.message_id", origin.message_id.encode()),
                ("tidemq.dlq.attempts", str(lease.attempt if lease else 0).encode()),
                ("tidemq.dlq.error", (lease.error if lease else "").encode()),
            )
            headers = tuple(h for h in m.headers if not h[0].startswith(RETRY_HEADER_PREFIX))
            record = MessageRecord(m.value, m.key, m.tag, m.keys, headers + extra, m.timestamp_ms)
            props = SystemProperties(pg=group, pt=topic, pq=queue, po=offset)
            items.append(
                (dlq, 0, encode_batch([record]), encode_properties(props), RecordFlags.FROM_POP)
            )
            moving.append(offset)
        with self._moves.writing(store):
            results, error = await self._gateway.append_many(items)
            done = moving[: len(results)]
            if done:
                self._apply(_PopOp("dlq", group, topic, queue, done))  # the records are the log
        if done:
            log.info("moved %d messages of %s/%d to %s", len(done), topic, queue, dlq)
        if error is not None:
            raise error

    async def _suspend(
        self, group: str, topic: str, queue: int, offsets: list[int], *, error: str = ""
    ) -> None:
        # Fresh epochs: the consumer's handles are stale from here on, so only `resume`
        # (an operator's decision) brings a suspended message back.
        epochs = [self._next_epoch() for _ in offsets]
        op = _PopOp("suspend", group, topic, queue, offsets, epochs, error=error)
        self._apply(op)
        await self._log(op)
        log.warning(
            "suspended %d message(s) of %s/%d for group %s after their last attempt",
            len(offsets),
            topic,
            queue,
            group,
        )

    async def resume(self, group: str, message_id_text: str, action: str) -> PopResumeResponse:
        """Resume a suspended message: deliver it again with a fresh count of attempts
        ("retry"), or move it to the dead-letter topic now ("dead-letter")."""
        if action not in RESUME_ACTIONS:
            raise InvalidRequest(
                f"action must be one of {', '.join(RESUME_ACTIONS)}, got {action!r}"
            )
        try:
            wanted_hash, queue, offset = parse_message_id(message_id_text)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        for (g, topic, q), table in self._tables.items():
            if g != group:
                continue
            at = offset
            ours = q == queue and topic_hash(topic) == wanted_hash
            if not ours and not topic.startswith(RETRY_PREFIX):
                continue
            if not ours or self._logical_offset(topic, q, offset) != offset:
                # A retried message is known by the id it had before its first retry; a
                # static topic's by its logical offset.
                at = next(
                    (
                        o
                        for o, ls in table.leases.items()
                        if ls.deadline == _SUSPENDED
                        and self._display_id(topic, q, o) == message_id_text
                    ),
                    -1,
                )
            lease = table.leases.get(at)
            if lease is None or lease.deadline != _SUSPENDED:
                continue
            if action == "retry":
                op = _PopOp("resume", group, topic, queue, [at], [self._next_epoch()])
                self._apply(op)
                await self._log(op)
            else:
                await self._dead_letter(group, topic, queue, table, [at])
            self._polling.notify({(topic, queue)})
            return PopResumeResponse(topic=topic, queue=queue, offset=at, action=action)
        raise InvalidRequest(f"no suspended message {message_id_text} for group {group!r}")

    # ------------------------------------------------------------------ ack, change, nack

    def _lease_for(self, group: str, handle: str) -> tuple[_PopQueue, str, int, int, int, _Lease]:
        topic, queue, offset, epoch = decode_handle(handle)
        table = self._tables.get((group, topic, queue))
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

    async def ack(self, group: str, handles: list[str]) -> PopAckResponse:
        errors: list[str] = []
        ops: dict[tuple[str, int], _PopOp] = {}
        for handle in handles:
            try:
                table, topic, queue, offset, epoch, _ = self._lease_for(group, handle)
            except InvalidRequest as exc:
                errors.append(str(exc))
                continue
            table.finish(offset)
            op = ops.get((topic, queue))
            if op is None:
                op = ops[(topic, queue)] = _PopOp("ack", group, topic, queue, [])
            op.offsets.append(offset)
            op.epochs.append(epoch)
            errors.append("")
        await self._log_many(list(ops.values()))
        if any(self._is_fifo(t) for t, _ in ops):
            self._polling.notify(set(ops))  # an ack may free the next message of a group
        return PopAckResponse(errors=errors)

    async def change_invisible(
        self, group: str, handle: str, invisible_ms: int
    ) -> PopChangeInvisibleResponse:
        cfg = self._config
        if not cfg.pop_min_invisible_ms <= invisible_ms <= cfg.pop_max_invisible_ms:
            raise InvalidRequest(
                f"invisible duration must be {cfg.pop_min_invisible_ms / 1000:g} s to "
                f"{cfg.pop_max_invisible_ms / 1000:g} s"
            )
        _, topic, queue, offset, _, _ = self._lease_for(group, handle)
        epoch = self._next_epoch()
        deadline = self._clock.now_ms() + invisible_ms
        op = _PopOp("change", group, topic, queue, [offset], [epoch], [], deadline)
        self._apply(op)
        await self._log(op)
        return PopChangeInvisibleResponse(
            handle=encode_handle(topic, queue, offset, epoch), deadline_ms=deadline
        )

    async def nack(
        self,
        group: str,
        handle: str,
        delay_ms: int,
        *,
        release: bool,
        reason: str,
        max_attempts: int = 0,
        on_exhausted: str = "dead-letter",
    ) -> None:
        """Give a leased message back. `release`: at once, not counting the delivery.
        Otherwise the delivery counts; on a plain topic the message moves to the group's
        retry topic, due after `delay_ms` (or, when it had `max_attempts` deliveries, to
        the dead-letter topic now, or it is suspended); on a FIFO topic its lease's
        deadline moves, so its message group waits for it."""
        cfg = self._config
        if not 0 <= delay_ms <= cfg.pop_max_invisible_ms:
            raise InvalidRequest(f"delay must be 0..{cfg.pop_max_invisible_ms / 1000:g} s")
        if not 0 <= max_attempts <= cfg.pop_max_attempts_limit:
            raise InvalidRequest(f"max_attempts must be 0..{cfg.pop_max_attempts_limit}")
        if on_exhausted not in EXHAUSTED_ACTIONS:
            raise InvalidRequest(
                f"on_exhausted must be one of {', '.join(EXHAUSTED_ACTIONS)}, got {on_exhausted!r}"
            )
        table, topic, queue, offset, _, lease = self._lease_for(group, handle)
        if not release and not self._is_fifo(topic):
            lease.error = reason[:1000]
            if max_attempts and lease.attempt >= max_attempts:
                if on_exhausted == "suspend":
                    await self._suspend(group, topic, queue, [offset], error=lease.error)
                else:
                    await self._dead_letter(group, topic, queue, table, [offset])
            else:
                await self._retry(group, table, (topic, queue, offset), lease, delay_ms)
            self._polling.notify({(topic, queue)})
            return
        attempt = lease.attempt - 1 if release else lease.attempt
        deadline = self._clock.now_ms() + (0 if release else delay_ms)
        # A fresh epoch that no handle carries: the message is back with the broker, so the
        # consumer's handle is stale from here on (a second nack or an ack is refused).
        epoch = self._next_epoch()
        op = _PopOp(
            "nack", group, topic, queue, [offset], [epoch], [attempt], deadline, error=reason[:1000]
        )
        self._apply(op)
        await self._log(op)
        self._polling.notify({(topic, queue)})  # a parked receive may take it now

    async def _retry(
        self,
        group: str,
        table: _PopQueue,
        where: tuple[str, int, int],
        lease: _Lease,
        delay_ms: int,
    ) -> None:
        """Move a message to `%RETRY%<group>`, due in `delay_ms`: one timer schedule record
        that names the lease it finishes. Until it is durable the lease is parked (no
        receive takes it, every handle of it is stale); if the write fails it is due now."""
        topic, queue, offset = where
        store = self._gateway.store
        found = await self._message_at(topic, queue, offset)
        if found is None:
            raise InvalidRequest(f"{topic}/{queue} offset {offset} is no longer stored")
        m, _ = found
        origin = self._first_stored(topic, queue, offset, found)
        headers = tuple(h for h in m.headers if not h[0].startswith(RETRY_HEADER_PREFIX))
        headers += (
            (RETRY_TOPIC_HEADER, origin.topic.encode()),
            (RETRY_QUEUE_HEADER, str(origin.queue).encode()),
            (RETRY_OFFSET_HEADER, str(origin.offset).encode()),
            (RETRY_ID_HEADER, origin.message_id.encode()),
            (RETRY_ATTEMPTS_HEADER, str(lease.attempt).encode()),
            (RETRY_ERROR_HEADER, lease.error.encode()),
        )
        if origin.id_origin is not None:
            headers += ((RETRY_ORIGIN_HEADER, format_retry_origin(origin.id_origin).encode()),)
        payload = encode_batch(
            [MessageRecord(m.value, m.key, m.tag, m.keys, headers, m.timestamp_ms)]
        )
        target = retry_topic(group)
        await self._ensure_topic(target)
        key = (group, topic, queue, offset)
        lease.deadline, lease.epoch = _MOVING, self._next_epoch()
        due = self._clock.now_ms() + delay_ms

        async def move() -> None:
            with self._moves.writing(store):
                try:
                    await self._schedule(target, 0, payload, due, key)
                except BaseException:
                    lease.deadline = self._clock.now_ms()  # not moved: deliver it again here
                    heapq.heappush(table.expiry, (lease.deadline, offset, lease.epoch))
                    raise
                self._finish_moved(group, topic, queue, offset, retried=True)

        # Once the record is written the move must finish even if this request is
        # cancelled (its connection closed): shielded, and its outcome always retrieved.
        task = asyncio.ensure_future(move())
        task.add_done_callback(_retrieve)
        await asyncio.shield(task)

    def status(self, group: str) -> list[PopQueueStatus]:
        return [
            PopQueueStatus(
                topic=topic,
                queue=queue,
                acked_below=t.done.low,
                next_offset=t.next_offset,
                in_flight=sum(1 for ls in t.leases.values() if ls.deadline < _HELD),
                dead_lettered=t.dead,
                retried=t.retried,
                suspended=[
                    PopSuspended(
                        offset=o,
                        message_id=self._display_id(topic, queue, o),
                        attempts=ls.attempt,
                        error=ls.error,
                    )
                    for o, ls in sorted(t.leases.items())
                    if ls.deadline == _SUSPENDED
                ],
            )
            for (g, topic, queue), t in sorted(self._tables.items())
            if g == group
        ]

    def _display_id(self, topic: str, queue: int, offset: int) -> str:
        """The id a consumer knows a message by (for a retried one, its first id)."""
        if topic.startswith(RETRY_PREFIX):
            found = _read_message(self._gateway.store, topic, queue, offset)
            if found is not None:
                return self._first_stored(topic, queue, offset, found).message_id
        return message_id(topic, queue, self._logical_offset(topic, queue, offset))

    def groups(self) -> Iterable[str]:
        return sorted({g for g, _, _ in self._tables})

    def counts(self) -> dict[tuple[str, str, int], PopCounts]:
        """(group, topic, queue) -> its lease counts (for metrics; one pass, no lists)."""
        out: dict[tuple[str, str, int], PopCounts] = {}
        for key, t in self._tables.items():
            c = PopCounts(dead_lettered=t.dead, retried=t.retried)
            for lease in t.leases.values():
                if lease.deadline < _HELD:
                    c.invisible += 1
                elif lease.deadline == _HELD:
                    c.held += 1
                elif lease.deadline == _SUSPENDED:
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


def _apply_lease(table: _PopQueue, op: _PopOp) -> None:
    leased = set(op.offsets) | set(op.held)
    for i, offset in enumerate(op.offsets):
        if op.groups and op.groups[i] and offset not in table.fifo_of:
            table.join_group(offset, op.groups[i])
        table.set_lease(offset, _Lease(op.deadline, op.attempts[i], op.epochs[i]))
    for offset, group in zip(op.held, op.held_groups, strict=True):
        table.join_group(offset, group)
        table.set_lease(offset, _Lease(_HELD, 0, 0))
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


def _apply_ack(table: _PopQueue, op: _PopOp) -> None:
    for offset in op.offsets:
        table.finish(offset)


def _apply_dlq(table: _PopQueue, op: _PopOp) -> None:
    _apply_ack(table, op)
    table.dead += len(op.offsets)


def _apply_change(table: _PopQueue, op: _PopOp) -> None:
    lease = table.leases.get(op.offsets[0])
    if lease is not None:
        lease.deadline, lease.epoch = op.deadline, op.epochs[0]
        heapq.heappush(table.expiry, (op.deadline, op.offsets[0], op.epochs[0]))


def _apply_nack(table: _PopQueue, op: _PopOp) -> None:
    lease = table.leases.get(op.offsets[0])
    if lease is not None:
        lease.deadline, lease.attempt, lease.error = op.deadline, op.attempts[0], op.error
        if op.epochs:
            lease.epoch = op.epochs[0]
        heapq.heappush(table.expiry, (op.deadline, op.offsets[0], lease.epoch))


def _apply_suspend(table: _PopQueue, op: _PopOp) -> None:
    for i, offset in enumerate(op.offsets):
        lease = table.leases.get(offset)
        if lease is not None:
            lease.deadline = _SUSPENDED
            if op.epochs:
                lease.epoch = op.epochs[i]
            if op.error:  # the last nack's reason, when that nack suspended it
                lease.error = op.error


def _apply_resume(table: _PopQueue, op: _PopOp) -> None:
    lease = table.leases.get(op.offsets[0])
    if lease is not None and lease.deadline == _SUSPENDED:
        lease.deadline, lease.attempt, lease.epoch = 0, 0, op.epochs[0]
        heapq.heappush(table.expiry, (0, op.offsets[0], lease.epoch))


_APPLY: Final[dict[str, Callable[[_PopQueue, _PopOp], None]]] = {
    "lease": _apply_lease,
    "ack": _apply_ack,
    "dlq": _apply_dlq,
    "change": _apply_change,
    "nack": _apply_nack,
    "suspend": _apply_suspend,
    "resume": _apply_resume,
}


def _push_back(table: _PopQueue, offsets: list[int]) -> None:
    """Put taken-but-unused leases back into the expiry heap."""
    for offset in offsets:
        lease = table.leases.get(offset)
        if lease is not None and lease.deadline < _HELD:
            heapq.heappush(table.expiry, (lease.deadline, offset, lease.epoch))


def _take_due(
    table: _PopQueue, want: int, max_attempts: int, now: int
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
    _push_back(table, later)
    return chosen, to_dlq


@dataclass(slots=True)
class _Taken:
    """What one receive takes from a queue: (offset, attempt) pairs to lease, the message
    group of each (FIFO topics; "" otherwise), and FIFO messages held back."""

    chosen: list[tuple[int, int]]
    groups: list[str] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    held_groups: list[str] = field(default_factory=list)


def _take_new(
    store: MessageStore,
    topic: str,
    queue: int,
    *,
    read: Callable[[int, int], ReadResult],
    flt: TagExpression | Sql92Filter,
    next_offset: int,
    taken: _Taken,
    want: int,
    fifo_table: _PopQueue | None,
    limit: int = _NO_LIMIT,
) -> tuple[dict[int, bytes], int]:
    """Add never-delivered messages that pass the filter to `taken` (up to `want`);
    returns the records read (by base offset) and the new next offset. With `fifo_table`
    (a FIFO topic), a message whose group (its key) has an earlier unfinished message is
    held back instead, and at most one message per group is taken. Nothing at or past
    `limit` is read. `read(offset, tag_mask)` reads the queue (`_queue_reader`)."""
    records: dict[int, bytes] = {}
    chosen = taken.chosen
    end = min(store.queue_bounds(topic, queue)[1], limit)
    while len(chosen) < want and next_offset < end and len(taken.held) < _MAX_HELD_PER_RECEIVE:
        result = read(next_offset, summary_mask(flt))
        if result.status is ReadStatus.OFFSET_OUT_OF_RANGE:
            if next_offset >= result.min_offset:
                break
            next_offset = result.min_offset  # retention removed the ones before
            continue
        if result.status is not ReadStatus.FOUND:
            return records, max(next_offset, result.next_offset)
        for batch in result.batches:
            if fifo_table is None:
                matches, keys = record_matches(batch.record, flt), None
            else:  # decode once for both the keys and the filter
                header = parse_header(batch.record)
                decoded = decode_messages(memoryview(batch.record)[header.payload_start :])
                matches = matches_messages(decoded, flt)
                keys = [m.key.hex() if m.key else "" for m in decoded]
            offsets = record_offsets(batch.record)  # a compacted batch may skip offsets
            for i in range(bisect.bisect_left(offsets, next_offset), batch.count):
                if len(chosen) >= want or offsets[i] >= limit:
                    return records, next_offset
                offset = offsets[i]
                next_offset = offset + 1
                if matches is not None and not matches[i]:
                    continue
                group = keys[i] if keys is not None else ""
                if group and fifo_table is not None and fifo_table.busy(group):
                    taken.held.append(offset)
                    taken.held_groups.append(group)
                    continue
                chosen.append((offset, 1))
                taken.groups.append(group)
                records[batch.base_offset] = batch.record
                if group and fifo_table is not None:
                    fifo_table.join_group(offset, group)  # busy from here on
        next_offset = max(next_offset, result.next_offset)
    return records, next_offset


def _retrieve(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("a move to the retry topic failed: %s", task.exception())


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where a message was first stored (a retried one: before its first retry) and the id
    a consumer knows it by; `id_origin` when that id comes from an internal topic (a
    delayed or transactional message)."""

    topic: str
    queue: int
    offset: int
    id_origin: tuple[str, int, int] | None

    @property
    def message_id(self) -> str:
        if self.id_origin is not None:
            return message_id(*self.id_origin)
        return message_id(self.topic, self.queue, self.offset)


def _queue_reader(
    store: MessageStore, topic: str, queue: int, first: ReadResult | None, *, tiered: bool
) -> Callable[[int, int], ReadResult]:
    """`_take_new`'s reads of a queue: `first` (read from the tier by the caller) for the
    first call, then the store. An offset that is only in the tier ends the receive's
    scan (the next receive reads it from the tier first); without a tier it is an error."""
    pending = [] if first is None else [first]

    def read(offset: int, tag_mask: int) -> ReadResult:
        if pending:
            return pending.pop()
        result = store.read(topic, queue, offset, max_bytes=_READ_BYTES, tag_mask=tag_mask)
        if result.status is not ReadStatus.REMOTE:
            return result
        if not tiered:
            raise TierUnavailable(
                f"offset {offset} of {topic}/{queue} is in the object store, and tiered "
                "storage (tiered.url) is not set on this broker"
            )
        return ReadResult(
            ReadStatus.NO_NEW_MESSAGE, [], offset, result.min_offset, result.max_offset
        )

    return read


def _read_message(
    store: MessageStore, topic: str, queue: int, offset: int
) -> tuple[MessageRecord, tuple[str, int, int] | None] | None:
    """The message at `offset`, and the id origin its record names (delivered by the
    timer, published by a transaction), or None if it is no longer stored locally."""
    found = store.read(topic, queue, offset, max_bytes=1)
    return _message_of(found.batches[0], offset) if found.batches else None


def _message_of(
    b: StoredBatch, offset: int
) -> tuple[MessageRecord, tuple[str, int, int] | None] | None:
    """The message at `offset` of stored batch `b`, and its id origin (see above)."""
    offsets = record_offsets(b.record)
    i = bisect.bisect_left(offsets, offset)
    if i == len(offsets) or offsets[i] != offset:
        return None  # no longer stored (retention, or compaction removed it)
    header = parse_header(b.record)
    props = decode_properties(memoryview(b.record)[HEADER.size : header.payload_start])
    messages = decode_messages(memoryview(b.record)[header.payload_start :])
    origin = props.origin
    return messages[i], None if origin is None else (origin[0], origin[1], origin[2] + i)


def _first_stored_here(
    topic: str,
    queue: int,
    offset: int,
    found: tuple[MessageRecord, tuple[str, int, int] | None],
) -> _Origin:
    message, id_origin = found
    first_topic = _header(message, RETRY_TOPIC_HEADER)
    if not topic.startswith(RETRY_PREFIX) or first_topic is None:
        return _Origin(topic, queue, offset, id_origin)
    first_queue = _header(message, RETRY_QUEUE_HEADER) or ""
    first_offset = _header(message, RETRY_OFFSET_HEADER) or ""
    if not first_queue.isdigit() or not first_offset.isdigit():
        return _Origin(topic, queue, offset, id_origin)
    return _Origin(
        first_topic,
        int(first_queue),
        int(first_offset),
        parse_retry_origin(_header(message, RETRY_ORIGIN_HEADER)),
    )


def _check_group(group: str) -> None:
    # A pop group names its %RETRY%<group> and %DLQ%<group> topics: a user name only
    # (`tidemq.core.names`, the rule every group follows), never an internal one.
    check_group_name(group)
    problem = names.user_name_problem(group, group=True)
    if problem is not None:
        raise InvalidRequest(f"group name {group!r} {problem}; use {names.NAME_RULE}")


def _earlier_attempts(records: dict[int, bytes], offset: int) -> int:
    """Deliveries a message of a retry topic had before it was retried (its header)."""
    message = _message_in(records, offset)
    if message is None:
        return 0
    value = _header(message, RETRY_ATTEMPTS_HEADER)
    return int(value) if value is not None and value.isdigit() else 0


def _message_in(records: dict[int, bytes], offset: int) -> MessageRecord | None:
    for base, record in records.items():
        header = parse_header(record)
        if base <= offset < base + header.count:
            return decode_messages(memoryview(record)[header.payload_start :])[offset - base]
    return None


def _header(message: MessageRecord, name: str) -> str | None:
    for key, value in message.headers:
        if key == name:
            return bytes(value).decode(errors="replace")
    return None


def _offsets(record: bytes) -> range | set[int]:
    """The offsets a record holds, for membership tests."""
    header = parse_header(record)
    if not header.flags & RecordFlags.COMPACTED:
        return range(header.base_offset, header.base_offset + header.count)
    return set(record_offsets(record))
