"""Every replica group member serves its HTTP listener in either role
(`tidemq.cli.replica_http`): `/metrics` with the member's replication figures (a leader's
beside its broker's series, a follower's alone), the schema registry through the
cluster, and, with logins on, passwords checked by the broker when leading and by the
group's leader when following (503, never unchecked, when there is no leader to ask).

Members run in this process on one event loop with a real etcd (`tests/support/
replica_group.py`); HTTP requests go over real sockets from a thread (`asyncio.to_thread`),
since the members serve on the test's loop.
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.integration.conftest import wait_until
from tests.support.etcd_server import EtcdCluster, etcd_single
from tests.support.replica_group import GROUP, Group, group

import tidemq
from tidemq.cli.replica_http import ReplicaHttpNode
from tidemq.client.admin import AsyncAdmin
from tidemq.client.cluster import ClientConfig
from tidemq.client.producer import AsyncProducer
from tidemq.core.errors import InvalidRequest, SchemaValidationFailed
from tidemq.schema.wire import frame
from tidemq.testing.replication import ReplicaFaultSwitch

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

__all__ = ["etcd_single"]  # a fixture, used by name below

pytestmark = pytest.mark.timeout(180)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

SECRET = "a-cluster-secret-of-some-length"
ADMIN, PASSWORD = "admin", "admin-password-long"
POINT = {"type": "record", "name": "Point", "fields": [{"name": "x", "type": "long"}]}
POINT3 = {
    "type": "record",
    "name": "Point",
    "fields": [{"name": "x", "type": "long"}, {"name": "y", "type": "long", "default": 0}],
}


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def _get(member: ReplicaHttpNode, path: str, auth: str | None = None) -> tuple[int, str]:
    """(status, body) of GET `path` on the member's HTTP listener."""
    listener = member.listener
    assert listener is not None
    request = urllib.request.Request(f"http://{listener.address}{path}")
    if auth is not None:
        request.add_header("Authorization", auth)

    def call() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return int(answer.status), answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    return await asyncio.to_thread(call)


async def _scrape(member: ReplicaHttpNode, auth: str | None = None) -> Samples:
    status, text = await _get(member, "/metrics", auth)
    assert status == 200, text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _role(m: Samples, member: str) -> str:
    """The role whose `tidemq_replica_role` sample is 1 (exactly one is)."""
    roles = [
        dict(labels)["role"]
        for (name, labels), value in m.items()
        if name == "tidemq_replica_role" and value == 1
    ]
    assert len(roles) == 1, roles
    assert (("group", GROUP), ("member", member), ("role", roles[0])) in {
        labels for name, labels in m if name == "tidemq_replica_role"
    }
    return roles[0]


def _registry(
    member: ReplicaHttpNode, login: tuple[str, str] | None = None
) -> tidemq.SchemaRegistry:
    listener = member.listener
    assert listener is not None
    user, password = login if login is not None else (None, None)
    return tidemq.SchemaRegistry(f"http://{listener.address}", username=user, password=password)


async def _send(bootstrap: str, n: int, prefix: bytes) -> None:
    producer = AsyncProducer(bootstrap)
    try:
        await asyncio.gather(
            *(producer.send("t", b"%s%d" % (prefix, i), queue=i % 2) for i in range(n))
        )
    finally:
        await producer.close()


def _leader_figures(m: Samples, epoch: int, in_sync: int) -> None:
    assert m[("tidemq_replica_epoch", ())] == epoch
    assert m[("tidemq_replica_committed_bytes", ())] > 0
    assert m[("tidemq_replica_log_end_bytes", ())] >= m[("tidemq_replica_committed_bytes", ())]
    assert m[("tidemq_replica_lag_bytes", ())] == 0
    assert m[("tidemq_replica_in_sync_members", ())] == in_sync
    assert m[("tidemq_replica_min_insync_replicas", ())] == 2
    assert ("rocketmq_topic_number", ()) in m  # the broker's own series are there too
    assert ("tidemq_replica_fetch_rounds_total", ()) not in m


def _follower_figures(m: Samples, epoch: int) -> None:
    assert m[("tidemq_replica_epoch", ())] == epoch
    assert m[("tidemq_replica_committed_bytes", ())] > 0
    assert m[("tidemq_replica_lag_bytes", ())] >= 0
    assert m[("tidemq_replica_fetch_rounds_total", ())] > 0
    assert m[("tidemq_replica_fetch_age_seconds", ())] >= 0
    assert m[("tidemq_commit_log_bytes", ())] > 0
    # No broker runs on a follower: none of a broker's series, not even as zeros.
    assert not any(name.startswith("rocketmq_") for name, _ in m)
    assert ("tidemq_replica_in_sync_members", ()) not in m


async def _wait_following(g: Group, name: str, leader_epoch: int, committed: int = 1) -> None:
    """Until `name` follows the leader of `leader_epoch`, which has answered it and told
    it a committed position of at least `committed`."""
    node = g.nodes[name]

    def following() -> bool:
        leader, follower = node.leader_record(), node.follower
        return (
            node.broker is None
            and leader is not None
            and leader.epoch == leader_epoch
            and follower is not None
            and follower.rounds > 0
            and follower.committed >= committed
        )

    await wait_until(following, what=f"{name} to follow the leader of epoch {leader_epoch}")


def test_every_member_serves_metrics_with_its_role_and_a_failover_swaps_the_figures(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    async def run() -> None:
        async with group(tmp_path, etcd_single) as g:
            members = {name: await g.start_http(name) for name in ("m0", "m1", "m2")}
            first = await g.wait_leader()
            async with AsyncAdmin(g.bootstrap) as admin:
                await admin.create_topic("t", 2)
            await _send(g.bootstrap, 40, b"a")
            followers = [n for n in members if n != first.member]
            for name in followers:
                await _wait_following(g, name, 1)
            for name, member in members.items():
                m = await _scrape(member)
                if name == first.member:
                    assert _role(m, name) == "leader"
                    _leader_figures(m, epoch=1, in_sync=3)
                    lag = {
                        dict(labels)["follower"]
                        for n, labels in m
                        if n == "tidemq_replica_follower_lag_bytes"
                    }
                    assert lag == set(followers)
                else:
                    assert _role(m, name) == "follower"
                    _follower_figures(m, epoch=1)

            await g.stop(first.member)  # resigns: another in-sync member takes over
            second = await g.wait_leader(not_=first)
            await _send(g.bootstrap, 20, b"b")
            # The old leader, started again on its data, rejoins as a follower.
            again = await g.start_http(first.member)
            await _wait_following(g, first.member, 2)
            leader = second.leader
            assert leader is not None
            await wait_until(lambda: first.member in leader.in_sync, what="the old leader in sync")
            m = await _scrape(members[second.member])
            assert _role(m, second.member) == "leader"
            _leader_figures(m, epoch=2, in_sync=3)
            m = await _scrape(again)
            assert _role(m, first.member) == "follower"
            _follower_figures(m, epoch=2)
            assert m[("tidemq_replica_log_end_bytes", ())] > 0

    loop.run(run(), timeout_s=150)


def test_the_registry_serves_through_followers_and_leaders_alike(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    """A schema registered through a follower's HTTP port and through the leader's gets
    one id; the schema check is installed on each broker the members start, so after a
    failover the new leader's broker validates sends too."""

    async def run() -> None:
        async with group(tmp_path, etcd_single) as g:
            members = {name: await g.start_http(name) for name in ("m0", "m1", "m2")}
            first = await g.wait_leader()
            other = next(n for n in members if n != first.member)
            at_leader, at_follower = _registry(members[first.member]), _registry(members[other])
            point = await asyncio.to_thread(at_follower.register, "points-value", POINT)
            assert await asyncio.to_thread(at_leader.register, "points-value", POINT) == point
            point3 = await asyncio.to_thread(at_leader.register, "points-value", POINT3)
            assert point3 != point
            found = await asyncio.to_thread(at_follower.version_info, "points-value")
            assert found[:2] == (point3, POINT3)

            async with AsyncAdmin(g.bootstrap) as admin:
                await admin.create_topic("points", 1, config={"schema.validation": "true"})
            producer = AsyncProducer(g.bootstrap)
            try:
                await producer.send("points", frame(point, b"\x02"))
                with pytest.raises(SchemaValidationFailed, match="schema id 77"):
                    await producer.send("points", frame(77, b"\x02"))
                await g.stop(first.member)
                await g.wait_leader(not_=first)  # a new broker, with the check installed
                await producer.send("points", frame(point3, b"\x02\x04"))
                with pytest.raises(SchemaValidationFailed, match="schema id 78"):
                    await producer.send("points", frame(78, b"\x02"))
            finally:
                await producer.close()

    loop.run(run(), timeout_s=150)


def test_with_logins_members_check_passwords_in_either_role(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    """A wrong password is refused (401) on the leader and on a follower, whose check goes
    to the leader; the right one is taken on both, and the registry works through the
    follower with it."""
    good, wrong = _basic(ADMIN, PASSWORD), _basic(ADMIN, "not-the-password")

    async def run() -> None:
        async with group(tmp_path, etcd_single, SECRET, auth_enabled=True) as g:
            g.broker = {"auth_enabled": True, "bootstrap_user": ADMIN}
            g.bootstrap_password = PASSWORD
            members = {
                name: await g.start_http(name, registry_login=(ADMIN, PASSWORD))
                for name in ("m0", "m1")
            }
            first = await g.wait_leader()
            other = next(n for n in members if n != first.member)
            # The name server logs the registry's client in once the leader pushed its users.
            await wait_until(lambda: g.nameserver.security.snapshot is not None, what="users")
            await _wait_following(g, other, 1, committed=0)
            for name in (first.member, other):
                member = members[name]
                assert (await _get(member, "/metrics"))[0] == 401
                status, body = await _get(member, "/metrics", wrong)
                assert status == 401, body
                assert "wrong user name or password" in body
                m = await _scrape(member, good)
                assert _role(m, name) == ("leader" if name == first.member else "follower")
            login = (ADMIN, PASSWORD)
            at_follower = _registry(members[other], login)
            point = await asyncio.to_thread(at_follower.register, "points-value", POINT)
            at_leader = _registry(members[first.member], login)
            assert await asyncio.to_thread(at_leader.register, "points-value", POINT) == point
            bad = _registry(members[other], (ADMIN, "not-the-password"))
            with pytest.raises(InvalidRequest, match="401"):
                await asyncio.to_thread(bad.register, "points-value", POINT)
            # A user created through the cluster logs in at the follower too (its own
            # store never got the user: the leader checked it).
            config = ClientConfig(username=ADMIN, password=PASSWORD)
            async with AsyncAdmin(g.bootstrap, client_config=config) as admin:
                await admin.create_user("viewer", "viewer-password-1")
            m = await _scrape(members[other], _basic("viewer", "viewer-password-1"))
            assert _role(m, other) == "follower"

    loop.run(run(), timeout_s=150)


def test_a_member_with_no_leader_to_ask_refuses_logins_with_503(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    """A follower cannot check a password itself; with no leader to ask, every request
    with credentials, right or wrong, gets 503 with the reason, never served unchecked.
    Without logins, its `/metrics` answers all the same."""

    async def run() -> None:
        async with group(tmp_path, etcd_single, SECRET, auth_enabled=True) as g:
            g.broker = {"auth_enabled": True, "bootstrap_user": ADMIN}
            g.bootstrap_password = PASSWORD
            faults = ReplicaFaultSwitch()
            faults.hold_campaigns()  # alone and never campaigning: no leader
            member = await g.start_http("m0", faults, registry_login=(ADMIN, PASSWORD))
            for auth in (_basic(ADMIN, PASSWORD), _basic(ADMIN, "wrong")):
                status, body = await _get(member, "/metrics", auth)
                assert status == 503, body
                assert "knows no leader" in json.loads(body)["message"]
            assert (await _get(member, "/metrics"))[0] == 401

        async with group(tmp_path / "open", etcd_single) as g:
            faults = ReplicaFaultSwitch()
            faults.hold_campaigns()
            member = await g.start_http("m0", faults)
            m = await _scrape(member)
            assert _role(m, "m0") == "follower"
            assert m[("tidemq_replica_epoch", ())] == 0
            assert ("tidemq_replica_lag_bytes", ()) not in m  # no leader ever answered
            assert ("tidemq_replica_fetch_age_seconds", ()) not in m

    loop.run(run(), timeout_s=90)
