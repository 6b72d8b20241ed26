"""Each request's way through the broker: login, the peer brokers' one request, the ACL
check, the ACL and login requests, producer-id ownership, then the router
(`handler_table.RequestRouter`), timed per request kind, and list answers filtered to
what the principal may describe (docs/design/security.md)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from tidemq.broker.auth import AUTH_CODES, Authenticator
from tidemq.broker.authorization import Authorization
from tidemq.broker.handler_table import RequestRouter
from tidemq.broker.handlers.data import DataHandlers
from tidemq.broker.metrics import RequestTimes
from tidemq.broker.peer_links import check_peer_request, is_peer
from tidemq.broker.producer_owners import ProducerOwners
from tidemq.broker.request_permissions import ACL_CODES, FILTERED_CODES
from tidemq.broker.store_gateway import StoreGateway
from tidemq.net.server import ServerConnection
from tidemq.protocol.codec import decode_request
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import FetchOffsetsRequest, FetchOffsetsResponse, ProduceResponse
from tidemq.protocol.frame import Frame

__all__ = ["RequestDispatch"]


class RequestDispatch:
    """The broker's request entry points (`dispatch` in a task per request, `answer_now`
    in the protocol callback); one per broker, on its loop."""

    def __init__(
        self,
        *,
        auth: Authenticator,
        authz: Authorization,
        producer_owners: ProducerOwners,
        gateway: StoreGateway,
        router: RequestRouter,
        data: DataHandlers,
        peer_offsets: Callable[[FetchOffsetsRequest], Awaitable[FetchOffsetsResponse]],
        timer_topic_of: Callable[[str], str | None],
        confirm_change: Callable[[], Awaitable[None]],
        request_times: RequestTimes,
    ) -> None:
        self._auth = auth
        self._authz = authz
        self._producer_owners = producer_owners
        self._gateway = gateway
        self._router = router
        self._data = data
        self._peer_offsets = peer_offsets
        self._timer_topic_of = timer_topic_of
        #: Returns once a majority of the name servers hold the security tables as they
        #: are now (ADR 26); ChangeUnconfirmed otherwise.
        self._confirm_change = confirm_change
        self.request_times = request_times

    async def dispatch(self, frame: Frame, conn: ServerConnection) -> tuple[Any, bytes]:
        auth = self._auth
        if auth.enabled and conn.principal is None:
            # Before login only SASL_HANDSHAKE and SASL_AUTHENTICATE are served.
            return await auth.before_login(frame, conn), b""
        code, header = decode_request(frame)
        if is_peer(conn.principal):
            # Another broker, logged in with the cluster secret: one request, no ACLs.
            return await self._peer_offsets(check_peer_request(code, header)), b""
        authz = self._authz
        if authz.enabled:
            authz.check(code, header, conn.principal, conn.host)
            if code is RequestCode.CANCEL_DELAYED:
                self._authorize_cancel(header.message_id, conn)
        if code in AUTH_CODES:
            return await auth.after_login(code, header, conn), b""
        if code in ACL_CODES:
            return await self._acl_request(code, header), b""
        principal = conn.principal
        if authz.enabled and code is RequestCode.GET_ROUTES:
            header.known = authz.route_token(header.known, principal, conn.host)
        if (
            principal is not None
            and code is RequestCode.PRODUCE
            and header.producer_id >= 0
            and not self._producer_owners.known(header.producer_id, principal)
        ):
            await self._producer_owners.check(header.producer_id, principal)
        started = time.perf_counter()
        try:
            answer, body = await self._router.serve(code, header, frame, conn)
        finally:
            self.request_times.observe(code.name, time.perf_counter() - started)
        if principal is not None and code is RequestCode.INIT_PRODUCER:
            await self._producer_owners.issued(answer.producer_id, principal)
        if authz.enabled and code in FILTERED_CODES:
            answer = authz.filter(code, header, answer, principal, conn.host)
            if code is RequestCode.GET_ROUTES:
                answer.generation = authz.route_token(answer.generation, principal, conn.host)
        return answer, body

    def answer_now(self, frame: Frame, conn: ServerConnection) -> ProduceResponse | None:
        """A request answered from the protocol callback, with no task, when it needs no
        waiting (`DataHandlers.produce_now`): a PRODUCE, with no authentication and no
        ACLs to check (those go through `dispatch`). None: `dispatch` serves it."""
        if (
            frame.code != RequestCode.PRODUCE
            or self._auth.enabled
            or self._authz.enabled
            or not self._gateway.appends_at_once
        ):
            return None
        started = time.perf_counter()
        _, header = decode_request(frame)
        answer = self._data.produce_now(header, frame.body)
        if answer is not None:
            self.request_times.observe("PRODUCE", time.perf_counter() - started)
        return answer

    def _authorize_cancel(self, message_id: str, conn: ServerConnection) -> None:
        """WRITE on the topic of the delayed message a cancel names (an id unknown here is
        answered UnknownMessage by the cancel itself)."""
        topic = self._timer_topic_of(message_id)
        if topic is not None:
            self._authz.check_cancel(conn.principal, conn.host, topic)

    async def _acl_request(self, code: RequestCode, header: Any) -> Any:
        """ACL_CREATE / ACL_DELETE / ACL_LIST (authorized like any request above; with
        authorization off, anyone logged in, or anyone, may prepare entries)."""
        authz = self._authz
        if code is RequestCode.ACL_LIST:
            return authz.listed(header)
        if code is RequestCode.ACL_CREATE:
            answer = await self._gateway.call(lambda _: authz.create(header))
        else:
            answer = await self._gateway.call(lambda _: authz.delete(header))
        await self._confirm_change()  # answered once a majority holds it (ADR 26)
        return answer
