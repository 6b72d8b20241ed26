"""Requests of the timer and transaction services (cancel, status, begin, end, markers,
check-back registration)."""

from __future__ import annotations

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
        self, timers: TimerService, transactions: TransactionService, check_delay_ms: int
    ) -> None:
        self._timers = timers
        self._txns = transactions
        self._check_delay_ms = check_delay_ms

    async def cancel_delayed(self, req: CancelDelayedRequest) -> CancelDelayedResponse:
        return await self._timers.cancel(req.message_id)

    async def timer_status(self, req: TimerStatusRequest) -> TimerStatusResponse:
        return self._timers.status(req.topic)

    async def begin(self, req: BeginTxnRequest) -> BeginTxnResponse:
        return BeginTxnResponse(
            txn_id=self._txns.begin(req.group), check_delay_ms=self._check_delay_ms
        )

    async def end(self, req: EndTxnRequest) -> EndTxnResponse:
        return await self._txns.end(
            req.txn_ids, commit=req.commit, sink_id=req.sink_id, batch_id=req.batch_id
        )

    async def sink_marker(self, req: SinkMarkerRequest) -> SinkMarkerResponse:
        return SinkMarkerResponse(batch_id=self._txns.sink_marker(req.sink_id))

    async def txn_status(self, req: TxnStatusRequest) -> TxnStatusResponse:
        return self._txns.status()

    def register_checker(self, req: RegisterCheckerRequest, conn: ServerConnection) -> Empty:
        self._txns.register_checker(req.group, conn)
        return Empty()
