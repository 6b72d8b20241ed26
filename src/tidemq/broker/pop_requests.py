"""The pop requests as the broker serves them: `PopService` answers them, with the static
topics' part around a receive (FIFO links finished elsewhere, offsets rebased from the
link's to the logical queue's, `static_pop`, `static_view`)."""

from __future__ import annotations

from collections.abc import Awaitable

from tidemq.broker.pop_service import PopService
from tidemq.broker.static_service import StaticService
from tidemq.broker.static_view import rebase_popped
from tidemq.protocol.commands import (
    Empty,
    PopAckRequest,
    PopAckResponse,
    PopChangeInvisibleRequest,
    PopChangeInvisibleResponse,
    PopNackRequest,
    PopReceiveRequest,
    PopReceiveResponse,
    PopResumeRequest,
    PopResumeResponse,
    PopStatusRequest,
    PopStatusResponse,
)

__all__ = ["PopRequests"]


class PopRequests:
    """Decoded pop requests in, answers out (one per broker, on its loop)."""

    def __init__(self, pop: PopService, static: StaticService) -> None:
        self._pop = pop
        self._static = static

    async def receive(self, req: PopReceiveRequest) -> tuple[PopReceiveResponse, bytes]:
        fifo = self._static.fifo
        fifo.note(req.group, req.fifo_finished)
        response, body = await self._pop.receive(req)
        response, body = rebase_popped(response, body, self._static.view)
        topics = [s.topic for s in req.subscriptions]
        response.fifo_finished = fifo.reports(req.group, topics, self._pop.finished_below)
        return response, body

    # The service's coroutines themselves, not one more layer around them per request.

    def ack(self, req: PopAckRequest) -> Awaitable[PopAckResponse]:
        return self._pop.ack(req.group, req.handles)

    def change_invisible(
        self, req: PopChangeInvisibleRequest
    ) -> Awaitable[PopChangeInvisibleResponse]:
        return self._pop.change_invisible(req.group, req.handle, req.invisible_ms)

    async def nack(self, req: PopNackRequest) -> Empty:
        await self._pop.nack(
            req.group,
            req.handle,
            req.delay_ms,
            release=req.release,
            reason=req.reason,
            max_attempts=req.max_attempts,
            on_exhausted=req.on_exhausted,
        )
        return Empty()

    async def status(self, req: PopStatusRequest) -> PopStatusResponse:
        return PopStatusResponse(queues=self._pop.status(req.group))

    def resume(self, req: PopResumeRequest) -> Awaitable[PopResumeResponse]:
        return self._pop.resume(req.group, req.message_id, req.action)
