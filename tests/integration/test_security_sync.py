"""Users and ACL entries are the cluster's (issue 16, ADR 15): changed on one writer,
they reach every broker through the name servers, brokers that join later or were down
during a change included, deletions and password changes as well as additions; and a
standalone name server with logins on takes SCRAM logins as the cluster's users.

Real brokers and a real name server in this process, over 127.0.0.1, with the cluster
secret; every wait is bounded (`wait_until`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.integration.conftest import (
    CLUSTER_HEARTBEAT_MS,
    CLUSTER_TTL_MS,
    broker_config,
    wait_until,
)

import tidemq
import tidemq.aio
from tidemq.broker.broker import Broker
from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.cluster.group_coordinator import weight
from tidemq.cluster.membership import check_secret
from tidemq.cluster.security_link import cluster_login
from tidemq.cluster.service import NameServerService
from tidemq.core.clock import SystemClock
from tidemq.core.errors import (
    AuthenticationFailed,
    AuthorizationFailed,
    BrokerNotAvailable,
    ConfigError,
    TidemqError,
)
from tidemq.net.client import ClientConnection
from tidemq.protocol.acl_messages import AclListRequest, AclListResponse
from tidemq.protocol.commands import (
    DescribeTopicRequest,
    FetchOffsetsRequest,
    FetchOffsetsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    TopicInfoMsg,
    UserListRequest,
    UserListResponse,
)
from tidemq.protocol.security_messages import TERM_SHIFT

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

pytestmark = pytest.mark.timeout(120)

SECRET = "a-cluster-secret-of-some-length"
ADMIN = "admin"
ADMIN_PASSWORD = "admin-password-long"
#: How long a change may take to reach every broker: a few 200 ms heartbeats, with slack
#: for a loaded two-core machine.
CONVERGE_S = 15.0
#: One consumer poll's long-poll wait.
POLL_MS = 200
#: A counter's change number within its writer term (security_messages.counter_of).
_SEQ_BITS = (1 << TERM_SHIFT) - 1


def _admin_login() -> ClientConfig:
    return ClientConfig(
        username=ADMIN, password=ADMIN_PASSWORD, connect_timeout_ms=5_000, request_timeout_ms=5_000
    )


@dataclass
class SecureCluster:
    """A name server with logins on and brokers with logins and ACLs, all with the
    cluster secret; brokers may be stopped and started again on their data."""

    loop: Loop
    tmp_path: Path
    nameserver: NameServerService
    bootstrap: str = ""
    brokers: dict[str, Broker] = field(default_factory=dict)

    def start(self, name: str) -> str:
        config = broker_config(
            self.tmp_path / name,
            broker_name=name,
            name_servers=(self.bootstrap,),
            broker_heartbeat_interval_ms=CLUSTER_HEARTBEAT_MS,
            broker_ttl_ms=CLUSTER_TTL_MS,
            auth_enabled=True,
            authorization_enabled=True,
            bootstrap_user=ADMIN,
        )
        broker = Broker(config, bootstrap_password=ADMIN_PASSWORD, cluster_secret=SECRET)
        self.brokers[name] = broker
        return self.loop.run(broker.start())

    def stop(self, name: str) -> None:
        self.loop.run(self.brokers.pop(name).stop())

    def address(self, name: str) -> str:
        return self.brokers[name].address


@pytest.fixture
def secure(loop: Loop, tmp_path: Path) -> Iterator[SecureCluster]:
    ns = NameServerService(
        port=0,
        broker_ttl_ms=CLUSTER_TTL_MS,
        heartbeat_interval_ms=CLUSTER_HEARTBEAT_MS,
        cluster_secret=SECRET,
        auth_enabled=True,
    )
    env = SecureCluster(loop, tmp_path, ns)
    env.bootstrap = loop.run(ns.start())
    try:
        yield env
    finally:
        for broker in reversed(list(env.brokers.values())):
            if hasattr(broker, "_server"):
                loop.run(broker.stop())
        loop.run(ns.stop())


async def _versions(bootstrap: str) -> dict[str, tuple[int, str]]:
    """Each live broker's users-and-ACLs version, as the name server reports it."""
    async with tidemq.aio.Admin(bootstrap, client_config=_admin_login()) as admin:
        return {
            b.name: (b.security_counter, b.security_digest) for b in await admin.cluster_status()
        }


async def _converged(bootstrap: str, names: set[str], *, at_least: int = 1) -> None:
    """Wait (bounded) until every broker in `names` reports one and the same version, at
    least `at_least` changes into the newest writer term."""

    async def same_version() -> bool:
        seen = await _versions(bootstrap)
        versions = {seen.get(n) for n in names}
        if len(versions) != 1 or None in versions:
            return False
        counter = seen[min(names)][0]
        return counter >= 1 and counter & _SEQ_BITS >= at_least

    await wait_until(
        same_version, timeout_s=CONVERGE_S, what=f"users and ACLs converging on {sorted(names)}"
    )


async def _admin_known(secure: SecureCluster) -> None:
    """Wait (bounded) until the name server has learnt the bootstrap user from a broker
    (before that it answers logins "retry")."""
    await wait_until(
        lambda: secure.nameserver.security.credentials(ADMIN) is not None,
        what="the name server learning the bootstrap user",
    )


async def _login(address: str, user: str, password: str) -> ClientConnection:
    return await ClientConnection.open(
        address, max_frame_bytes=1 << 20, username=user, password=password
    )


async def _may_describe(address: str, user: str, password: str, topic: str) -> bool:
    """Whether `user` may describe `topic` on the broker at `address` (a refusal is
    AuthorizationFailed; anything else, such as TopicNotFound, means it was allowed)."""
    conn = await _login(address, user, password)
    try:
        await conn.request(DescribeTopicRequest(name=topic), TopicInfoMsg, timeout_s=10)
    except AuthorizationFailed:
        return False
    except TidemqError:
        return True
    finally:
        conn.close()
    return True


async def _tables(address: str) -> tuple[set[str], set[tuple[str, ...]]]:
    """The users and ACL entries of the broker at `address`, asked of it directly."""
    conn = await _login(address, ADMIN, ADMIN_PASSWORD)
    try:
        users, _ = await conn.request(UserListRequest(), UserListResponse, timeout_s=10)
        acls, _ = await conn.request(AclListRequest(), AclListResponse, timeout_s=10)
    finally:
        conn.close()
    return {u.name for u in users.users}, {
        (e.principal, e.resource_type, e.resource_name, e.operation) for e in acls.entries
    }


def _describe(principal: str, topic: str) -> tidemq.Acl:
    return tidemq.Acl(
        principal=principal, resource_type="topic", resource_name=topic, operation="describe"
    )


def test_a_broker_started_later_gets_the_users_and_enforces_the_acls(
    loop: Loop, secure: SecureCluster
) -> None:
    secure.start("broker-a")

    async def change() -> None:
        await _admin_known(secure)
        async with tidemq.aio.Admin(secure.bootstrap, client_config=_admin_login()) as admin:
            await admin.create_user("bob", "bob-password-long")
            await admin.create_acls([_describe("User:bob", "orders")])

    loop.run(change())
    late = secure.start("broker-b")

    async def check() -> None:
        await _converged(secure.bootstrap, {"broker-a", "broker-b"})
        conn = await _login(late, "bob", "bob-password-long")  # a user made before it started
        conn.close()
        assert await _may_describe(late, "bob", "bob-password-long", "orders")
        assert not await _may_describe(late, "bob", "bob-password-long", "payroll")

    loop.run(check())


def test_a_broker_down_during_changes_refuses_old_credentials_when_back(
    loop: Loop, secure: SecureCluster
) -> None:
    secure.start("broker-a")  # the oldest: the writer
    secure.start("broker-b")

    async def prepare() -> None:
        await _admin_known(secure)
        async with tidemq.aio.Admin(secure.bootstrap, client_config=_admin_login()) as admin:
            await admin.create_user("bob", "bob-old-password")
            await admin.create_user("carol", "carol-password-long")
            await admin.create_acls([_describe("User:bob", "orders")])
        await _converged(secure.bootstrap, {"broker-a", "broker-b"}, at_least=3)
        b = secure.address("broker-b")
        assert await _may_describe(b, "bob", "bob-old-password", "orders")

    loop.run(prepare())
    secure.stop("broker-b")

    async def change_while_down() -> None:
        async with tidemq.aio.Admin(secure.bootstrap, client_config=_admin_login()) as admin:
            await admin.delete_user("carol")
            await admin.create_user("bob", "bob-new-password")  # a password change
            await admin.delete_acls([_describe("User:bob", "orders")])

    loop.run(change_while_down())
    back = secure.start("broker-b")

    async def check() -> None:
        await _converged(secure.bootstrap, {"broker-a", "broker-b"}, at_least=6)
        with pytest.raises(AuthenticationFailed):
            await _login(back, "carol", "carol-password-long")
        with pytest.raises(AuthenticationFailed):
            await _login(back, "bob", "bob-old-password")
        assert not await _may_describe(back, "bob", "bob-new-password", "orders")

    loop.run(check())


def test_concurrent_changes_from_two_admins_converge_on_every_broker(
    loop: Loop, secure: SecureCluster
) -> None:
    names = {"broker-a", "broker-b", "broker-c"}
    for name in sorted(names):
        secure.start(name)

    async def run() -> None:
        await _admin_known(secure)

        async def admin_changes(prefix: str) -> None:
            async with tidemq.aio.Admin(secure.bootstrap, client_config=_admin_login()) as admin:
                for i in range(4):
                    await admin.create_user(f"{prefix}{i}", "a-long-enough-password")
                    await admin.create_acls([_describe(f"User:{prefix}{i}", f"{prefix}-t")])
                await admin.delete_user(f"{prefix}0")

        await asyncio.gather(admin_changes("u"), admin_changes("v"))
        await _converged(secure.bootstrap, names, at_least=18)
        tables = [await _tables(secure.address(n)) for n in sorted(names)]
        assert all(t == tables[0] for t in tables), tables
        users, acls = tables[0]
        assert users == {ADMIN, "u1", "u2", "u3", "v1", "v2", "v3"}
        assert len(acls) == 8

    loop.run(run())


def test_a_standalone_name_server_logs_clients_in_as_cluster_users(
    loop: Loop, secure: SecureCluster
) -> None:
    secure.start("broker-a")

    async def run() -> None:
        await _admin_known(secure)
        async with tidemq.aio.Admin(secure.bootstrap, client_config=_admin_login()) as admin:
            await admin.create_topic("orders", 2)
        client = ClusterClient(secure.bootstrap, _admin_login())
        try:
            routes = await client.refresh_routes(force=True)
            assert "orders" in routes
            assert routes.broker_for("orders", 0) == secure.address("broker-a")
        finally:
            await client.close()
        with pytest.raises(AuthenticationFailed, match="unknown user or wrong password"):
            await _login(secure.bootstrap, ADMIN, "not-the-password")
        anonymous = ClusterClient(secure.bootstrap, ClientConfig(retries=0))
        try:
            with pytest.raises(AuthenticationFailed, match="authenticate first"):
                await anonymous.refresh_routes(force=True)
        finally:
            await anonymous.close()

    loop.run(run())


def test_a_name_server_that_has_not_learned_the_users_asks_logins_to_retry(
    loop: Loop, secure: SecureCluster
) -> None:
    """A name server keeps nothing on disk: from its start until a broker's registration
    brings the users, a login is answered "retry" (BrokerNotAvailable, which clients
    retry), not "unknown user or wrong password" (which they do not); then it works."""

    async def before() -> None:
        with pytest.raises(BrokerNotAvailable, match="cannot check logins yet"):
            await _login(secure.bootstrap, ADMIN, ADMIN_PASSWORD)

    loop.run(before())
    secure.start("broker-a")

    async def after() -> None:
        client = ClusterClient(secure.bootstrap, _admin_login())  # retries meanwhile
        try:
            await client.refresh_routes(force=True)
        finally:
            await client.close()
        conn = await _login(secure.bootstrap, ADMIN, ADMIN_PASSWORD)
        conn.close()

    loop.run(after())


def _group_ranked(ranking: list[str]) -> str:
    """A group name whose brokers by rendezvous weight, highest first, are `ranking`."""
    for i in range(10_000):
        group = f"moved-{i}"
        if sorted(ranking, key=lambda n: weight(n, group), reverse=True) == ranking:
            return group
    raise AssertionError(f"no group name ranks {ranking}")


async def _read_new(bootstrap: str, group: str, count: int) -> list[bytes]:
    """A new member of `group` reads `count` messages (bounded) and commits them."""
    consumer = tidemq.aio.GroupConsumer(
        bootstrap, group, ["orders"], start="earliest", client_config=_admin_login()
    )
    got: list[bytes] = []

    async def read_all() -> bool:
        got.extend(m.value or b"" for m in await consumer.poll(POLL_MS))
        return len(got) >= count

    try:
        await wait_until(read_all, timeout_s=CONVERGE_S, what=f"{count} messages of {group}")
        # One more long poll: anything beyond `count` shows in the caller's comparison.
        got.extend(m.value or b"" for m in await consumer.poll(POLL_MS))
        await consumer.commit()
    finally:
        await consumer.close()
    return sorted(got)


def test_brokers_log_in_to_each_other_to_pull_a_moved_groups_offsets(
    loop: Loop, secure: SecureCluster
) -> None:
    """broker-c joins a cluster with logins and ACLs and takes a group (rendezvous
    hashing, ADR 17): it logs in to the other brokers with the cluster secret and pulls
    the group's offsets. A broker's login is good for that request alone."""
    group = _group_ranked(["broker-c", "broker-a", "broker-b"])
    secure.start("broker-a")
    secure.start("broker-b")

    async def first() -> None:
        await _admin_known(secure)
        async with tidemq.aio.Admin(secure.bootstrap, client_config=_admin_login()) as admin:
            await admin.create_topic("orders", 2)
        async with tidemq.aio.Producer(secure.bootstrap, client_config=_admin_login()) as p:
            for i in range(10):
                await p.send("orders", b"%02d" % i, queue=i % 2)
        assert await _read_new(secure.bootstrap, group, 10) == [b"%02d" % i for i in range(10)]

    loop.run(first())
    c = secure.start("broker-c")

    async def moved() -> None:
        await wait_until(lambda: len(secure.nameserver.nameserver.brokers()) == 3, what="broker-c")
        async with tidemq.aio.Producer(secure.bootstrap, client_config=_admin_login()) as p:
            for i in range(10, 20):
                await p.send("orders", b"%02d" % i, queue=i % 2)
        # Only the new messages: broker-c took the offsets committed on broker-a.
        assert await _read_new(secure.bootstrap, group, 10) == [b"%02d" % i for i in range(10, 20)]
        conn = await ClientConnection.open(c, max_frame_bytes=1 << 20)
        try:
            await cluster_login(conn, "broker-x", check_secret(SECRET), SystemClock(), 10)
            answer, _ = await conn.request(
                FetchOffsetsRequest(group=group, local_only=True),
                FetchOffsetsResponse,
                timeout_s=10,
            )
            assert sorted((o.queue, o.offset) for o in answer.offsets) == [(0, 10), (1, 10)]
            with pytest.raises(AuthorizationFailed, match="broker's login"):
                await conn.request(ListGroupsRequest(), ListGroupsResponse, timeout_s=10)
        finally:
            conn.close()

    loop.run(moved())


def test_a_name_server_with_logins_needs_the_cluster_secret() -> None:
    with pytest.raises(ConfigError, match="cluster secret"):
        NameServerService(port=0, auth_enabled=True)
