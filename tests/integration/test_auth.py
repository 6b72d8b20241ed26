"""SCRAM-SHA-256 authentication on the native listener (issue 16), opt-in with
`broker.auth_enabled`: an in-process broker with a bootstrap user; clients with the right
password work; a wrong password and an unknown user get the same refusal; a request
before login, and a replayed client-final, are refused and their connection closed;
users are managed through Admin by super users only; the `tidemq user` commands log in
with TIDEMQ_USERNAME / TIDEMQ_PASSWORD. (With auth off, the default, the rest of the
suite shows that nothing changed.)"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from typer.testing import CliRunner

import tidemq
import tidemq.aio
from tidemq.broker.auth import AUTH_FAILURE_DELAY_S
from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.cli.main import app
from tidemq.client.cluster import ClientConfig
from tidemq.core.errors import (
    AuthenticationFailed,
    AuthorizationFailed,
    ConfigError,
    InvalidRequest,
    Unsupported,
)
from tidemq.core.scram import MECHANISM, ScramClient
from tidemq.net.client import ClientConnection
from tidemq.net.server import PREAUTH_MAX_FRAME_BYTES
from tidemq.protocol.commands import (
    ListTopicsRequest,
    ListTopicsResponse,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from tidemq.store.config import StoreConfig

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop, StartBroker, ThreadedBroker

pytestmark = pytest.mark.timeout(60)

ADMIN, ADMIN_PASSWORD = "admin", "admin-secret-1"
_FRAME = 8 << 20


def _auth_broker(start_broker: StartBroker, **overrides: Any) -> BrokerEnv:
    return start_broker(
        auth_enabled=True,
        bootstrap_user=ADMIN,
        bootstrap_password=ADMIN_PASSWORD,
        **overrides,
    )


def _config(username: str | None = ADMIN, password: str | None = ADMIN_PASSWORD) -> ClientConfig:
    """No retries, short timeouts: refusals must be quick."""
    return ClientConfig(
        username=username,
        password=password,
        retries=0,
        connect_timeout_ms=5_000,
        request_timeout_ms=5_000,
    )


async def _open(address: str, **login: str) -> ClientConnection:
    return await ClientConnection.open(address, max_frame_bytes=_FRAME, **login)  # type: ignore[arg-type]


def test_clients_with_the_right_password_produce_and_consume(
    loop: Loop, start_broker: StartBroker
) -> None:
    env = _auth_broker(start_broker)
    config = _config()

    async def go() -> list[bytes | None]:
        async with tidemq.aio.Admin(env.address, client_config=config) as admin:
            await admin.create_topic("auth-t", 1)
        async with tidemq.aio.Producer(env.address, client_config=config) as producer:
            for i in range(3):
                await producer.send("auth-t", b"m%d" % i)
        consumer = tidemq.aio.StreamConsumer(env.address, start="earliest", client_config=config)
        try:
            consumer.assign([("auth-t", 0)])
            seen: list[bytes | None] = []
            while len(seen) < 3:
                seen.extend(m.value for m in await consumer.poll(timeout_ms=500))
            # the broker records who each connection is
            principals = {c.principal for c in env.broker._server._conns}
            assert principals == {f"User:{ADMIN}"}
            return seen
        finally:
            await consumer.close()

    assert loop.run(go(), timeout_s=30) == [b"m0", b"m1", b"m2"]


def test_wrong_password_and_unknown_user_get_the_same_refusal(
    loop: Loop, start_broker: StartBroker
) -> None:
    env = _auth_broker(start_broker)

    async def refused(username: str, password: str) -> tuple[str, float]:
        started = time.monotonic()
        with pytest.raises(AuthenticationFailed) as caught:
            await _open(env.address, username=username, password=password)
        return str(caught.value), time.monotonic() - started

    async def go() -> tuple[tuple[str, float], tuple[str, float]]:
        return await asyncio.gather(
            refused(ADMIN, "not-the-password"), refused("nobody", "whatever")
        )

    (wrong, wrong_s), (unknown, unknown_s) = loop.run(go(), timeout_s=30)
    assert wrong == unknown
    assert "unknown user or wrong password" in wrong
    assert wrong_s >= AUTH_FAILURE_DELAY_S * 0.9
    assert unknown_s >= AUTH_FAILURE_DELAY_S * 0.9

    # through the client API too: the broker's message, not retried
    async def admin_refused() -> None:
        async with tidemq.aio.Admin(env.address, client_config=_config(ADMIN, "nope")) as a:
            await a.list_topics()

    with pytest.raises(AuthenticationFailed, match="unknown user or wrong password"):
        loop.run(admin_refused(), timeout_s=30)


def test_a_request_before_login_is_refused_and_the_connection_closed(
    loop: Loop, start_broker: StartBroker
) -> None:
    env = _auth_broker(start_broker)

    async def go() -> None:
        conn = await _open(env.address)  # no login
        with pytest.raises(AuthenticationFailed, match="authenticate first"):
            await conn.request(ListTopicsRequest(), ListTopicsResponse, timeout_s=5)
        await loop.wait_until(lambda: not conn.is_open, timeout_s=5, what="close")
        # a frame over the pre-auth limit closes the connection too
        conn = await _open(env.address)
        big = SaslAuthenticateRequest(message=b"x" * PREAUTH_MAX_FRAME_BYTES)
        with pytest.raises(tidemq.BrokerNotAvailable):
            await conn.request(big, SaslAuthenticateResponse, timeout_s=5)
        assert not conn.is_open

    loop.run(go(), timeout_s=30)


def test_a_replayed_client_final_is_refused(loop: Loop, start_broker: StartBroker) -> None:
    env = _auth_broker(start_broker)

    async def exchange(conn: ClientConnection, client: ScramClient) -> bytes:
        offered, _ = await conn.request(
            SaslHandshakeRequest(mechanism=MECHANISM), SaslHandshakeResponse, timeout_s=5
        )
        assert offered.mechanisms == [MECHANISM]
        first, _ = await conn.request(
            SaslAuthenticateRequest(message=client.first()), SaslAuthenticateResponse, timeout_s=5
        )
        return client.receive_server_first(first.message)

    async def go() -> None:
        conn = await _open(env.address)
        client = ScramClient(ADMIN, ADMIN_PASSWORD, random_bytes=os.urandom)
        final = await exchange(conn, client)
        answer, _ = await conn.request(
            SaslAuthenticateRequest(message=final), SaslAuthenticateResponse, timeout_s=5
        )
        client.receive_server_final(answer.message)  # the server proved itself
        topics, _ = await conn.request(ListTopicsRequest(), ListTopicsResponse, timeout_s=5)
        assert topics is not None
        # once logged in, another SASL request is refused (the connection stays)
        with pytest.raises(InvalidRequest, match="authenticated already"):
            await conn.request(
                SaslAuthenticateRequest(message=final), SaslAuthenticateResponse, timeout_s=5
            )
        conn.close()
        # the recorded client-final, replayed into a new exchange: a new server nonce
        replay = await _open(env.address)
        await exchange(replay, ScramClient(ADMIN, ADMIN_PASSWORD, random_bytes=os.urandom))
        with pytest.raises(AuthenticationFailed):
            await replay.request(
                SaslAuthenticateRequest(message=final), SaslAuthenticateResponse, timeout_s=5
            )
        await loop.wait_until(lambda: not replay.is_open, timeout_s=5, what="close")

    loop.run(go(), timeout_s=30)


def test_users_are_managed_by_super_users_only(loop: Loop, start_broker: StartBroker) -> None:
    env = _auth_broker(start_broker)

    async def go() -> None:
        async with tidemq.aio.Admin(env.address, client_config=_config()) as admin:
            assert await admin.list_users() == [tidemq.aio.UserInfo(name=ADMIN, iterations=4096)]
            await admin.create_user("alice", "alice-pw-1", iterations=5000)
            users = await admin.list_users()
            assert [(u.name, u.iterations) for u in users] == [(ADMIN, 4096), ("alice", 5000)]
        alice = _config("alice", "alice-pw-1")
        async with tidemq.aio.Admin(env.address, client_config=alice) as admin:
            assert await admin.list_topics() == []  # alice logs in and works
            with pytest.raises(AuthorizationFailed, match="super users"):
                await admin.list_users()
            with pytest.raises(AuthorizationFailed):
                await admin.create_user("mallory", "mallory-pw")
        async with tidemq.aio.Admin(env.address, client_config=_config()) as admin:
            await admin.create_user("alice", "alice-pw-2")  # a new password
            with pytest.raises(AuthenticationFailed):
                await _open(env.address, username="alice", password="alice-pw-1")
            await (await _open(env.address, username="alice", password="alice-pw-2")).request(
                ListTopicsRequest(), ListTopicsResponse, timeout_s=5
            )
            await admin.delete_user("alice")
            assert [u.name for u in await admin.list_users()] == [ADMIN]
            with pytest.raises(InvalidRequest, match="no user"):
                await admin.delete_user("alice")
        with pytest.raises(AuthenticationFailed):
            await _open(env.address, username="alice", password="alice-pw-2")

    loop.run(go(), timeout_s=30)


def test_users_survive_a_restart_and_bootstrap_runs_only_on_an_empty_table(
    loop: Loop, start_broker: StartBroker
) -> None:
    env = _auth_broker(start_broker)

    async def add() -> None:
        async with tidemq.aio.Admin(env.address, client_config=_config()) as admin:
            await admin.create_user("bob", "bob-pw-1")

    loop.run(add())
    loop.run(env.broker.stop())
    # the same data directory, another bootstrap password: ignored (users exist)
    config = BrokerConfig(
        port=0,
        store=StoreConfig(data_dir=env.data_dir),
        auth_enabled=True,
        bootstrap_user=ADMIN,
        shutdown_timeout_ms=5_000,
    )
    again = Broker(config, embedded_nameserver=True, bootstrap_password="other-password")

    async def check() -> None:
        address = await again.start()
        try:
            conn = await _open(address, username="bob", password="bob-pw-1")
            conn.close()
            conn = await _open(address, username=ADMIN, password=ADMIN_PASSWORD)
            conn.close()
            with pytest.raises(AuthenticationFailed):
                await _open(address, username=ADMIN, password="other-password")
        finally:
            await again.stop()

    loop.run(check(), timeout_s=30)


def test_bootstrap_user_without_a_password_is_a_config_error(
    loop: Loop, start_broker: StartBroker
) -> None:
    with pytest.raises(ConfigError, match="TIDEMQ_BOOTSTRAP_PASSWORD"):
        start_broker(auth_enabled=True, bootstrap_user=ADMIN)


def test_sasl_on_a_broker_without_auth_is_unsupported(
    loop: Loop, start_broker: StartBroker
) -> None:
    env = start_broker()

    async def go() -> None:
        with pytest.raises(Unsupported, match="does not authenticate"):
            await _open(env.address, username=ADMIN, password=ADMIN_PASSWORD)

    loop.run(go(), timeout_s=30)


def test_cli_user_commands_log_in_from_the_environment(
    start_sync_broker: Callable[..., ThreadedBroker],
) -> None:
    tb = start_sync_broker(
        auth_enabled=True, bootstrap_user=ADMIN, bootstrap_password=ADMIN_PASSWORD
    )
    runner = CliRunner()
    login = {"TIDEMQ_USERNAME": ADMIN, "TIDEMQ_PASSWORD": ADMIN_PASSWORD}
    where = ["--bootstrap", tb.address]
    created = runner.invoke(
        app, ["user", "create", "carol", "--password-stdin", *where], input="carol-pw\n", env=login
    )
    assert created.exit_code == 0, created.output
    listed = runner.invoke(app, ["user", "list", "-o", "json", *where], env=login)
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == [
        {"name": ADMIN, "iterations": 4096},
        {"name": "carol", "iterations": 4096},
    ]
    deleted = runner.invoke(app, ["user", "delete", "carol", *where], env=login)
    assert deleted.exit_code == 0, deleted.output
    # without a login: refused with one error line
    anonymous = runner.invoke(app, ["user", "list", *where], env={"TIDEMQ_USERNAME": ""})
    assert anonymous.exit_code == 1
    assert "authenticate first" in anonymous.output
    no_password = runner.invoke(
        app, ["user", "list", *where], env={"TIDEMQ_USERNAME": ADMIN, "TIDEMQ_PASSWORD": ""}
    )
    assert no_password.exit_code == 2
    with tidemq.Admin(tb.address, client_config=_config()) as admin:
        assert [u.name for u in admin.list_users()] == [ADMIN]
