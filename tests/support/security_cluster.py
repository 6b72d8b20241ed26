"""A secured cluster of real processes for the security writer's tests (ADR 20, 26):
`tidemq namesrv`s with logins and ACLs and `tidemq broker`s registering with all of them,
on random ports of 127.0.0.1, with the cluster secret; and the requests those tests send
(a user upsert written to a socket now, a forged late push).

Every process is stopped when the fixture's stack closes (`ServerProcess.stop`, which
resumes nothing: a test that stops a process with SIGSTOP resumes it in a `finally`)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import msgspec
from tests.integration.conftest import wait_until
from tests.support.server_process import ServerProcess, server_process

import tidemq.aio
from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.cluster.membership import check_secret, sign
from tidemq.cluster.security_link import PUSH_KIND, cluster_login, push_fields
from tidemq.core.clock import SystemClock
from tidemq.core.errors import TidemqError
from tidemq.net.client import ClientConnection
from tidemq.protocol.commands import UserListRequest, UserListResponse, UserUpsertRequest
from tidemq.protocol.frame import Frame
from tidemq.protocol.security_messages import (
    SecurityPushRequest,
    SecurityPushResponse,
    SecuritySnapshot,
    UserRow,
    snapshot_digest,
    term_of,
)

__all__ = [
    "ADMIN",
    "ADMIN_PASSWORD",
    "CONVERGE_S",
    "PHASE_TIMEOUT_S",
    "REQUEST_TIMEOUT_S",
    "SECRET",
    "Processes",
    "all_on_term",
    "can_log_in",
    "connect",
    "forged_push",
    "login",
    "send_now",
    "upsert",
    "users",
    "writer",
    "writer_is",
]

SECRET = "a-cluster-secret-of-some-length"
ADMIN = "admin"
ADMIN_PASSWORD = "admin-password-long"
#: Fast failure detection, so a paused writer is replaced within seconds.
HEARTBEAT_MS = 200
TTL_MS = 1_500
#: Longest a change may take to reach every broker and name server on a loaded machine.
CONVERGE_S = 30.0
REQUEST_TIMEOUT_S = 20.0
#: Longest one phase of a test may run (a few convergence waits), far below "hangs".
PHASE_TIMEOUT_S = 120.0
#: Name server and admin answers are small.
_FRAME_BYTES = 1 << 20


def _secure(ttl_ms: int) -> tuple[str, ...]:
    return (
        "--set", "broker.auth_enabled=true", "--set", "broker.authorization_enabled=true",
        "--set", f"broker.bootstrap_user={ADMIN}",
        "--set", f"broker.broker_ttl_ms={ttl_ms}",
        "--set", f"broker.broker_heartbeat_interval_ms={HEARTBEAT_MS}",
    )  # fmt: skip


class Processes:
    """`name_servers` name server processes and broker processes registering with all
    of them; the first name server is the clients' bootstrap. The caller sets
    TIDEMQ_CLUSTER_SECRET and TIDEMQ_BOOTSTRAP_PASSWORD in the environment first."""

    def __init__(
        self,
        tmp_path: Path,
        stack: contextlib.ExitStack,
        *,
        name_servers: int = 1,
        ttl_ms: int = TTL_MS,
    ) -> None:
        self._tmp_path = tmp_path
        self._stack = stack
        self._secure = _secure(ttl_ms)
        self.nameservers = [
            stack.enter_context(
                server_process(
                    tmp_path,
                    self._secure,
                    command="namesrv",
                    log_name=f"namesrv-{i}.log",
                    data_dir=None,
                )
            )
            for i in range(name_servers)
        ]
        self.nameserver = self.nameservers[0]
        self.bootstrap = self.nameserver.address
        self.brokers: dict[str, ServerProcess] = {}

    def start(self, name: str) -> str:
        servers = ",".join(ns.address for ns in self.nameservers)
        args = ("--namesrv", servers, "--broker-name", name, "--http-port", "-1", *self._secure)
        self.brokers[name] = self._stack.enter_context(
            server_process(
                self._tmp_path, args, command="broker", log_name=f"{name}.log", data_dir=name
            )
        )
        return self.brokers[name].address

    def address(self, name: str) -> str:
        return self.brokers[name].address


def login(user: str = ADMIN, password: str = ADMIN_PASSWORD) -> ClientConfig:
    return ClientConfig(
        username=user, password=password, connect_timeout_ms=5_000, request_timeout_ms=5_000
    )


async def connect(
    address: str, user: str = ADMIN, password: str = ADMIN_PASSWORD
) -> ClientConnection:
    return await ClientConnection.open(
        address, max_frame_bytes=_FRAME_BYTES, username=user, password=password
    )


async def can_log_in(address: str, user: str, password: str) -> bool:
    """Whether `user` logs in at `address` now (a name server answers "retry" until a
    broker's registration has brought it the users)."""
    try:
        conn = await connect(address, user, password)
    except TidemqError:
        return False
    conn.close()
    return True


async def versions(bootstrap: str) -> dict[str, int]:
    """Each live broker's users-and-ACLs counter, as the name server reports it."""
    async with tidemq.aio.Admin(bootstrap, client_config=login()) as admin:
        return {b.name: b.security_counter for b in await admin.cluster_status()}


async def all_on_term(bootstrap: str, term: int) -> None:
    """Wait (bounded) until every live broker reports the same users-and-ACLs version,
    written under writer term `term`."""

    async def converged() -> bool:
        counters = set((await versions(bootstrap)).values())
        return len(counters) == 1 and term_of(counters.pop()) == term

    await wait_until(converged, timeout_s=CONVERGE_S, what=f"every broker on term {term}")


async def writer(bootstrap: str) -> str:
    client = ClusterClient(bootstrap, login())
    try:
        return (await client.refresh_routes(force=True)).security_writer
    finally:
        await client.close()


async def writer_is(bootstrap: str, address: str) -> bool:
    return await writer(bootstrap) == address


async def users(address: str) -> set[str]:
    conn = await connect(address)
    try:
        answer, _ = await conn.request(
            UserListRequest(), UserListResponse, timeout_s=REQUEST_TIMEOUT_S
        )
    finally:
        conn.close()
    return {u.name for u in answer.users}


def upsert(name: str) -> UserUpsertRequest:
    """A user with keys of the right sizes (salt 16 bytes, SHA-256 keys 32, RFC 7677's
    minimum of 4096 iterations) that no password matches."""
    return UserUpsertRequest(
        name=name, salt=b"s" * 16, iterations=4096, stored_key=b"k" * 32, server_key=b"v" * 32
    )


def send_now(conn: ClientConnection, request: msgspec.Struct) -> asyncio.Future[Frame]:
    """Write `request` to the socket now (a stopped process's kernel takes it) and return
    the future of its answer frame."""
    future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()

    def done(frame: Frame | None, error: BaseException | None) -> None:
        if future.done():
            return
        if frame is not None:
            future.set_result(frame)
        else:
            assert error is not None
            future.set_exception(error)

    conn.request_nowait(request, b"", timeout_s=REQUEST_TIMEOUT_S, callback=done)
    return future


async def forged_push(
    server: str, broker: str, counter: int, *, users: tuple[str, ...] = (), writer_term: int = 0
) -> None:
    """What a deposed writer's late push looks like: tables with `counter` (and `users`),
    signed with the cluster secret as `broker`; with `writer_term`, a confirmation."""
    key = check_secret(SECRET)
    clock = SystemClock()
    conn = await ClientConnection.open(server, max_frame_bytes=_FRAME_BYTES)
    try:
        await cluster_login(conn, broker, key, clock, REQUEST_TIMEOUT_S)
        rows = [
            UserRow(
                name=u, salt=b"s" * 16, iterations=4096, stored_key=b"k" * 32, server_key=b"v" * 32
            )
            for u in users
        ]
        snapshot = SecuritySnapshot(counter=counter, digest=snapshot_digest(rows, []), users=rows)
        push = SecurityPushRequest(broker_name=broker, snapshot=snapshot, writer_term=writer_term)
        push.signed_ms, push.signature = sign(
            key, PUSH_KIND, push_fields(push), now_ms=clock.now_ms()
        )
        await conn.request(push, SecurityPushResponse, timeout_s=REQUEST_TIMEOUT_S)
    finally:
        conn.close()
