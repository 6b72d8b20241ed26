"""The login of a connection that has not authenticated yet, shared by the broker's
listener and a standalone name server's (docs/design/security.md, ADR 15).

Before login a connection may send only:

* SASL_HANDSHAKE: the mechanism it will use. SCRAM-SHA-256 for users; the cluster
  mechanism (`CLUSTER_MECHANISM`) for a broker logging in to a name server, when the gate
  has a `cluster_login` check.
* SASL_AUTHENTICATE: SCRAM's client-first then client-final, driven through
  `tidemq.core.scram.ScramServer` (principal `User:<name>`); or, after a cluster
  handshake, one `ClusterLogin` (principal `Broker:<name>`).

Anything else is answered AuthenticationFailed (and the server closes the connection). A
failed exchange is answered after `AUTH_FAILURE_DELAY_S`, with the same text for an
unknown user and a wrong password, and counts against the client's address
(`LoginLimit`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any, Final

from tidemq.core.clock import Clock
from tidemq.core.errors import AuthenticationFailed, BrokerNotAvailable
from tidemq.core.scram import MECHANISM, Credentials, ScramError, ScramServer
from tidemq.net.login_limit import LoginLimit
from tidemq.net.server import ServerConnection
from tidemq.protocol.codec import decode_request
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from tidemq.protocol.frame import Frame, RemoteProtocolError
from tidemq.protocol.security_messages import CLUSTER_MECHANISM

__all__ = ["AUTH_FAILURE_DELAY_S", "FAILED", "LoginGate"]

log = logging.getLogger(__name__)

#: A failed login is answered this late (design section 2, check 4): online password
#: guessing gets one try per second per connection.
AUTH_FAILURE_DELAY_S: Final = 1.0
#: What a failed exchange says, whatever failed: a known user's wrong password and an
#: unknown user look alike.
FAILED: Final = "authentication failed: unknown user or wrong password"


class _ClusterPending:
    """`ServerConnection.auth_exchange` after a cluster handshake."""


_CLUSTER_PENDING: Final = _ClusterPending()


class LoginGate:
    """Drives the login of one server's connections (on its loop)."""

    def __init__(
        self,
        users: Callable[[str], Credentials | None],
        *,
        mock_secret: bytes,
        clock: Clock,
        what: str = "broker",
        cluster_login: Callable[[bytes], str] | None = None,
        not_ready: Callable[[], str | None] | None = None,
    ) -> None:
        """`users`: a user's credentials (None: unknown). `mock_secret`: what unknown
        users' fake credentials derive from. `what` names the server in refusals.
        `cluster_login`: checks a `ClusterLogin` message and returns the principal
        (raises AuthenticationFailed); None: the cluster mechanism is not offered.
        `not_ready()`: why users' logins cannot be checked yet (None: they can); such a
        login is answered BrokerNotAvailable (retriable), not refused as a wrong
        password."""
        self._users = users
        self._mock_secret = mock_secret
        self._what = what
        self._cluster_login = cluster_login
        self._not_ready = not_ready
        self.limit = LoginLimit(clock)

    async def before_login(self, frame: Frame, conn: ServerConnection) -> Any:
        """The answer to a request on a connection not yet authenticated."""
        try:
            code: RequestCode | None
            code, header = decode_request(frame)
        except RemoteProtocolError:
            code, header = None, None
        if code is RequestCode.SASL_HANDSHAKE:
            assert isinstance(header, SaslHandshakeRequest)
            return self._handshake(header.mechanism, conn)
        if code is RequestCode.SASL_AUTHENTICATE:
            assert isinstance(header, SaslAuthenticateRequest)
            if conn.auth_exchange is _CLUSTER_PENDING:
                return await self._cluster(header.message, conn)
            return await self._authenticate(header.message, conn)
        name = code.name if code is not None else "an undecodable request"
        raise AuthenticationFailed(
            f"authenticate first: {name} refused before SASL authentication "
            f"(this {self._what} requires a user name and password)"
        )

    def _handshake(self, mechanism: str, conn: ServerConnection) -> SaslHandshakeResponse:
        wait_s = self.limit.refused_for_s(conn.host)
        if wait_s is not None:
            raise AuthenticationFailed(
                f"too many failed logins from {conn.host}: retry in {wait_s:.0f} s"
            )
        offered = [MECHANISM] if self._cluster_login is None else [MECHANISM, CLUSTER_MECHANISM]
        if mechanism not in offered:
            raise AuthenticationFailed(
                f"mechanism {mechanism!r} is not supported; this {self._what} offers "
                f"{', '.join(offered)}"
            )
        if mechanism == MECHANISM and self._not_ready is not None:
            reason = self._not_ready()
            if reason is not None:
                raise BrokerNotAvailable(f"this {self._what} cannot check logins yet: {reason}")
        conn.auth_exchange = _CLUSTER_PENDING if mechanism == CLUSTER_MECHANISM else None
        return SaslHandshakeResponse(mechanisms=offered)

    async def _cluster(self, message: bytes, conn: ServerConnection) -> SaslAuthenticateResponse:
        assert self._cluster_login is not None
        try:
            principal = self._cluster_login(message)
        except AuthenticationFailed:
            conn.auth_exchange = None
            self.limit.failed(conn.host)
            await asyncio.sleep(AUTH_FAILURE_DELAY_S)
            raise
        conn.authenticated(principal)
        return SaslAuthenticateResponse(message=b"")

    async def _authenticate(self, message: bytes, conn: ServerConnection) -> Any:
        exchange = conn.auth_exchange
        try:
            if exchange is None:
                server = ScramServer(
                    self._users, random_bytes=os.urandom, mock_secret=self._mock_secret
                )
                conn.auth_exchange = server
                return SaslAuthenticateResponse(message=server.receive_client_first(message))
            assert isinstance(exchange, ScramServer)
            final = exchange.receive_client_final(message)
        except ScramError as exc:
            conn.auth_exchange = None
            self.limit.failed(conn.host)
            log.info("login from %s failed: %s", conn.peer, exc)
            await asyncio.sleep(AUTH_FAILURE_DELAY_S)
            reason = FAILED if exc.server_error == "invalid-proof" else f"{FAILED} ({exc})"
            raise AuthenticationFailed(reason) from None
        conn.authenticated(f"User:{exchange.username}")
        return SaslAuthenticateResponse(message=final)
