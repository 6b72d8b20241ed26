"""Who may change and who may see, against real processes (issue 16, ADR 20): a
`tidemq namesrv` with logins and ACLs and `tidemq broker`s on random ports of 127.0.0.1,
with the cluster secret.

* The security writer is fenced by its term: paused (SIGSTOP) past its lease, it is
  replaced by the next broker under a newer term; resumed, it refuses a change that
  reached it meanwhile (its lease ran out on its own clock), the name server refuses tables
  written under its old term, and it ends on the newer writer's tables.
* A standalone name server gives a user only the routes of the topics it may describe.

Every process is stopped at the end (a paused one resumed first); every wait is bounded
(`wait_until`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import pytest
from tests.integration.conftest import wait_until
from tests.support.server_process import ServerProcess, server_process

import tidemq
import tidemq.aio
from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.cluster.membership import check_secret, sign
from tidemq.cluster.security_link import PUSH_KIND, cluster_login, push_fields
from tidemq.core.clock import SystemClock
from tidemq.core.errors import AuthorizationFailed, TidemqError, WriterFenced
from tidemq.net.client import ClientConnection
from tidemq.protocol.codec import decode_response
from tidemq.protocol.commands import (
    Empty,
    GetRoutesRequest,
    GetRoutesResponse,
    UserListRequest,
    UserListResponse,
    UserUpsertRequest,
)
from tidemq.protocol.frame import Frame
from tidemq.protocol.security_messages import (
    SecurityPushRequest,
    SecurityPushResponse,
    SecuritySnapshot,
    counter_of,
    snapshot_digest,
    term_of,
)

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

pytestmark = pytest.mark.timeout(180)

SECRET = "a-cluster-secret-of-some-length"
ADMIN = "admin"
ADMIN_PASSWORD = "admin-password-long"
#: Fast failure detection, so a paused writer is replaced within seconds.
HEARTBEAT_MS = 200
TTL_MS = 1_500
#: Longest a change may take to reach every broker and name server on a loaded machine.
CONVERGE_S = 30.0
_REQUEST_TIMEOUT_S = 20.0
#: Longest one phase of a test may run (a few convergence waits), far below "hangs".
_PHASE_TIMEOUT_S = 120.0
#: Name server and admin answers are small.
_FRAME_BYTES = 1 << 20
_SECURE = (
    "--set", "broker.auth_enabled=true", "--set", "broker.authorization_enabled=true",
    "--set", f"broker.bootstrap_user={ADMIN}",
    "--set", f"broker.broker_ttl_ms={TTL_MS}",
    "--set", f"broker.broker_heartbeat_interval_ms={HEARTBEAT_MS}",
)  # fmt: skip


class Processes:
    """A name server process and broker processes registering with it."""

    def __init__(self, tmp_path: Path, stack: contextlib.ExitStack) -> None:
        self._tmp_path = tmp_path
        self._stack = stack
        self.nameserver = stack.enter_context(
            server_process(
                tmp_path, _SECURE, command="namesrv", log_name="namesrv.log", data_dir=None
            )
        )
        self.bootstrap = self.nameserver.address
        self.brokers: dict[str, ServerProcess] = {}

    def start(self, name: str) -> str:
        args = ("--namesrv", self.bootstrap, "--broker-name", name, "--http-port", "-1", *_SECURE)
        self.brokers[name] = self._stack.enter_context(
            server_process(
                self._tmp_path, args, command="broker", log_name=f"{name}.log", data_dir=name
            )
        )
        return self.brokers[name].address

    def address(self, name: str) -> str:
        return self.brokers[name].address


@pytest.fixture
def processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Processes]:
    monkeypatch.setenv("TIDEMQ_CLUSTER_SECRET", SECRET)
    monkeypatch.setenv("TIDEMQ_BOOTSTRAP_PASSWORD", ADMIN_PASSWORD)
    with contextlib.ExitStack() as stack:
        yield Processes(tmp_path, stack)


def _login(user: str = ADMIN, password: str = ADMIN_PASSWORD) -> ClientConfig:
    return ClientConfig(
        username=user, password=password, connect_timeout_ms=5_000, request_timeout_ms=5_000
    )


async def _connect(
    address: str, user: str = ADMIN, password: str = ADMIN_PASSWORD
) -> ClientConnection:
    return await ClientConnection.open(
        address, max_frame_bytes=_FRAME_BYTES, username=user, password=password
    )


async def _can_log_in(address: str, user: str, password: str) -> bool:
    """Whether `user` logs in at `address` now (a name server answers "retry" until a
    broker's registration has brought it the users)."""
    try:
        conn = await _connect(address, user, password)
    except TidemqError:
        return False
    conn.close()
    return True


async def _versions(bootstrap: str) -> dict[str, int]:
    """Each live broker's users-and-ACLs counter, as the name server reports it."""
    async with tidemq.aio.Admin(bootstrap, client_config=_login()) as admin:
        return {b.name: b.security_counter for b in await admin.cluster_status()}


async def _all_on_term(bootstrap: str, term: int) -> None:
    """Wait (bounded) until every live broker reports the same users-and-ACLs version,
    written under writer term `term`."""

    async def converged() -> bool:
        counters = set((await _versions(bootstrap)).values())
        return len(counters) == 1 and term_of(counters.pop()) == term

    await wait_until(converged, timeout_s=CONVERGE_S, what=f"every broker on term {term}")


async def _writer(bootstrap: str) -> str:
    client = ClusterClient(bootstrap, _login())
    try:
        return (await client.refresh_routes(force=True)).security_writer
    finally:
        await client.close()


async def _users(address: str) -> set[str]:
    conn = await _connect(address)
    try:
        answer, _ = await conn.request(
            UserListRequest(), UserListResponse, timeout_s=_REQUEST_TIMEOUT_S
        )
    finally:
        conn.close()
    return {u.name for u in answer.users}


def _upsert(name: str) -> UserUpsertRequest:
    """A user with keys of the right sizes (salt 16 bytes, SHA-256 keys 32, RFC 7677's
    minimum of 4096 iterations) that no password matches."""
    return UserUpsertRequest(
        name=name, salt=b"s" * 16, iterations=4096, stored_key=b"k" * 32, server_key=b"v" * 32
    )


def _send_now(conn: ClientConnection, request: msgspec.Struct) -> asyncio.Future[Frame]:
    """Write `request` to the socket now (a stopped process's kernel takes it) and return
    the future of its answer frame."""
    future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()

    def done(frame: Frame | None, error: BaseException | None) -> None:
        if frame is not None:
            future.set_result(frame)
        else:
            assert error is not None
            future.set_exception(error)

    conn.request_nowait(request, b"", timeout_s=_REQUEST_TIMEOUT_S, callback=done)
    return future


async def _forged_push(bootstrap: str, broker: str, counter: int) -> None:
    """What a deposed writer's late push looks like: tables with `counter`, signed with
    the cluster secret as `broker`."""
    key = check_secret(SECRET)
    clock = SystemClock()
    conn = await ClientConnection.open(bootstrap, max_frame_bytes=_FRAME_BYTES)
    try:
        await cluster_login(conn, broker, key, clock, _REQUEST_TIMEOUT_S)
        snapshot = SecuritySnapshot(counter=counter, digest=snapshot_digest([], []))
        push = SecurityPushRequest(broker_name=broker, snapshot=snapshot)
        push.signed_ms, push.signature = sign(
            key, PUSH_KIND, push_fields(push), now_ms=clock.now_ms()
        )
        await conn.request(push, SecurityPushResponse, timeout_s=_REQUEST_TIMEOUT_S)
    finally:
        conn.close()


def test_a_paused_writer_is_fenced_and_ends_on_the_newer_writers_tables(
    loop: Loop, processes: Processes
) -> None:
    a = processes.start("broker-a")  # the oldest: the first writer
    b = processes.start("broker-b")
    bootstrap = processes.bootstrap

    async def before() -> ClientConnection:
        await wait_until(
            lambda: _can_log_in(bootstrap, ADMIN, ADMIN_PASSWORD),
            timeout_s=CONVERGE_S,
            what="the name server learning the bootstrap user",
        )
        async with tidemq.aio.Admin(bootstrap, client_config=_login()) as admin:
            await admin.create_user("bob", "bob-password-long")
        assert await _writer(bootstrap) == a
        await _all_on_term(bootstrap, 1)
        return await _connect(a)  # logged in before the pause: no login needed after

    to_a = loop.run(before())
    os.kill(processes.brokers["broker-a"].pid, signal.SIGSTOP)
    try:

        async def while_paused() -> asyncio.Future[Frame]:
            await wait_until(
                lambda: _writer_is(bootstrap, b), timeout_s=CONVERGE_S, what="broker-b writing"
            )
            async with tidemq.aio.Admin(bootstrap, client_config=_login()) as admin:
                await admin.create_user("carol", "carol-password-long")  # on broker-b
            # Queued in broker-a's socket: the first thing it reads when it resumes,
            # before any name server has told it of broker-b's term.
            return _send_now(to_a, _upsert("mallory"))

        late = loop.run(while_paused())
    finally:
        os.kill(processes.brokers["broker-a"].pid, signal.SIGCONT)

    async def after() -> None:
        with pytest.raises(
            WriterFenced, match=r"lease on the security writer role \(term 1\) ran out"
        ):
            decode_response(await late, Empty)
        to_a.close()
        await _all_on_term(bootstrap, 2)
        assert await _users(a) == await _users(b) == {ADMIN, "bob", "carol"}
        assert await _writer(bootstrap) == b  # the role stays with broker-b
        async with tidemq.aio.Admin(bootstrap, client_config=_login()) as admin:
            status = await admin.cluster_status()
        assert {s.name: s.writer_term for s in status} == {"broker-a": 0, "broker-b": 2}
        # A late push of tables written under term 1 is refused by the name server.
        with pytest.raises(WriterFenced, match="writer term 1"):
            await _forged_push(bootstrap, "broker-a", counter_of(1, 1_000))

    loop.run(after(), timeout_s=_PHASE_TIMEOUT_S)


async def _writer_is(bootstrap: str, address: str) -> bool:
    return await _writer(bootstrap) == address


async def _routes(bootstrap: str, user: str, password: str) -> set[str]:
    client = ClusterClient(bootstrap, _login(user, password))
    try:
        routes = await client.refresh_routes(force=True)
        return set(routes.topics())
    finally:
        await client.close()


def _may(principal: str, operation: str, topic: str) -> tidemq.Acl:
    return tidemq.Acl(
        principal=principal, resource_type="topic", resource_name=topic, operation=operation
    )


def test_a_standalone_name_server_gives_a_user_only_the_routes_it_may_describe(
    loop: Loop, processes: Processes
) -> None:
    processes.start("broker-a")
    bootstrap = processes.bootstrap

    async def run() -> None:
        await wait_until(
            lambda: _can_log_in(bootstrap, ADMIN, ADMIN_PASSWORD),
            timeout_s=CONVERGE_S,
            what="the name server learning the bootstrap user",
        )
        async with tidemq.aio.Admin(bootstrap, client_config=_login()) as admin:
            for topic in ("orders", "payroll", "audit"):
                await admin.create_topic(topic, 1)
            await admin.create_user("bob", "bob-password-long")
            await admin.create_acls([_may("User:bob", "read", "orders")])
        bob = ("bob", "bob-password-long")

        async def bob_sees(topic: str) -> bool:
            """Once the name server has the entry (bob may log in earlier, with the
            version that added him but not yet the entry)."""
            try:
                return topic in await _routes(bootstrap, *bob)
            except TidemqError:  # bob is not known there yet
                return False

        await wait_until(lambda: bob_sees("orders"), timeout_s=CONVERGE_S, what="bob's entry")
        assert await _routes(bootstrap, ADMIN, ADMIN_PASSWORD) >= {"orders", "payroll", "audit"}
        assert await _routes(bootstrap, *bob) == {"orders"}
        conn = await _connect(bootstrap, "bob", "bob-password-long")
        try:
            named, _ = await conn.request(
                GetRoutesRequest(topics=["payroll", "orders"]),
                GetRoutesResponse,
                timeout_s=_REQUEST_TIMEOUT_S,
            )
        finally:
            conn.close()
        assert [r.topic for r in named.routes] == ["orders"]
        assert named.denied == ["payroll"]
        async with tidemq.aio.Admin(bootstrap, client_config=_login(*bob)) as as_bob:
            with pytest.raises(AuthorizationFailed, match="DESCRIBE cluster"):
                await as_bob.cluster_status()
        async with tidemq.aio.Admin(bootstrap, client_config=_login()) as admin:
            await admin.create_acls([_may("User:bob", "write", "audit")])

        await wait_until(lambda: bob_sees("audit"), timeout_s=CONVERGE_S, what="audit's entry")
        assert await _routes(bootstrap, *bob) == {"orders", "audit"}

    loop.run(run(), timeout_s=_PHASE_TIMEOUT_S)
