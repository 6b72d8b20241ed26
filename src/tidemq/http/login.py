"""HTTP Basic authentication for the HTTP listener of a broker that requires logins
(`broker.auth_enabled`): every path (the registry's, `/metrics`) needs a user of the
broker and its password, as Confluent's registry takes `basic.auth.user.info` and
Prometheus `basic_auth`. The password travels in the request, so the listener should
run TLS (it does whenever the broker's listener does). Checked by the broker
(`Broker.check_password`: salted and iterated as for SCRAM, failures rate-limited per
client address); a success is remembered for the connection's user and password for
`_REMEMBER_S`, so that a client's requests do not each pay the key derivation.

A check that cannot decide (a replica group member between roles, or following a
leader it cannot reach: `tidemq.cli.replica_http`) raises `LoginUnavailable`: the
request gets 503 with the reason, never through unchecked."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Final

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["BasicAuth", "CheckPassword", "LoginUnavailable"]

#: (user, password, client host) -> whether they match.
CheckPassword = Callable[[str, str, str], Awaitable[bool]]
#: How long a checked user and password are taken without checking them again.
_REMEMBER_S: Final = 60.0
#: Remembered logins at most (the oldest are forgotten first).
_MAX_REMEMBERED: Final = 1024
#: What a 503 tells the client to wait before it tries again (seconds).
_RETRY_AFTER_S: Final = 1


class LoginUnavailable(Exception):
    """The password cannot be checked now (the message says why): 503, not 401."""


class BasicAuth:
    """ASGI middleware: requests without a valid `Authorization: Basic ...` get 401."""

    def __init__(self, app: ASGIApp, check: CheckPassword) -> None:
        self._app = app
        self._check = check
        self._good: dict[bytes, float] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        credentials = _basic(headers.get(b"authorization", b""))
        if credentials is None:
            await _refuse(send, "authentication required: HTTP Basic with a tidemq user")
            return
        user, password = credentials
        key = hashlib.sha256(f"{user}\0{password}".encode()).digest()
        now = time.monotonic()
        if self._good.get(key, 0.0) < now:
            host = (scope.get("client") or ("", 0))[0]
            try:
                good = await self._check(user, password, host)
            except LoginUnavailable as exc:
                await _refuse(send, f"cannot check the login now: {exc}", status=503)
                return
            if not good:
                self._good.pop(key, None)
                await _refuse(send, "wrong user name or password")
                return
            if len(self._good) >= _MAX_REMEMBERED:
                self._good.pop(next(iter(self._good)))
            self._good[key] = now + _REMEMBER_S
        # The console acts as this user (`console_clients.py`): ACLs apply to it as to
        # the user's own clients.
        scope = {**scope, "user": user, "tidemq.login": (user, password)}
        await self._app(scope, receive, send)


def _basic(header: bytes) -> tuple[str, str] | None:
    scheme, _, encoded = header.partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        user, sep, password = (
            base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        )
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep and user else None


async def _refuse(send: Send, message: str, status: int = 401) -> None:
    body = json.dumps({"error_code": status, "message": message}).encode()
    headers = [
        (b"content-type", b"application/vnd.schemaregistry.v1+json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b'Basic realm="tidemq"'))
    else:
        headers.append((b"retry-after", str(_RETRY_AFTER_S).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
