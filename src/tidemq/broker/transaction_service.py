"""Transactional (half) messages: begin, send halves, commit or roll back, check back.

* A transaction's batches are written to the internal half topic (`HALF_TOPIC`) with the
  transaction id and their target in the record properties. No consumer reads that topic.
* Ending one or several transactions (as one unit) appends one decision record to the op
  topic (`OP_TOPIC`): ids, commit or rollback, and for a commit an optional sink marker
  `(sink_id, batch_id)`. That append being durable is the commit point.
* A commit then publishes every half batch, unchanged, to its real topic, with flag
  FROM_TRANSACTION and properties naming the half it came from (so the messages keep the
  ids their sends returned). A crash while publishing is finished after the restart: the
  decision is in the op topic, and the published halves are found by the log scan, so
  nothing is published twice.
* An undecided transaction is checked with a live producer of its group (a server-to-client
  CHECK_TXN request) after `txn_check_delay_ms`, then every `txn_check_interval_ms`; after
  `txn_max_checks` answers of UNKNOWN (or no answer, or no producer online) the broker rolls
  it back and lists it as discarded.

Every transition goes through `transaction_states.TRANSITIONS`. Restart state: two
`DoneSet`s (finished half offsets, finished decisions), the sink markers, the discarded list
and a log position, saved in SQLite by the broker every `service_checkpoint_interval_ms`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

import msgspec

from tidemq.broker.config import BrokerConfig
from tidemq.broker.done_set import DoneSet
from tidemq.broker.moves import InFlightMoves
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.system_topics import (
    HALF_TOPIC,
    OP_TOPIC,
    MovedRecord,
    control_payload,
    read_internal,
)
from tidemq.broker.transaction_states import TRANSITIONS, Answer, TxnEvent, TxnState
from tidemq.core.clock import Clock
from tidemq.core.errors import (
    InvalidRequest,
    TidemqError,
    TransactionStateError,
    UnknownTransaction,
)
from tidemq.core.properties import (
    SystemProperties,
    encode_properties,
    is_origin_of,
    qualified_origin,
)
from tidemq.core.record import RecordFlags
from tidemq.net.server import ServerConnection
from tidemq.net.tasks import cancel_and_wait
from tidemq.protocol.commands import (
    CheckTxnRequest,
    CheckTxnResponse,
    DiscardedTxnInfo,
    EndTxnResponse,
    OpenTxnInfo,
    PublishedBatch,
    TxnStatusResponse,
)
from tidemq.store.message_store import AppendResult, MessageStore

__all__ = ["TransactionService"]

log = logging.getLogger(__name__)

#: Finished transactions remembered so that a retried commit or rollback gets the same
#: answer as the first.
_FINISHED_KEPT: Final = 10_000
#: Transactions the broker rolled back itself, listed by admin.
_DISCARDED_KEPT: Final = 1_000
#: Check-backs in flight at once.
_MAX_CONCURRENT_CHECKS: Final = 16
#: After a failed publish (disk full, ...), wait this long before trying again.
_RETRY_DELAY_S: Final = 1.0
_MAX_SLEEP_S: Final = 1.0
_GROUP_MAX_CHARS: Final = 255
_MAX_IDS_PER_END: Final = 10_000
_EMPTY_TXN_TTL_MS: Final = 3_600_000


@dataclass(slots=True)
class _Half:
    offset: int
    count: int
    topic: str
    queue: int


@dataclass(slots=True)
class _Txn:
    txn_id: str
    group: str
    state: TxnState = TxnState.OPEN
    halves: list[_Half] = field(default_factory=list)
    first_send_ms: int = 0
    #: When BEGIN_TXN made it: a transaction with nothing sent is forgotten after
    #: `_EMPTY_TXN_TTL_MS` (its producer went away; there is nothing to roll back).
    begun_ms: int = 0
    next_check_ms: int = 0
    checks: int = 0
    checking: bool = False
    sending: int = 0
    #: Set whenever no send is in flight and no end is in progress.
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    published: list[PublishedBatch] = field(default_factory=list)
    why: str = ""

    def __post_init__(self) -> None:
        self.idle.set()


class _SavedState(msgspec.Struct):
    position: int
    half_done: list[tuple[int, int]]
    op_done: list[tuple[int, int]]
    markers: dict[str, int]
    discarded: list[DiscardedTxnInfo]
    committed: int
    rolled_back: int


_STATE_DECODER: Final = msgspec.msgpack.Decoder(_SavedState)


class TransactionService:
    def __init__(self, config: BrokerConfig, gateway: StoreGateway, clock: Clock) -> None:
        self._config = config
        #: The origin topic in the ids of the messages sent here in transactions.
        self.origin = qualified_origin(HALF_TOPIC, config.broker_name)
        self._gateway = gateway
        self._clock = clock
        self._txns: dict[str, _Txn] = {}
        self._finished: OrderedDict[str, _Txn] = OrderedDict()
        self._half_done = DoneSet()
        self._moves = InFlightMoves()
        self._op_done = DoneSet()
        self._markers: dict[str, int] = {}
        self._discarded: deque[DiscardedTxnInfo] = deque(maxlen=_DISCARDED_KEPT)
        self._committed = 0
        self._rolled_back = 0
        #: Per topic, messages published by commits and discarded by rollbacks (since the
        #: broker started; for metrics).
        self.messages_committed: Counter[str] = Counter()
        self.messages_rolled_back: Counter[str] = Counter()
        self._checkers: dict[str, list[ServerConnection]] = {}
        self._check_slots = asyncio.Semaphore(_MAX_CONCURRENT_CHECKS)
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        #: Decisions recovered with halves still to publish (finished by `start`).
        self._to_publish: list[tuple[int, list[_Txn]]] = []
        #: Set whenever a transaction finishes (a static queue's seal waits on it).
        self._a_txn_finished = asyncio.Event()

    # ------------------------------------------------------------------ recovery

    @staticmethod
    def scan_position(saved: bytes | None) -> int:
        return 0 if saved is None else _STATE_DECODER.decode(saved).position

    def rebuild(
        self, store: MessageStore, saved: bytes | None, moved: Iterable[MovedRecord]
    ) -> None:
        """Rebuild open and half-published transactions before the broker serves."""
        if saved is not None:
            state = _STATE_DECODER.decode(saved)
            self._half_done = DoneSet.restore(state.half_done)
            self._op_done = DoneSet.restore(state.op_done)
            self._markers = dict(state.markers)
            self._discarded.extend(state.discarded)
            self._committed, self._rolled_back = state.committed, state.rolled_back
        decisions = self._read_decisions(store)
        txns = self._read_halves(store)
        published: set[int] = set()
        for m in moved:
            if m.flags & RecordFlags.FROM_TRANSACTION and is_origin_of(m.props.ot, HALF_TOPIC):
                self._half_done.mark(m.props.oo, m.count)
                published.add(m.props.oo)
        by_decision: dict[int, list[_Txn]] = {}
        for txn in txns.values():
            txn.halves = [h for h in txn.halves if h.offset not in published]
            decision = decisions.get(txn.txn_id)
            if decision is None:
                self._reopen(txn)
            elif decision[1].commit and txn.halves:
                txn.state = TxnState.ENDING
                txn.idle.clear()
                self._txns[txn.txn_id] = txn
                by_decision.setdefault(decision[0], []).append(txn)
            elif not decision[1].commit:
                for h in txn.halves:
                    self._half_done.mark(h.offset, h.count)
        for op_offset, _props in decisions.values():
            if op_offset not in by_decision:
                self._op_done.mark(op_offset, 1)
        self._to_publish = sorted(by_decision.items(), key=lambda item: item[0])
        if self._txns:
            log.info(
                "transactions after restart: %d undecided, %d committed with halves to publish",
                sum(t.state is TxnState.OPEN for t in self._txns.values()),
                sum(len(t) for _, t in self._to_publish),
            )

    def _read_decisions(self, store: MessageStore) -> dict[str, tuple[int, SystemProperties]]:
        """Decisions not yet finished, by transaction id (and the sink markers they set)."""
        decisions: dict[str, tuple[int, SystemProperties]] = {}
        for rec in read_internal(store, OP_TOPIC, self._op_done.low):
            if self._op_done.is_done(rec.offset):
                continue
            for txn_id in rec.props.txs:
                decisions[txn_id] = (rec.offset, rec.props)
            if rec.props.commit and rec.props.sink:
                self._markers[rec.props.sink] = rec.props.bid
        return decisions

    def _read_halves(self, store: MessageStore) -> dict[str, _Txn]:
        """Unfinished half batches, grouped into their transactions."""
        txns: dict[str, _Txn] = {}
        for rec in read_internal(store, HALF_TOPIC, self._half_done.low):
            if self._half_done.is_done(rec.offset):
                continue
            p = rec.props
            txn = txns.get(p.tx)
            if txn is None:
                txn = txns[p.tx] = _Txn(p.tx, p.grp, first_send_ms=rec.store_time_ms)
            txn.halves.append(_Half(rec.offset, rec.count, p.tt, p.tq))
        return txns

    def _reopen(self, txn: _Txn) -> None:
        """An undecided transaction from before the restart: open, checked back from its
        first send's time plus the check delay (at once if that has passed)."""
        if txn.halves:
            now = self._clock.now_ms()
            txn.next_check_ms = max(now, txn.first_send_ms + self._config.txn_check_delay_ms)
            self._txns[txn.txn_id] = txn

    def save_state(self, flushed_position: int) -> bytes:
        """The state to save, with the position a restart scans from (see `InFlightMoves`:
        at or before every publication not marked done yet)."""
        return msgspec.msgpack.encode(
            _SavedState(
                self._moves.scan_position(flushed_position),
                self._half_done.export(),
                self._op_done.export(),
                self._markers,
                list(self._discarded),
                self._committed,
                self._rolled_back,
            )
        )

    @property
    def low_watermarks(self) -> tuple[int, int]:
        """(half topic, op topic) offsets below which everything is finished."""
        return self._half_done.low, self._op_done.low

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Finish publishing commits a crash interrupted, then start checking back."""
        pending, self._to_publish = self._to_publish, []
        for op_offset, txns in pending:
            await self._publish(txns, op_offset)
            self._finish(txns, TxnState.COMMITTED)
        self._runner = asyncio.get_running_loop().create_task(self._run_checks())

    async def stop(self) -> None:
        await cancel_and_wait(self._runner, *self._tasks)

    # ------------------------------------------------------------------ requests

    def begin(self, group: str) -> str:
        if not group or len(group) > _GROUP_MAX_CHARS:
            raise InvalidRequest(
                f"a transaction needs a producer group of 1-{_GROUP_MAX_CHARS} characters"
            )
        open_count = len(self._txns)
        if open_count >= self._config.max_open_transactions:
            raise TransactionStateError(
                f"{open_count} transactions are open on this broker, the limit "
                f"(broker.max_open_transactions); commit or roll back some first"
            )
        txn_id = uuid.uuid4().hex
        self._txns[txn_id] = _Txn(txn_id, group, begun_ms=self._clock.now_ms())
        return txn_id

    def groups_of(self, txn_ids: Sequence[str]) -> list[str]:
        """The groups of the transactions this broker knows (for authorization: ending a
        transaction needs WRITE on its group); unknown ids are skipped (ending them fails
        with UnknownTransaction anyway)."""
        found = (self._txns.get(t) or self._finished.get(t) for t in txn_ids)
        return sorted({txn.group for txn in found if txn is not None})

    def _lookup(self, txn_id: str) -> _Txn:
        txn = self._txns.get(txn_id) or self._finished.get(txn_id)
        if txn is None:
            raise UnknownTransaction(
                f"no transaction {txn_id[:64]!r} on this broker: never begun here, begun "
                "before a restart without sending anything (begin again), or ended long ago"
            )
        return txn

    async def send(
        self, txn_id: str, topic: str, queue: int, payload: bytes | memoryview
    ) -> AppendResult:
        txn = self._lookup(txn_id)
        if TRANSITIONS[(txn.state, TxnEvent.SEND)] is not Answer.ACCEPT:
            raise TransactionStateError(
                f"transaction {txn_id} is {txn.state.value.replace('_', ' ')}; "
                "it takes no more messages"
            )
        if len(txn.halves) + txn.sending >= self._config.max_batches_per_transaction:
            raise TransactionStateError(
                f"transaction {txn_id} has {len(txn.halves)} batches, the limit "
                "(broker.max_batches_per_transaction)"
            )
        props = SystemProperties(tx=txn_id, grp=txn.group, tt=topic, tq=queue)
        txn.sending += 1
        txn.idle.clear()
        try:
            result = await self._gateway.append(
                HALF_TOPIC,
                0,
                payload,
                properties=encode_properties(props),
                flags=RecordFlags.TRANSACTION_HALF,
            )
        finally:
            txn.sending -= 1
            if txn.sending == 0 and txn.state is TxnState.OPEN:
                txn.idle.set()
        txn.halves.append(_Half(result.base_offset, result.count, topic, queue))
        if txn.first_send_ms == 0:
            txn.first_send_ms = self._clock.now_ms()
            txn.next_check_ms = txn.first_send_ms + self._config.txn_check_delay_ms
        return result

    async def end(
        self,
        txn_ids: list[str],
        *,
        commit: bool,
        sink_id: str = "",
        batch_id: int = -1,
        why: str = "",
    ) -> EndTxnResponse:
        """Commit or roll back these transactions as one unit."""
        ids = list(dict.fromkeys(txn_ids))
        if not ids or len(ids) > _MAX_IDS_PER_END:
            raise InvalidRequest(f"end a transaction with 1-{_MAX_IDS_PER_END} ids, got {len(ids)}")
        if sink_id and not commit:
            raise InvalidRequest("a sink marker goes with a commit, not a rollback")
        if sink_id and batch_id < 0:
            raise InvalidRequest("a sink marker needs batch_id >= 0")
        event = TxnEvent.COMMIT if commit else TxnEvent.ROLLBACK
        while True:
            txns = [self._lookup(i) for i in ids]
            answers = {t.txn_id: TRANSITIONS[(t.state, event)] for t in txns}
            waiting = [t for t in txns if answers[t.txn_id] is Answer.WAIT]
            if waiting:
                await asyncio.gather(*(t.idle.wait() for t in waiting))
                continue
            break
        refused = [t for t in txns if answers[t.txn_id] is Answer.REFUSE]
        if refused:
            t = refused[0]
            raise TransactionStateError(
                f"cannot {event.value} transaction {t.txn_id}: it was "
                f"{t.state.value.replace('_', ' ')}{f' ({t.why})' if t.why else ''}"
            )
        already = [t for t in txns if answers[t.txn_id] is Answer.ALREADY]
        if already:
            if len(already) != len(txns):
                raise TransactionStateError(
                    "some of these transactions have ended already and some have not; "
                    "end them separately"
                )
            return self._response(txns, commit, already=True)
        return await self._end(txns, commit, sink_id, batch_id, why)

    async def _end(
        self, txns: list[_Txn], commit: bool, sink_id: str, batch_id: int, why: str
    ) -> EndTxnResponse:
        for t in txns:
            t.state = TxnState.ENDING
            t.idle.clear()
        try:
            # Sends already accepted finish first: the decision covers every half written.
            while any(t.sending for t in txns):
                await asyncio.sleep(0.001)
            props = SystemProperties(
                txs=[t.txn_id for t in txns], commit=commit, sink=sink_id, bid=batch_id, why=why
            )
            decision = await self._gateway.append(
                OP_TOPIC,
                0,
                control_payload(),
                properties=encode_properties(props),
                flags=RecordFlags.CONTROL | RecordFlags.TRANSACTION_HALF,
            )
        except BaseException:
            for t in txns:  # no decision was written: still open
                t.state = TxnState.OPEN
                t.idle.set()
            raise
        if commit:
            if sink_id:
                self._markers[sink_id] = batch_id
            await self._publish(txns, decision.base_offset)
        else:
            for t in txns:
                for h in t.halves:
                    self._half_done.mark(h.offset, h.count)
                t.why = why
            self._op_done.mark(decision.base_offset, decision.count)
        self._finish(txns, TxnState.COMMITTED if commit else TxnState.ROLLED_BACK)
        if why and not commit:
            now = self._clock.now_ms()
            for t in txns:
                self._discarded.append(
                    DiscardedTxnInfo(
                        txn_id=t.txn_id,
                        group=t.group,
                        messages=sum(h.count for h in t.halves),
                        decided_ms=now,
                        reason=why,
                    )
                )
        return self._response(txns, commit, already=False)

    async def _publish(self, txns: list[_Txn], op_offset: int) -> None:
        """Publish every unpublished half of these committed transactions, in the order
        they were sent; retry until done (the decision is durable: they must appear)."""
        store = self._gateway.store
        queue = [(t, h) for t in txns for h in t.halves if not self._half_done.is_done(h.offset)]
        while queue:
            items: list[tuple[str, int, bytes | memoryview, bytes, int]] = []
            for t, h in queue:
                rec = next(read_internal(store, HALF_TOPIC, h.offset, max_bytes=1), None)
                if rec is None or rec.offset != h.offset:
                    raise TidemqError(f"half batch {h.offset} of {t.txn_id} is missing")
                props = SystemProperties(tx=t.txn_id, ot=self.origin, oq=0, oo=h.offset)
                items.append(
                    (
                        h.topic,
                        h.queue,
                        rec.payload,
                        encode_properties(props),
                        RecordFlags.FROM_TRANSACTION,
                    )
                )
            with self._moves.writing(store):
                results, error = await self._gateway.append_many(items)
                for (t, h), r in zip(queue, results, strict=False):
                    t.published.append(
                        PublishedBatch(
                            txn_id=t.txn_id,
                            topic=h.topic,
                            queue=h.queue,
                            base_offset=r.base_offset,
                            count=r.count,
                            origin_offset=h.offset,
                            origin_topic=self.origin,
                        )
                    )
                    self._half_done.mark(h.offset, h.count)
            queue = queue[len(results) :]
            if error is not None:
                log.warning("publishing a committed transaction failed (%s); retrying", error)
                await asyncio.sleep(_RETRY_DELAY_S)
        self._op_done.mark(op_offset, 1)

    def holding(self, topic: str, queue: int) -> int:
        """Transactions not finished that have (or may be sending) batches for the queue:
        their commit appends there."""
        return sum(
            1
            for t in self._txns.values()
            if t.sending or any(h.topic == topic and h.queue == queue for h in t.halves)
        )

    async def wait_none_holding(self, topic: str, queue: int, timeout_s: float) -> int:
        """Until no transaction holds batches for the queue, at most `timeout_s`; returns
        how many still do (0: none)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while held := self.holding(topic, queue):
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return held
            self._a_txn_finished.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._a_txn_finished.wait()
        return 0

    def _finish(self, txns: list[_Txn], state: TxnState) -> None:
        self._a_txn_finished.set()
        for t in txns:
            t.state = state
            t.idle.set()
            self._txns.pop(t.txn_id, None)
            self._finished[t.txn_id] = t
            if state is TxnState.COMMITTED:
                self._committed += 1
                for p in t.published:
                    self.messages_committed[p.topic] += p.count
            else:
                self._rolled_back += 1
                for h in t.halves:
                    self.messages_rolled_back[h.topic] += h.count
        while len(self._finished) > _FINISHED_KEPT:
            self._finished.popitem(last=False)

    @staticmethod
    def _response(txns: list[_Txn], commit: bool, *, already: bool) -> EndTxnResponse:
        return EndTxnResponse(
            outcome="committed" if commit else "rolled_back",
            published=[p for t in txns for p in t.published],
            already=already,
        )

    def outcome(self, txn_id: str) -> tuple[str, list[PublishedBatch]]:
        """A transaction's state ("open", "committed", "rolled_back"; "unknown" once it
        is no longer remembered) and, committed, where its batches were published."""
        txn = self._txns.get(txn_id) or self._finished.get(txn_id)
        if txn is None:
            return "unknown", []
        if txn.state is TxnState.COMMITTED:
            return "committed", list(txn.published)
        if txn.state is TxnState.ROLLED_BACK:
            return "rolled_back", []
        return "open", []

    def sink_marker(self, sink_id: str) -> int:
        return self._markers.get(sink_id, -1)

    def status(self) -> TxnStatusResponse:
        cfg = self._config
        return TxnStatusResponse(
            open=[
                OpenTxnInfo(
                    txn_id=t.txn_id,
                    group=t.group,
                    messages=sum(h.count for h in t.halves),
                    first_send_ms=t.first_send_ms,
                    checks=t.checks,
                )
                for t in self._txns.values()
                if t.state is TxnState.OPEN and t.halves
            ],
            discarded=list(self._discarded),
            committed=self._committed,
            rolled_back=self._rolled_back,
            check_delay_ms=cfg.txn_check_delay_ms,
            check_interval_ms=cfg.txn_check_interval_ms,
            max_checks=cfg.txn_max_checks,
        )

    # ------------------------------------------------------------------ check-back

    def register_checker(self, group: str, conn: ServerConnection) -> None:
        if not group or len(group) > _GROUP_MAX_CHARS:
            raise InvalidRequest(
                f"a checker needs a producer group of 1-{_GROUP_MAX_CHARS} characters"
            )
        conns = self._checkers.setdefault(group, [])
        if conn in conns:
            return
        conns.append(conn)

        def forget() -> None:
            if conn in conns:
                conns.remove(conn)

        conn.on_close.append(forget)

    async def _run_checks(self) -> None:
        while True:
            now = self._clock.now_ms()
            next_at = now + int(_MAX_SLEEP_S * 1000)
            for txn in list(self._txns.values()):
                if txn.state is TxnState.OPEN and not txn.halves and not txn.sending:
                    if now - txn.begun_ms > _EMPTY_TXN_TTL_MS:
                        del self._txns[txn.txn_id]
                    continue
                if txn.state is not TxnState.OPEN or txn.checking:
                    continue
                if txn.next_check_ms <= now:
                    txn.checking = True
                    task = asyncio.get_running_loop().create_task(self._check(txn))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                else:
                    next_at = min(next_at, txn.next_check_ms)
            await asyncio.sleep(max(0.01, (next_at - now) / 1000))

    async def _check(self, txn: _Txn) -> None:
        try:
            async with self._check_slots:
                decision = await self._ask(txn)
            if txn.state is not TxnState.OPEN:
                return  # ended by its producer meanwhile: that end stands
            if decision in ("commit", "rollback"):
                await self.end([txn.txn_id], commit=decision == "commit", why="")
                return
            txn.checks += 1
            if txn.checks >= self._config.txn_max_checks:
                await self.end(
                    [txn.txn_id],
                    commit=False,
                    why=f"no decision after {txn.checks} check-backs",
                )
                return
            txn.next_check_ms = self._clock.now_ms() + self._config.txn_check_interval_ms
        except TidemqError as exc:
            log.warning("check-back of transaction %s failed: %s", txn.txn_id, exc)
            txn.next_check_ms = self._clock.now_ms() + self._config.txn_check_interval_ms
        finally:
            txn.checking = False

    async def _ask(self, txn: _Txn) -> str:
        """The group's answer, or "unknown" when no producer is online or none answers."""
        conns = self._checkers.get(txn.group) or []
        if not conns:
            log.info(
                "no producer of group %r online to check transaction %s", txn.group, txn.txn_id
            )
            return "unknown"
        conn = conns[txn.checks % len(conns)]
        request = CheckTxnRequest(
            txn_id=txn.txn_id,
            group=txn.group,
            messages=sum(h.count for h in txn.halves),
            topics=sorted({h.topic for h in txn.halves}),
            first_send_ms=txn.first_send_ms,
            check=txn.checks + 1,
        )
        try:
            response = await conn.ask(
                request, CheckTxnResponse, timeout_s=self._config.txn_check_timeout_ms / 1000
            )
        except TidemqError as exc:
            log.info("checker %s of group %r: %s", conn.peer, txn.group, exc)
            return "unknown"
        decision = response.decision.lower()
        return decision if decision in ("commit", "rollback") else "unknown"
