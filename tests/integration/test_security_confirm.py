"""A change of users or ACL entries is acknowledged only once a majority of the name
servers confirmed it under the writer's term (issue 16, ADR 26), against real processes:
three `tidemq namesrv`s and two `tidemq broker`s registering with all of them, with the
cluster secret, on random ports of 127.0.0.1.

Each test drives rows of ADR 26's table with SIGSTOP / SIGCONT of name servers and
`kill -9` of the writer:

* one name server of three stopped: the change is acknowledged, and both running name
  servers hold it when the client hears so; two stopped: the client is told
  ChangeUnconfirmed; resumed, they confirm the queued push, and the retry succeeds;
* the writer killed right after an acknowledgement: the next writer (term 2) has the
  change before it writes, and a late confirmation under term 1 is refused everywhere;
* the writer killed after its pushes were sent but before a majority answered: the
  change is left to the name servers, which confirm it when they resume; the next
  writer has it.

Every process is stopped at the end (a stopped one resumed first); every wait is bounded
(`wait_until`)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.integration.conftest import wait_until
from tests.support.security_cluster import (
    ADMIN,
    ADMIN_PASSWORD,
    CONVERGE_S,
    PHASE_TIMEOUT_S,
    SECRET,
    Processes,
    all_on_term,
    can_log_in,
    connect,
    forged_push,
    login,
    send_now,
    users,
    writer,
    writer_is,
)

import tidemq.aio
from tidemq.core.errors import (
    BrokerNotAvailable,
    ChangeUnconfirmed,
    TidemqError,
    WriterFenced,
)
from tidemq.core.scram import make_credentials
from tidemq.net.client import ClientConnection
from tidemq.protocol.codec import decode_response
from tidemq.protocol.commands import Empty, UserUpsertRequest
from tidemq.protocol.security_messages import counter_of

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

pytestmark = pytest.mark.timeout(240)

#: Long enough that a writer whose two name servers were just stopped still holds its
#: lease when the change reaches it (the confirmation then fails on its own timeout).
SLOW_TTL_MS = 3_000


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEMQ_CLUSTER_SECRET", SECRET)
    monkeypatch.setenv("TIDEMQ_BOOTSTRAP_PASSWORD", ADMIN_PASSWORD)


@pytest.fixture
def stack() -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as s:
        yield s


def _user(name: str) -> UserUpsertRequest:
    """`name` with password `<name>-password-long` (salted and iterated here)."""
    c = make_credentials(f"{name}-password-long", b"salt-of-16-bytes")
    return UserUpsertRequest(
        name=name,
        salt=c.salt,
        iterations=c.iterations,
        stored_key=c.stored_key,
        server_key=c.server_key,
    )


async def _holds(server: str, name: str) -> bool:
    """Whether name server `server` holds user `name` (its logins check the tables held)."""
    return await can_log_in(server, name, f"{name}-password-long")


async def _started(processes: Processes) -> ClientConnection:
    """broker-a writing under term 1, every broker on it; a connection to broker-a."""
    bootstrap = processes.bootstrap
    await wait_until(
        lambda: can_log_in(bootstrap, ADMIN, ADMIN_PASSWORD),
        timeout_s=CONVERGE_S,
        what="the name server learning the bootstrap user",
    )
    async with tidemq.aio.Admin(bootstrap, client_config=login()) as admin:
        await admin.create_user("bob", "bob-password-long")
    assert await writer(bootstrap) == processes.address("broker-a")
    await all_on_term(bootstrap, 1)
    return await connect(processes.address("broker-a"))


def _signal(process_ids: list[int], sig: signal.Signals) -> None:
    for pid in process_ids:
        os.kill(pid, sig)


def test_a_change_is_answered_once_a_majority_of_the_name_servers_confirmed_it(
    loop: Loop, tmp_path: Path, env: None, stack: contextlib.ExitStack
) -> None:
    processes = Processes(tmp_path, stack, name_servers=3, ttl_ms=SLOW_TTL_MS)
    a = processes.start("broker-a")
    b = processes.start("broker-b")
    ns = [p.address for p in processes.nameservers]
    third = [processes.nameservers[2].pid]
    second = [processes.nameservers[1].pid]
    to_a = loop.run(_started(processes))

    _signal(third, signal.SIGSTOP)
    try:

        async def one_stopped() -> None:
            await to_a.request(_user("carol"), Empty, timeout_s=CONVERGE_S)
            # Acknowledged: a majority holds it now, that is both running name servers.
            assert await _holds(ns[0], "carol")
            assert await _holds(ns[1], "carol")

        loop.run(one_stopped(), timeout_s=PHASE_TIMEOUT_S)
        _signal(second, signal.SIGSTOP)
        try:

            async def two_stopped() -> None:
                with pytest.raises(ChangeUnconfirmed, match="not confirmed by a majority"):
                    await to_a.request(_user("dave"), Empty, timeout_s=CONVERGE_S)
                assert await _holds(ns[0], "dave")  # the one running name server has it

            loop.run(two_stopped(), timeout_s=PHASE_TIMEOUT_S)
        finally:
            _signal(second, signal.SIGCONT)
    finally:
        _signal(third, signal.SIGCONT)

    async def resumed() -> None:
        # The queued confirmations reach the resumed name servers, which still hold
        # broker-a's term: the change takes effect everywhere, and the retry (the same
        # request) is answered once broker-a's lease is renewed (WriterFenced until then:
        # it ran out while two name servers were stopped).
        async def retried() -> bool:
            try:
                await to_a.request(_user("dave"), Empty, timeout_s=CONVERGE_S)
            except (WriterFenced, ChangeUnconfirmed, BrokerNotAvailable):
                return False
            return True

        await wait_until(retried, timeout_s=CONVERGE_S, what="the retry answered")
        to_a.close()
        await all_on_term(processes.bootstrap, 1)
        for server in ns:
            assert await _holds(server, "dave")
        assert await users(a) == await users(b) == {ADMIN, "bob", "carol", "dave"}

    loop.run(resumed(), timeout_s=PHASE_TIMEOUT_S)


def test_an_acknowledged_change_survives_its_writer_killed(
    loop: Loop, tmp_path: Path, env: None, stack: contextlib.ExitStack
) -> None:
    processes = Processes(tmp_path, stack, name_servers=3)
    processes.start("broker-a")
    b = processes.start("broker-b")
    ns = [p.address for p in processes.nameservers]
    to_a = loop.run(_started(processes))
    loop.run(to_a.request(_user("dave"), Empty, timeout_s=CONVERGE_S))
    to_a.close()
    processes.brokers["broker-a"].proc.kill()  # kill -9 right after the acknowledgement
    processes.brokers["broker-a"].proc.wait(timeout=CONVERGE_S)

    async def after() -> None:
        bootstrap = processes.bootstrap
        await wait_until(
            lambda: writer_is(bootstrap, b), timeout_s=CONVERGE_S, what="broker-b writing"
        )
        # broker-a's confirmation of a term-1 change, arriving late at a name server that
        # granted term 2 (and holds term-1 tables still), is refused.
        late = counter_of(1, 1_000)
        with pytest.raises(WriterFenced, match="granted writer term 2"):
            await forged_push(ns[0], "broker-a", late, users=("mallory",), writer_term=1)
        async with tidemq.aio.Admin(bootstrap, client_config=login()) as admin:
            await admin.create_user("erin", "erin-password-long")  # on broker-b, term 2
        assert await users(b) == {ADMIN, "bob", "dave", "erin"}
        await all_on_term(bootstrap, 2)
        for server in ns:
            assert await _holds(server, "dave")
            assert await _holds(server, "erin")
            with pytest.raises(WriterFenced, match="writer term 1"):
                await forged_push(server, "broker-a", late, users=("mallory",), writer_term=1)

    loop.run(after(), timeout_s=PHASE_TIMEOUT_S)


def test_a_writer_killed_after_its_pushes_leaves_the_change_to_the_name_servers(
    loop: Loop, tmp_path: Path, env: None, stack: contextlib.ExitStack
) -> None:
    processes = Processes(tmp_path, stack, name_servers=3, ttl_ms=SLOW_TTL_MS)
    processes.start("broker-a")
    b = processes.start("broker-b")
    ns = [p.address for p in processes.nameservers]
    stopped = [processes.nameservers[1].pid, processes.nameservers[2].pid]
    to_a = loop.run(_started(processes))

    _signal(stopped, signal.SIGSTOP)
    try:

        async def pushed() -> None:
            late = send_now(to_a, _user("dave"))
            # Confirmed by the running name server: the pushes to the stopped two were
            # written in the same turn and wait in their sockets.
            await wait_until(lambda: _holds(ns[0], "dave"), timeout_s=CONVERGE_S, what="dave")
            processes.brokers["broker-a"].proc.kill()  # before a majority answered
            with pytest.raises((TidemqError, OSError)):  # never answered: the outcome is open
                decode_response(await late, Empty)
            to_a.close()

        loop.run(pushed(), timeout_s=PHASE_TIMEOUT_S)
    finally:
        _signal(stopped, signal.SIGCONT)

    async def after() -> None:
        bootstrap = processes.bootstrap
        await wait_until(
            lambda: writer_is(bootstrap, b), timeout_s=CONVERGE_S, what="broker-b writing"
        )
        async with tidemq.aio.Admin(bootstrap, client_config=login()) as admin:
            await admin.create_user("erin", "erin-password-long")
        assert await users(b) == {ADMIN, "bob", "dave", "erin"}
        for server in ns:
            await wait_until(_holds_erin(server), timeout_s=CONVERGE_S, what="erin")
            assert await _holds(server, "dave")

    loop.run(after(), timeout_s=PHASE_TIMEOUT_S)


def _holds_erin(server: str) -> Callable[[], Awaitable[bool]]:
    return lambda: _holds(server, "erin")
