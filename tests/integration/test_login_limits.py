"""Login hardening (issue 16): a connection that does not log in within
`broker.login_timeout_ms` is closed; after AUTH_MAX_FAILURES_PER_ADDRESS failed logins
from one address within the window, further logins from it are refused at once, the
right password included, without the 1 s delay that each failure costs."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest

from tidemq.core.errors import AuthenticationFailed
from tidemq.core.limits import AUTH_MAX_FAILURES_PER_ADDRESS
from tidemq.net.client import ClientConnection

if TYPE_CHECKING:
    from tests.integration.conftest import Loop, StartBroker

pytestmark = pytest.mark.timeout(60)

ADMIN, ADMIN_PASSWORD = "admin", "admin-secret-1"
_FRAME = 8 << 20


def test_a_connection_that_does_not_log_in_is_closed(loop: Loop, start_broker: StartBroker) -> None:
    env = start_broker(
        auth_enabled=True,
        bootstrap_user=ADMIN,
        bootstrap_password=ADMIN_PASSWORD,
        login_timeout_ms=300,
    )

    async def go() -> float:
        host, port = env.address.rsplit(":", 1)
        started = time.monotonic()
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            # The broker closes it: read() returns b"" (bounded by the test's timeout).
            assert await asyncio.wait_for(reader.read(1), timeout=20) == b""
            return time.monotonic() - started
        finally:
            writer.close()
            await writer.wait_closed()

    assert 0.3 <= loop.run(go(), timeout_s=30) < 15


def test_too_many_failed_logins_from_one_address_are_refused_at_once(
    loop: Loop, start_broker: StartBroker
) -> None:
    env = start_broker(auth_enabled=True, bootstrap_user=ADMIN, bootstrap_password=ADMIN_PASSWORD)

    async def login(password: str) -> None:
        conn = await ClientConnection.open(
            env.address, max_frame_bytes=_FRAME, username=ADMIN, password=password
        )
        conn.close()

    async def go() -> tuple[list[BaseException | None], str, float]:
        # The failures in parallel: each is answered after 1 s.
        results = await asyncio.gather(
            *(login(f"wrong-{i}") for i in range(AUTH_MAX_FAILURES_PER_ADDRESS)),
            return_exceptions=True,
        )
        started = time.monotonic()
        with pytest.raises(AuthenticationFailed) as refused:
            await login(ADMIN_PASSWORD)
        return list(results), str(refused.value), time.monotonic() - started

    results, message, took_s = loop.run(go(), timeout_s=40)
    assert all(isinstance(r, AuthenticationFailed) for r in results)
    assert "too many failed logins from 127.0.0.1: retry in" in message
    assert took_s < 0.9  # at once, not after the 1 s of a failed login
