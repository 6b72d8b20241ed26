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

import pytest
from tests.integration.conftest import wait_until
from tests.support.security_cluster import (
    ADMIN,
    ADMIN_PASSWORD,
    CONVERGE_S,
    PHASE_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    SECRET,
    Processes,
    all_on_term,
    can_log_in,
    connect,
    forged_push,
    login,
    send_now,
    upsert,
    users,
    writer,
    writer_is,
)

import tidemq
import tidemq.aio
from tidemq.client.cluster import ClusterClient
from tidemq.core.errors import AuthorizationFailed, TidemqError, WriterFenced
from tidemq.net.client import ClientConnection
from tidemq.protocol.codec import decode_response
from tidemq.protocol.commands import Empty, GetRoutesRequest, GetRoutesResponse
from tidemq.protocol.frame import Frame
from tidemq.protocol.security_messages import counter_of

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Processes]:
    monkeypatch.setenv("TIDEMQ_CLUSTER_SECRET", SECRET)
    monkeypatch.setenv("TIDEMQ_BOOTSTRAP_PASSWORD", ADMIN_PASSWORD)
    with contextlib.ExitStack() as stack:
        yield Processes(tmp_path, stack)


def test_a_pausedwriter_is_fenced_and_ends_on_the_newer_writers_tables(
    loop: Loop, processes: Processes
) -> None:
    a = processes.start("broker-a")  # the oldest: the first writer
    b = processes.start("broker-b")
    bootstrap = processes.bootstrap

    async def before() -> ClientConnection:
        await wait_until(
            lambda: can_log_in(bootstrap, ADMIN, ADMIN_PASSWORD),
            timeout_s=CONVERGE_S,
            what="the name server learning the bootstrap user",
        )
        async with tidemq.aio.Admin(bootstrap, client_config=login()) as admin:
            await admin.create_user("bob", "bob-password-long")
        assert await writer(bootstrap) == a
        await all_on_term(bootstrap, 1)
        return await connect(a)  # logged in before the pause: no login needed after

    to_a = loop.run(before())
    os.kill(processes.brokers["broker-a"].pid, signal.SIGSTOP)
    try:

        async def while_paused() -> asyncio.Future[Frame]:
            await wait_until(
                lambda: writer_is(bootstrap, b), timeout_s=CONVERGE_S, what="broker-b writing"
            )
            async with tidemq.aio.Admin(bootstrap, client_config=login()) as admin:
                await admin.create_user("carol", "carol-password-long")  # on broker-b
            # Queued in broker-a's socket: the first thing it reads when it resumes,
            # before any name server has told it of broker-b's term.
            return send_now(to_a, upsert("mallory"))

        late = loop.run(while_paused())
    finally:
        os.kill(processes.brokers["broker-a"].pid, signal.SIGCONT)

    async def after() -> None:
        with pytest.raises(
            WriterFenced, match=r"lease on the security writer role \(term 1\) ran out"
        ):
            decode_response(await late, Empty)
        to_a.close()
        await all_on_term(bootstrap, 2)
        assert await users(a) == await users(b) == {ADMIN, "bob", "carol"}
        assert await writer(bootstrap) == b  # the role stays with broker-b
        async with tidemq.aio.Admin(bootstrap, client_config=login()) as admin:
            status = await admin.cluster_status()
        assert {s.name: s.writer_term for s in status} == {"broker-a": 0, "broker-b": 2}
        # A late push of tables written under term 1 is refused by the name server.
        with pytest.raises(WriterFenced, match="writer term 1"):
            await forged_push(bootstrap, "broker-a", counter_of(1, 1_000))

    loop.run(after(), timeout_s=PHASE_TIMEOUT_S)


async def _routes(bootstrap: str, user: str, password: str) -> set[str]:
    client = ClusterClient(bootstrap, login(user, password))
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
            lambda: can_log_in(bootstrap, ADMIN, ADMIN_PASSWORD),
            timeout_s=CONVERGE_S,
            what="the name server learning the bootstrap user",
        )
        async with tidemq.aio.Admin(bootstrap, client_config=login()) as admin:
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
        conn = await connect(bootstrap, "bob", "bob-password-long")
        try:
            named, _ = await conn.request(
                GetRoutesRequest(topics=["payroll", "orders"]),
                GetRoutesResponse,
                timeout_s=REQUEST_TIMEOUT_S,
            )
        finally:
            conn.close()
        assert [r.topic for r in named.routes] == ["orders"]
        assert named.denied == ["payroll"]
        async with tidemq.aio.Admin(bootstrap, client_config=login(*bob)) as as_bob:
            with pytest.raises(AuthorizationFailed, match="DESCRIBE cluster"):
                await as_bob.cluster_status()
        async with tidemq.aio.Admin(bootstrap, client_config=login()) as admin:
            await admin.create_acls([_may("User:bob", "write", "audit")])

        await wait_until(lambda: bob_sees("audit"), timeout_s=CONVERGE_S, what="audit's entry")
        assert await _routes(bootstrap, *bob) == {"orders", "audit"}

    loop.run(run(), timeout_s=PHASE_TIMEOUT_S)
