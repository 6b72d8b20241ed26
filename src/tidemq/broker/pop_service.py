"""Pop consumption: many consumers share a queue; each message is leased to one at a time.

Per (group, topic, queue) the broker keeps a lease table (`PopQueue`):

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

Durability: every change is an operation record (`PopOp`) in the internal topic
`POP_TOPIC`, appended as the change is made and durable before the answer. The saved
state (every `service_checkpoint_interval_ms`) is the tables plus the op-topic offset they
include; a restart loads it and replays the op records from that offset. So neither an
acknowledged message nor an un-acknowledged one is forgotten: the first is never
delivered again, the second comes back after its lease. Retries and dead letters are
their own marks instead (one write per move): the restart's scan of the commit log from
the saved position finds them and finishes their leases.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from tidemq.broker.config import BrokerConfig
from tidemq.broker.long_polling import LongPolling
from tidemq.broker.pop_lease_book import LeaseBook, PopCounts
from tidemq.broker.pop_leases import HELD, SUSPENDED, PopOp, encode_handle
from tidemq.broker.pop_moves import EXHAUSTED_ACTIONS, PopMoves, Scheduler, dlq_topic
from tidemq.broker.pop_reads import PopReader
from tidemq.broker.pop_receive import PopReceiver
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.system_topics import MovedRecord
from tidemq.core.clock import Clock
from tidemq.core.errors import InvalidRequest
from tidemq.core.retry_headers import retry_topic
from tidemq.protocol.commands import (
    PopAckResponse,
    PopChangeInvisibleResponse,
    PopQueueStatus,
    PopReceiveRequest,
    PopReceiveResponse,
    PopResumeResponse,
    PopSuspended,
)
from tidemq.store.message_store import MessageStore

if TYPE_CHECKING:
    from tidemq.broker.tier_service import TierService

__all__ = ["PopCounts", "PopService", "Scheduler", "dlq_topic", "retry_topic"]


class PopService:
    """One broker's pop consumption: the lease book (`pop_lease_book`), receives
    (`pop_receive`), the moves to the retry and dead-letter topics (`pop_moves`), and the
    acks, changes and nacks here. On the broker's loop."""

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
        self._polling = polling
        self._is_fifo = is_fifo
        self._book = LeaseBook(gateway)
        self._reader = PopReader(gateway, logical_offset)
        self._moves = PopMoves(
            self._book,
            self._reader,
            gateway,
            polling=polling,
            clock=clock,
            ensure_topic=ensure_topic,
            schedule=schedule,
            logical_offset=logical_offset,
        )
        self._receiver = PopReceiver(
            config,
            self._book,
            self._reader,
            self._moves,
            gateway,
            polling=polling,
            clock=clock,
            queues_of=queues_of,
            is_fifo=is_fifo,
            pop_limit=pop_limit,
        )

    @property
    def tier(self) -> TierService | None:
        """Tiered storage's reads of offloaded offsets (None: not configured)."""
        return self._reader.tier

    @tier.setter
    def tier(self, tier: TierService | None) -> None:
        self._reader.tier = tier

    # ------------------------------------------------------------------ state

    @staticmethod
    def scan_position(saved: bytes | None) -> int:
        """Where the restart scan for retries and dead letters starts."""
        return LeaseBook.scan_position(saved)

    def rebuild(
        self, store: MessageStore, saved: bytes | None, moved: Iterable[MovedRecord]
    ) -> None:
        """Saved tables, then the op records since, then the retries and dead letters the
        log scan found (each finishes its lease, once). Runs before serving."""
        self._book.rebuild(store, saved, moved)

    def save_state(self, flushed_position: int) -> tuple[bytes, int, int]:
        """The state to save, the op-topic offset it includes (to trim below), and the
        log position the restart scans from (to keep the log from)."""
        return self._book.save_state(flushed_position)

    def finished_below(self, group: str, topic: str, queue: int) -> int:
        """Every message of the queue below this offset is finished for the group (acked,
        dead-lettered, or skipped by its filter); none of those from it on is leased."""
        return self._book.finished_below(group, topic, queue)

    def unfinished(self, topic: str, queue: int, below: int) -> list[str]:
        """The pop groups of the queue with messages below `below` not finished yet."""
        return self._book.unfinished(topic, queue, below)

    # ------------------------------------------------------------------ receive, resume

    # The coroutines of the parts themselves, not one more layer around them.

    def receive(self, req: PopReceiveRequest) -> Awaitable[tuple[PopReceiveResponse, bytes]]:
        return self._receiver.receive(req)

    def resume(self, group: str, message_id_text: str, action: str) -> Awaitable[PopResumeResponse]:
        """Resume a suspended message: deliver it again with a fresh count of attempts
        ("retry"), or move it to the dead-letter topic now ("dead-letter")."""
        return self._moves.resume(group, message_id_text, action)

    # ------------------------------------------------------------------ ack, change, nack

    async def ack(self, group: str, handles: list[str]) -> PopAckResponse:
        errors: list[str] = []
        ops: dict[tuple[str, int], PopOp] = {}
        for handle in handles:
            try:
                table, topic, queue, offset, epoch, _ = self._book.lease_for(group, handle)
            except InvalidRequest as exc:
                errors.append(str(exc))
                continue
            table.finish(offset)
            op = ops.get((topic, queue))
            if op is None:
                op = ops[(topic, queue)] = PopOp("ack", group, topic, queue, [])
            op.offsets.append(offset)
            op.epochs.append(epoch)
            errors.append("")
        await self._book.log_many(list(ops.values()))
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
        _, topic, queue, offset, _, _ = self._book.lease_for(group, handle)
        epoch = self._book.next_epoch()
        deadline = self._clock.now_ms() + invisible_ms
        op = PopOp("change", group, topic, queue, [offset], [epoch], [], deadline)
        self._book.apply(op)
        await self._book.log(op)
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
        table, topic, queue, offset, _, lease = self._book.lease_for(group, handle)
        if not release and not self._is_fifo(topic):
            lease.error = reason[:1000]
            if max_attempts and lease.attempt >= max_attempts:
                if on_exhausted == "suspend":
                    await self._moves.suspend(group, topic, queue, [offset], error=lease.error)
                else:
                    await self._moves.dead_letter(group, topic, queue, table, [offset])
            else:
                await self._moves.retry(group, table, (topic, queue, offset), lease, delay_ms)
            self._polling.notify({(topic, queue)})
            return
        attempt = lease.attempt - 1 if release else lease.attempt
        deadline = self._clock.now_ms() + (0 if release else delay_ms)
        # A fresh epoch that no handle carries: the message is back with the broker, so the
        # consumer's handle is stale from here on (a second nack or an ack is refused).
        epoch = self._book.next_epoch()
        op = PopOp(
            "nack", group, topic, queue, [offset], [epoch], [attempt], deadline, error=reason[:1000]
        )
        self._book.apply(op)
        await self._book.log(op)
        self._polling.notify({(topic, queue)})  # a parked receive may take it now

    def status(self, group: str) -> list[PopQueueStatus]:
        return [
            PopQueueStatus(
                topic=topic,
                queue=queue,
                acked_below=t.done.low,
                next_offset=t.next_offset,
                in_flight=sum(1 for ls in t.leases.values() if ls.deadline < HELD),
                dead_lettered=t.dead,
                retried=t.retried,
                suspended=[
                    PopSuspended(
                        offset=o,
                        message_id=self._reader.display_id(topic, queue, o),
                        attempts=ls.attempt,
                        error=ls.error,
                    )
                    for o, ls in sorted(t.leases.items())
                    if ls.deadline == SUSPENDED
                ],
            )
            for (g, topic, queue), t in sorted(self._book.tables.items())
            if g == group
        ]

    def groups(self) -> Iterable[str]:
        return self._book.groups()

    def counts(self) -> dict[tuple[str, str, int], PopCounts]:
        """(group, topic, queue) -> its lease counts (for metrics; one pass, no lists)."""
        return self._book.counts()
