"""The ordered sender of one queue: a window of batches in flight, answered in order.

* Every batch for one (topic, queue) goes through its `QueueSender`, in the order the
  producer accepted the sends: `add` appends, the sender task sends from the head, and
  receipts are resolved in that order.
* Up to `window` batches in flight (for an idempotent producer, no more than the broker
  remembers per (producer, queue), which it says when it hands out the producer id).
* A retriable failure (connection lost, timeout, disk full, no route) waits for the
  window to settle, backs off, re-reads routes and resends every unacknowledged batch in
  order; with idempotence each carries (producer id, epoch, sequence), so a resent batch
  that was in fact stored gets its first offsets back instead of being written twice.
* Producer ids belong to a broker by its name, not its address: a broker that comes back
  at another address (a replica group's next leader serves under the group's name) has
  the same store, so resent batches keep their id and sequence there and are deduplicated
  against the copies the group already holds.
* A special batch (delayed or transactional) is a barrier: it leaves once every batch
  before it is answered, and nothing after it leaves before its answer. It is not
  retried: a timeout leaves its outcome unknown (a delayed one shows in the timer status).
* No send can hang: each request waits at most the batch's remaining delivery time (but
  at least `_MIN_ATTEMPT_S`), every failure, expected or not, reaches the batch's futures,
  and a cancelled task answers whatever it still holds.
* Fast path (`send_direct`): when the sender is idle, a message is encoded and its request
  written at once by the caller, and the connection's answer resolves it; it counts as the
  first batch in flight, so later sends go after it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tidemq.client.cluster import ClusterClient
from tidemq.client.producer_config import ProducerConfig
from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.core.errors import OutOfOrderSequence, QueueMoved, RequestTimeout, TidemqError
from tidemq.core.message import BatchReceipts, Receipt
from tidemq.net.client import ClientConnection
from tidemq.protocol.codec import decode_response
from tidemq.protocol.commands import (
    InitProducerRequest,
    InitProducerResponse,
    ProduceRequest,
    ProduceResponse,
)
from tidemq.protocol.frame import Frame

__all__ = [
    "Batch",
    "BatchFuture",
    "QueueSender",
    "ReceiptFuture",
    "SenderContext",
    "Special",
    "Stamp",
    "WholeFuture",
]

#: How long the fast path trusts the cached route table after an awaited route lookup
#: (which refreshes it when it is older than the client's route_refresh_ms).
ROUTES_RECHECK_S = 1.0
#: The least time one attempt gets, even for a batch past its delivery deadline: a batch
#: that waited behind a slow one is still given a real chance instead of failing unsent.
_MIN_ATTEMPT_S = 1.0

#: Where a message's receipt goes: the future `send` awaits, or the sync API's future.
ReceiptFuture = asyncio.Future[Receipt] | concurrent.futures.Future[Receipt]
#: Where a whole batch's receipts go (send_batch, delayed and transactional sends).
BatchFuture = asyncio.Future[Sequence[Receipt]]
#: ... or the sync API's future of them.
WholeFuture = BatchFuture | concurrent.futures.Future[Sequence[Receipt]]


@dataclass(frozen=True, slots=True)
class Special:
    """What makes a batch special: a delivery time, or a transaction to stage it in.
    `txn(address)` gives the transaction id on that broker (beginning it there once)."""

    deliver_at_ms: int = 0
    txn: Callable[[str], Awaitable[str]] | None = None


class Stamp(NamedTuple):
    """Where a batch goes, and (idempotence) under which producer id and sequence: the id
    is the named broker's, whatever address it serves at now."""

    address: str
    broker: str
    producer_id: int
    epoch: int
    sequence: int


@dataclass(slots=True)
class Batch:
    topic: str
    queue: int
    payload: bytes
    count: int
    futures: list[ReceiptFuture] | None  # one per message; None for a whole-batch future
    whole: WholeFuture | None
    deadline: float  # time.monotonic() seconds: the delivery timeout
    stamp: Stamp | None = None
    special: Special | None = None

    def resolve(self, response: ProduceResponse) -> None:
        base = response.base_offset
        if response.origin_topic:  # delayed or transactional: the offset comes later
            origin, origin_queue = response.origin_topic, response.origin_queue
            receipts: Sequence[Receipt] = [
                Receipt(self.topic, self.queue, -1, (origin, origin_queue, base + i))
                for i in range(response.count)
            ]
        elif base < 0:  # acks=0: where the messages landed is not known
            receipts = [Receipt(self.topic, self.queue, -1)] * self.count
        elif self.count == 1 and self.futures:  # one message (the fast path)
            fut = self.futures[0]
            if not fut.done():
                fut.set_result(Receipt(self.topic, self.queue, base))
            return
        else:
            receipts = BatchReceipts(self.topic, self.queue, base, self.count)
        if self.whole is not None and not self.whole.done():
            self.whole.set_result(receipts)
        for fut, receipt in zip(self.futures or (), receipts, strict=False):
            if not fut.done():
                fut.set_result(receipt)

    def fail(self, error: BaseException) -> None:
        if self.whole is not None and not self.whole.done():
            self.whole.set_exception(error)
        for fut in self.futures or ():
            if not fut.done():
                fut.set_exception(error)

    def attempt_s(self, cap_s: float) -> float:
        """How long the next attempt may take: the time left to the delivery deadline,
        at most `cap_s`, at least `_MIN_ATTEMPT_S`."""
        return min(cap_s, max(_MIN_ATTEMPT_S, self.deadline - time.monotonic()))


class SenderContext:
    """What every queue sender of one producer shares: its settings, the cluster client,
    the producer ids per broker, and how recently routes were checked."""

    def __init__(self, config: ProducerConfig, cluster: ClusterClient) -> None:
        self.config = config
        self.cluster = cluster
        #: Per broker name: this producer's (id, epoch) there.
        self._ids: dict[str, tuple[int, int]] = {}
        #: Per broker name: how many batches it remembers per (producer, queue).
        self._windows: dict[str, int] = {}
        #: The routes' broker directory reversed (address -> name), and the directory it
        #: was made from.
        self._names: tuple[object, dict[str, str]] = (None, {})
        self._routes_trusted_until = 0.0

    def routes_checked(self) -> None:
        """An awaited route lookup just answered: the cached routes are current."""
        self._routes_trusted_until = time.monotonic() + ROUTES_RECHECK_S

    def routes_trusted(self) -> bool:
        return time.monotonic() < self._routes_trusted_until

    def broker_at(self, address: str) -> str:
        """The name of the broker serving at `address` by the current routes (the address
        itself when they name none there): the key of its producer ids."""
        directory = self.cluster.routes.brokers
        made_from, names = self._names
        if made_from is not directory:
            names = {at: name for name, at in directory.items()}
            self._names = (directory, names)
        return names.get(address, address)

    def ids_now(self, address: str) -> tuple[int, int] | None:
        return self._ids.get(self.broker_at(address))

    async def producer_id(self, address: str, *, renew: bool = False) -> tuple[int, int]:
        broker = self.broker_at(address)
        if renew or broker not in self._ids:
            resp = await self.cluster.call(address, InitProducerRequest(), InitProducerResponse)
            self._ids[broker] = (resp.producer_id, resp.epoch)
            self._windows[broker] = max(1, resp.window)
        return self._ids[broker]

    def window_for(self, address: str) -> int:
        """Batches in flight per queue on this broker: as many as asked, and for an
        idempotent producer no more than the broker remembers (5 until it said)."""
        window = self.config.max_in_flight_per_queue
        if not self.config.idempotent:
            return window
        return min(window, self._windows.get(self.broker_at(address), 5))

    def new_deadline(self) -> float:
        return time.monotonic() + self.config.delivery_timeout_s

    @property
    def request_timeout_s(self) -> float:
        return self.cluster.config.request_timeout_ms / 1000


_InFlight = deque[tuple[Batch, asyncio.Future[ProduceResponse]]]


class QueueSender:
    """Ordered delivery of one queue's batches (see the module's docstring). Lives on
    the producer's event loop; only that loop calls it."""

    def __init__(self, context: SenderContext, topic: str, queue: int) -> None:
        self._ctx = context
        self._topic = topic
        self._queue = queue
        self._waiting: deque[Batch] = deque()
        #: Requests in flight, oldest first: the sender task's, or a fast-path send's (a
        #: plain future the connection's answer completes).
        self._inflight: _InFlight = deque()
        self._task: asyncio.Task[None] | None = None
        #: The connection of the last request, for the fast path.
        self._conn: ClientConnection | None = None
        self._sequence = 0
        self._stamp_key: tuple[str, int, int] | None = None  # (broker, pid, epoch)
        #: The (broker, pid, epoch) keys this sender left for another broker. A queue
        #: that moves away and comes back (a static topic's remap) gets a fresh producer
        #: id there: the broker remembers the batches sent under the old one, so starting
        #: over at 0 would have new batches taken for retries of old ones (and dropped),
        #: and going on is unsafe too (a batch that failed there may or may not be stored).
        self._left: set[tuple[str, int, int]] = set()
        #: The next batch stamped starts over under a fresh producer id: a batch that was
        #: stamped has failed for good, leaving a gap in this queue's sequence.
        self._restamp = False
        self.idle = asyncio.Event()
        self.idle.set()

    def add(self, batch: Batch) -> None:
        self._waiting.append(batch)
        self.idle.clear()
        self._start_task()

    def _start_task(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
            self._task.add_done_callback(self._on_done)

    # ------------------------------------------------------------------ fast path

    def _direct_target(self) -> tuple[ClientConnection, int, int, int] | None:
        """(connection, producer id, epoch, sequence) for a fast-path send, when this
        sender is idle and they are known without awaiting; else None."""
        idle = not self._waiting and not self._inflight and not self._restamp
        if not idle or (self._task is not None and not self._task.done()):
            return None
        ctx = self._ctx
        if self._conn is None and self._stamp_key is None and not self._left:
            self._adopt_known_connection()
        conn = self._conn
        if conn is None or not conn.has_free_slot or not conn.is_open:
            return None
        if ctx.cluster.routes.broker_for(self._topic, self._queue) != conn.address:
            return None
        if not ctx.config.idempotent:
            return conn, -1, -1, -1
        # As `_stamp` would, without awaiting: the same producer id, the next number.
        ids = ctx.ids_now(conn.address)
        if ids is None or self._stamp_key != (ctx.broker_at(conn.address), *ids):
            return None
        return conn, ids[0], ids[1], self._sequence

    def _adopt_known_connection(self) -> None:
        """A queue never sent to: its broker's connection and producer id, when this
        producer has them already, serve its first message too (the first message to a
        new queue costs what any other does)."""
        ctx = self._ctx
        address = ctx.cluster.routes.broker_for(self._topic, self._queue)
        conn = None if address is None else ctx.cluster.open_connection(address)
        if conn is None:
            return
        if ctx.config.idempotent:
            ids = ctx.ids_now(conn.address)
            if ids is None:
                return
            self._stamp_key = (ctx.broker_at(conn.address), *ids)  # as `_stamp`: sequence 0
        self._conn = conn

    def send_direct(self, record: MessageRecord, future: ReceiptFuture) -> bool:
        """Send one message now from the caller (the fast path), when this sender is idle
        and its route, connection and producer id are known: True if it left. Raises
        what encoding raises (the message is refused; nothing was sent)."""
        target = self._direct_target()
        if target is None:
            return False
        conn, pid, epoch, seq = target
        ctx = self._ctx
        payload = encode_batch(
            [record], codec=ctx.config.codec, max_batch_bytes=ctx.config.max_request_bytes
        )
        stamp = Stamp(conn.address, ctx.broker_at(conn.address), pid, epoch, seq)
        batch = Batch(
            self._topic, self._queue, payload, 1, [future], None, ctx.new_deadline(), stamp
        )
        request = ProduceRequest(
            topic=self._topic, queue=self._queue, producer_id=pid, epoch=epoch, base_sequence=seq
        )
        response: asyncio.Future[ProduceResponse] = asyncio.get_running_loop().create_future()
        try:
            conn.request_nowait(
                request,
                payload,
                timeout_s=batch.attempt_s(ctx.request_timeout_s),
                callback=functools.partial(self._direct_answer, batch, response),
            )
        except TidemqError:
            return False  # closed since: the sender task's way reconnects
        if ctx.config.idempotent:
            self._sequence += 1
        self._inflight.append((batch, response))
        self.idle.clear()
        return True

    def _direct_answer(
        self,
        batch: Batch,
        response: asyncio.Future[ProduceResponse],
        frame: Frame | None,
        error: BaseException | None,
    ) -> None:
        """The connection's answer to a fast-path request."""
        if response.done():
            return  # the sender was abandoned (its loop is closing); the batch has failed
        if frame is not None:
            try:
                header = decode_response(frame, ProduceResponse)
            except Exception as exc:
                error = exc
            else:
                response.set_result(header)
                if self._task is None or self._task.done():
                    # Nothing else was sent meanwhile: settle it here, not in a task.
                    entry = self._inflight.popleft()
                    assert entry[1] is response
                    batch.resolve(header)
                    if not self._inflight and not self._waiting:
                        self.idle.set()
                # Else the sender task, started meanwhile, settles it first, in order.
                return
        assert error is not None
        response.set_exception(error)
        # The sender task retries it (with what follows) or fails it, as any batch.
        self._start_task()

    # ------------------------------------------------------------------ the sender task

    def _on_done(self, task: asyncio.Task[None]) -> None:
        # A task cancelled before its first step never ran `_run`'s own handler.
        if task is self._task and task.cancelled():
            self._fail_all(self._cancelled_error())

    def _cancelled_error(self) -> RequestTimeout:
        return RequestTimeout(
            f"the producer's sender for {self._topic}/{self._queue} was cancelled; "
            "the outcome of its unacknowledged messages is unknown"
        )

    def _fail_all(self, error: BaseException) -> None:
        """Answer everything this sender holds with `error` (its task is ending)."""
        for b, answer in self._inflight:
            answer.cancel()
            b.fail(error)
        self._inflight.clear()
        for b in self._waiting:
            b.fail(error)
        self._waiting.clear()
        # What was stamped may or may not be stored: start the sequence over.
        self._restamp = self._ctx.config.idempotent
        self.idle.set()

    async def _run(self) -> None:
        try:
            await self._send_all()
        except asyncio.CancelledError:
            self._fail_all(self._cancelled_error())
            raise
        except Exception as exc:  # a bug or an unexpected failure: never leave a send hanging
            self._fail_all(exc)
            return
        self.idle.set()

    async def _send_all(self) -> None:
        inflight = self._inflight
        attempt = 0
        while self._waiting or inflight:
            head = self._waiting[0] if self._waiting else None
            if head is not None and head.special is not None and not inflight:
                await self._send_special(head)
                continue
            try:
                await self._fill_window()
            except TidemqError as exc:
                # No route, no producer id (yet): every waiting batch waits for the next try.
                attempt = await self._retry_or_fail(exc, attempt, list(self._waiting))
                continue
            if not inflight:
                continue
            batch, answer = inflight[0]
            try:
                response = await answer
            except TidemqError as exc:
                attempt = await self._after_failure(exc, attempt)
                continue
            inflight.popleft()
            attempt = 0
            batch.resolve(response)

    async def _fill_window(self) -> None:
        """Send waiting batches (stamped for the queue's current broker) until the window
        is full or a special batch is at the head. A batch leaves `waiting` only once it
        is in flight, so a failure here leaves it waiting, never lost."""
        ctx = self._ctx
        if not self._waiting or self._waiting[0].special is not None:
            return
        head_s = self._waiting[0].attempt_s(ctx.request_timeout_s)
        async with _bounded(head_s, "looking up the queue's broker"):
            address = await ctx.cluster.broker_for(self._topic, self._queue)
        ctx.routes_checked()
        window = ctx.window_for(address)
        inflight = self._inflight
        while self._waiting and len(inflight) < window and self._waiting[0].special is None:
            batch = self._waiting[0]
            stamp = batch.stamp
            if stamp is None or stamp.broker != ctx.broker_at(address) or self._restamp:
                async with _bounded(batch.attempt_s(ctx.request_timeout_s), "InitProducer"):
                    await self._stamp(batch, address, renew=self._restamp)
                self._restamp = False
            elif stamp.address != address:
                # The same broker at a new address (a replica group's next leader): the
                # same id and sequence, so a batch it already holds is not written twice.
                batch.stamp = stamp._replace(address=address)
            self._waiting.popleft()
            task = asyncio.get_running_loop().create_task(self._send(batch))
            inflight.append((batch, task))

    async def _after_failure(self, exc: TidemqError, attempt: int) -> int:
        """The oldest request in flight failed: settle the others, then retry what
        failed (retriable) or fail the head batch and restart the sequence."""
        inflight = self._inflight
        batch = inflight[0][0]
        settled = await self._settle()
        requeue = [b for b, err in settled if err is not None]
        if exc.retriable:
            self._waiting.extendleft(reversed(requeue))
            return await self._retry_or_fail(exc, attempt, requeue)
        batch.fail(exc)
        rest = [b for b in requeue if b is not batch]
        self._waiting.extendleft(reversed(rest))
        # Later batches were refused for the gap this one left, and so would every later
        # send be: restart the sequence under a fresh producer id before sending anything
        # else to this queue (even if nothing is waiting now).
        self._restamp = self._ctx.config.idempotent
        for b in self._waiting:
            b.stamp = None
        return attempt

    async def _stamp(self, batch: Batch, address: str, *, renew: bool = False) -> None:
        broker = self._ctx.broker_at(address)
        if not self._ctx.config.idempotent:
            batch.stamp = Stamp(address, broker, -1, -1, -1)
            return
        pid, epoch = await self._ctx.producer_id(address, renew=renew)
        if (broker, pid, epoch) in self._left:
            pid, epoch = await self._ctx.producer_id(address, renew=True)
        if self._stamp_key != (broker, pid, epoch):
            if self._stamp_key is not None:
                self._left.add(self._stamp_key)
            self._stamp_key = (broker, pid, epoch)
            self._sequence = 0
        batch.stamp = Stamp(address, broker, pid, epoch, self._sequence)
        self._sequence += batch.count

    async def _send(self, batch: Batch) -> ProduceResponse:
        assert batch.stamp is not None
        address, _, pid, epoch, seq = batch.stamp
        request = ProduceRequest(
            topic=self._topic, queue=self._queue, producer_id=pid, epoch=epoch, base_sequence=seq
        )
        ctx = self._ctx
        timeout_s = batch.attempt_s(ctx.request_timeout_s)
        async with _bounded(timeout_s, "connecting to the broker"):
            conn = await ctx.cluster.connection(address)
        self._conn = conn
        if ctx.config.acks_none:
            # One-way frame: the broker stores it and answers nothing.
            conn.send_oneway(request, batch.payload)
            return ProduceResponse(base_offset=-1, count=batch.count)
        header, _ = await conn.request(request, ProduceResponse, batch.payload, timeout_s=timeout_s)
        return header

    async def _send_special(self, batch: Batch) -> None:
        """Send the special batch at the head, alone; answer it either way. Retried only
        when refused with QueueMoved (a static queue's write end moved: nothing was
        stored), within the batch's delivery time."""
        assert batch.special is not None
        ctx = self._ctx
        attempt = 0
        while True:
            try:
                response = await self._special_once(batch)
            except QueueMoved as exc:
                ctx.cluster.invalidate(exc)
                attempt += 1
                if batch.deadline > time.monotonic() and attempt <= ctx.cluster.config.retries:
                    if attempt > 1:
                        await asyncio.sleep(ctx.cluster.backoff_s(attempt - 1))
                    continue
                self._waiting.popleft()
                batch.fail(exc)
                return
            except Exception as exc:
                self._waiting.popleft()
                if isinstance(exc, TidemqError):
                    ctx.cluster.invalidate(exc)
                batch.fail(exc)
                return
            self._waiting.popleft()
            batch.resolve(response)
            return

    async def _special_once(self, batch: Batch) -> ProduceResponse:
        assert batch.special is not None
        ctx = self._ctx
        async with _bounded(batch.attempt_s(ctx.request_timeout_s), "a special send"):
            address = await ctx.cluster.broker_for(self._topic, self._queue)
            txn_id = await batch.special.txn(address) if batch.special.txn else ""
            request = ProduceRequest(
                topic=self._topic,
                queue=self._queue,
                deliver_at_ms=batch.special.deliver_at_ms,
                txn_id=txn_id,
            )
            response, _ = await ctx.cluster.request(
                address, request, ProduceResponse, batch.payload
            )
        return response

    async def _settle(self) -> list[tuple[Batch, BaseException | None]]:
        """Wait for every request in flight; resolve the ones that succeeded."""
        out: list[tuple[Batch, BaseException | None]] = []
        inflight = self._inflight
        while inflight:
            batch, answer = inflight.popleft()
            try:
                response = await answer
            except TidemqError as exc:
                out.append((batch, exc))
                continue
            batch.resolve(response)
            out.append((batch, None))
        return out

    async def _retry_or_fail(self, exc: TidemqError, attempt: int, batches: list[Batch]) -> int:
        attempt += 1
        now = time.monotonic()
        expired = [b for b in batches if b.deadline <= now]
        retries = self._ctx.cluster.config.retries
        if not exc.retriable or attempt > retries or expired:
            error: TidemqError = exc
            if expired and exc.retriable:
                error = RequestTimeout(f"delivery timed out after retries: {exc}")
            if not exc.retriable or attempt > retries:
                for b in self._waiting:
                    b.fail(error)
                self._waiting.clear()
                # The failed batches may have been stamped (and, after a timeout, maybe
                # stored): the next send must not depend on their sequence numbers.
                self._restamp = self._ctx.config.idempotent
            else:
                for b in expired:
                    b.fail(error)
                    if b in self._waiting:
                        self._waiting.remove(b)
            return 0
        self._ctx.cluster.invalidate(exc)
        if isinstance(exc, OutOfOrderSequence):
            for b in self._waiting:
                b.stamp = None
        if isinstance(exc, QueueMoved) and attempt == 1:
            # A static queue's write end moved: the routes (refreshed now) name the new
            # broker already, unless the switch is still under way (then back off).
            return attempt
        await asyncio.sleep(self._ctx.cluster.backoff_s(attempt))
        return attempt


@contextlib.asynccontextmanager
async def _bounded(seconds: float, what: str) -> AsyncIterator[None]:
    """`asyncio.timeout`, raising a retriable RequestTimeout that names what took too long."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError as exc:
        raise RequestTimeout(f"{what} took longer than {seconds:.1f} s") from exc
