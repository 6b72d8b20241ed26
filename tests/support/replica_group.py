"""A replica group of in-process members for tests (docs/design/replication.md): a
standalone name server, and members (`ReplicaNode`, or `ReplicaHttpNode` with its HTTP
listener) on one event loop, each with its own data directory and free ports of
127.0.0.1, electing their leader on a real etcd (`tests/support/etcd_server.py`).

Everything started is stopped when `group(...)` exits, pass or fail.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.integration.conftest import (
    CLUSTER_HEARTBEAT_MS,
    CLUSTER_TTL_MS,
    broker_config,
    wait_until,
)
from tests.support.etcd_server import EtcdCluster

from tidemq.broker.config import BrokerConfig
from tidemq.broker.replica_node import ReplicaNode
from tidemq.broker.replication_config import ReplicationConfig
from tidemq.cli.replica_http import ReplicaHttpNode
from tidemq.client.admin import AsyncAdmin
from tidemq.cluster.service import NameServerService
from tidemq.http.config import HttpConfig
from tidemq.testing.replication import ReplicaFaultSwitch

__all__ = ["GROUP", "Group", "free_port", "group", "member_config"]

GROUP = "g1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def member_config(
    data_dir: Path,
    name: str,
    etcd: list[str],
    bootstrap: str,
    broker: dict[str, object],
    *,
    port: int = 0,
    replication: dict[str, object] | None = None,
) -> BrokerConfig:
    """A member's config: `broker` more BrokerConfig settings, `replication` more (or
    other) ReplicationConfig settings than the tests' defaults; a free port unless given."""
    settings: dict[str, object] = {
        "group": GROUP,
        "etcd": tuple(etcd),
        "min_insync_replicas": 2,
        "replica_lag_max_ms": 1_500,
        "fetch_wait_ms": 200,
        "ack_timeout_ms": 5_000,
    } | (replication or {})
    return broker_config(
        data_dir,
        broker_name=name,
        port=port or free_port(),
        name_servers=(bootstrap,),
        broker_heartbeat_interval_ms=CLUSTER_HEARTBEAT_MS,
        broker_ttl_ms=CLUSTER_TTL_MS,
        replication=ReplicationConfig(**settings),  # type: ignore[arg-type]
        **broker,
    )


class Group:
    def __init__(
        self,
        root: Path,
        etcd: list[str],
        nameserver: NameServerService,
        bootstrap: str,
        secret: str | None = None,
    ) -> None:
        self.root, self.etcd, self.bootstrap = root, etcd, bootstrap
        self.nameserver = nameserver
        self.secret = secret
        #: More BrokerConfig settings for every member started from now on.
        self.broker: dict[str, object] = {}
        #: The password of the bootstrap user (broker.bootstrap_user) of every member.
        self.bootstrap_password: str | None = None
        self.nodes: dict[str, ReplicaNode] = {}
        #: The members started with an HTTP listener (their nodes are in `nodes` too).
        self.http_nodes: dict[str, ReplicaHttpNode] = {}

    def config(
        self, name: str, faults: ReplicaFaultSwitch | None = None, **replication: object
    ) -> ReplicaNode:
        cfg = self._broker_config(name, **replication)
        return ReplicaNode(
            cfg,
            faults=faults,
            cluster_secret=self.secret,
            bootstrap_password=self.bootstrap_password,
        )

    def _broker_config(self, name: str, **replication: object) -> BrokerConfig:
        return member_config(
            self.root / name, name, self.etcd, self.bootstrap, self.broker, replication=replication
        )

    async def start(
        self, name: str, faults: ReplicaFaultSwitch | None = None, **replication: object
    ) -> ReplicaNode:
        node = self.config(name, faults, **replication)
        await node.start()
        self.nodes[name] = node
        return node

    async def start_http(
        self,
        name: str,
        faults: ReplicaFaultSwitch | None = None,
        *,
        registry_login: tuple[str, str] | None = None,
        **replication: object,
    ) -> ReplicaHttpNode:
        """A member with its HTTP listener on a free port (`listener.address`)."""
        member = ReplicaHttpNode(
            self._broker_config(name, **replication),
            HttpConfig(port=0),
            cluster_secret=self.secret,
            bootstrap_password=self.bootstrap_password,
            registry_login=registry_login,
            faults=faults,
        )
        self.http_nodes[name] = member
        self.nodes[name] = member.node
        await member.start()
        return member

    async def stop(self, name: str) -> None:
        member = self.http_nodes.pop(name, None)
        node = self.nodes.pop(name)
        await (member.stop() if member is not None else node.stop())

    async def start_three(
        self, topic: str, queues: int, config: dict[str, str] | None = None
    ) -> ReplicaNode:
        """Start members m0, m1 and m2, wait for a leader, create `topic`; the leader."""
        for name in ("m0", "m1", "m2"):
            await self.start(name)
        first = await self.wait_leader()
        async with AsyncAdmin(self.bootstrap) as admin:
            await admin.create_topic(topic, queues, config=config)
        return first

    def leader(self) -> ReplicaNode | None:
        leading = [n for n in self.nodes.values() if n.broker is not None]
        assert len(leading) <= 1, "two members run the group's broker at once"
        return leading[0] if leading else None

    async def wait_leader(self, *, not_: ReplicaNode | None = None) -> ReplicaNode:
        await wait_until(
            lambda: (n := self.leader()) is not None and n is not not_, what="a leader"
        )
        node = self.leader()
        assert node is not None
        return node


async def wait_all_in_sync(node: ReplicaNode) -> None:
    """Until `node` leads with m0, m1 and m2 in its in-sync set (each follower joins once
    caught up; one slowed by a loaded machine may have left it for a while)."""
    await wait_until(
        lambda: node.leader is not None and node.leader.in_sync == ("m0", "m1", "m2"),
        what="all three in sync",
    )


@asynccontextmanager
async def group(
    root: Path, etcd: EtcdCluster, secret: str | None = None, *, auth_enabled: bool = False
) -> AsyncIterator[Group]:
    """A name server (with logins when `auth_enabled`: it then needs `secret`) and no
    member yet."""
    ns = NameServerService(
        port=0,
        broker_ttl_ms=CLUSTER_TTL_MS,
        heartbeat_interval_ms=CLUSTER_HEARTBEAT_MS,
        cluster_secret=secret,
        auth_enabled=auth_enabled,
    )
    g = Group(root, etcd.endpoints, ns, await ns.start(), secret)
    try:
        yield g
    finally:
        for name in list(g.nodes):
            await g.stop(name)
        await ns.stop()
