"""Requests of the timer and transaction services (cancel, status, begin, end, markers,
check-back registration)."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from tidemq.broker.static_view import LinkView
from tidemq.broker.timer_service import TimerService
from tidemq.broker.transaction_service import TransactionService
from tidemq.net.server import ServerConnection
from tidemq.protocol.commands import (
    BeginTxnRequest,
    BeginTxnResponse,
    CancelDelayedRequest,
    CancelDelayedResponse,
    Empty,
    EndTxnRequest,
    EndTxnResponse,
    RegisterCheckerRequest,
    SinkMarkerRequest,
    SinkMarkerResponse,
    TimerStatusRequest,
    TimerStatusResponse,
    TxnStatusRequest,
    TxnStatusResponse,
)

__all__ = ["SpecialHandlers"]


class SpecialHandlers:
    def __init__(
        self,
        timers: TimerService,
        transactions: TransactionService,
        check_delay_ms: int,
        *,
        static_view: Callable[[str, int], LinkView | None] = lambda topic, queue: None,
    ) -> None:
        self._timers = timers
        self._txns = transactions
        self._check_delay_ms = check_delay_ms
        #: A static queue's chain view: published offsets are answered logical.
        self._static_view = static_view

    async def cancel_delayed(self, req: CancelDelayedRequest) -> CancelDelayedResponse:
        return await self._timers.cancel(req.message_id)

    async def timer_status(self, req: TimerStatusRequest) -> TimerStatusResponse:
        return self._timers.status(req.topic)

    async def begin(self, req: BeginTxnRequest) -> BeginTxnResponse:
        return BeginTxnResponse(
            txn_id=self._txns.begin(req.group), check_delay_ms=self._check_delay_ms
        )

    async def end(self, req: EndTxnRequest) -> EndTxnResponse:
        answer = await self._txns.end(
            req.txn_ids, commit=req.commit, sink_id=req.sink_id, batch_id=req.batch_id
        )
        published = []
        for batch in answer.published:
            view = self._static_view(batch.topic, batch.queue)
            logical = batch.base_offset if view is None else view.logical(batch.base_offset)
            published.append(msgspec.structs.replace(batch, base_offset=logical))
        return msgspec.structs.replace(answer, published=published)

    async def sink_marker(self, req: SinkMarkerRequest) -> SinkMarkerResponse:
        return SinkMarkerResponse(batch_id=self._txns.sink_marker(req.sink_id))

    async def txn_status(self, req: TxnStatusRequest) -> TxnStatusResponse:
        return self._txns.status()

    def register_checker(self, req: RegisterCheckerRequest, conn: ServerConnection) -> Empty:
        self._txns.register_checker(req.group, conn)
        return Empty()
