"""Logins in a replica group across a failover: a producer id stays its user's (issue 16's
binding, issue 23's failover). The binding is a record of a compact internal topic, so
the next leader has it: another user's PRODUCE with the id is refused there, and its
owner goes on with its sequence. (Bindings kept only on the leader's disk left the next
leader to bind the id to whichever user produced with it first.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.integration.conftest import wait_until
from tests.support.etcd_server import EtcdCluster, etcd_single
from tests.support.replica_group import group, wait_all_in_sync

from tidemq.client.admin import AsyncAdmin
from tidemq.client.cluster import ClientConfig
from tidemq.core.batch import encode_values
from tidemq.core.errors import FencedProducer, TidemqError
from tidemq.net.client import ClientConnection
from tidemq.protocol.commands import (
    InitProducerRequest,
    InitProducerResponse,
    ProduceRequest,
    ProduceResponse,
)

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

__all__ = ["etcd_single"]  # a fixture, used by name below

pytestmark = pytest.mark.timeout(120)

SECRET = "a-cluster-secret-of-some-length"
ADMIN, PASSWORD = "admin", "admin-password-long"
_FRAME = 8 << 20
#: Bound on one request of the test.
_REQUEST_S = 10.0


def _produce(pid: int, seq: int) -> ProduceRequest:
    return ProduceRequest(topic="owned", queue=0, producer_id=pid, epoch=0, base_sequence=seq)


def _batch() -> bytes:
    return encode_values([b"v"], timestamp_ms=int(time.time() * 1000))


async def _login(address: str, user: str) -> ClientConnection:
    """A connection logged in as `user`, once the member knows the user (users reach a
    new leader through the name servers)."""
    connections: list[ClientConnection] = []

    async def logged_in() -> bool:
        try:
            connections.append(
                await ClientConnection.open(
                    address, max_frame_bytes=_FRAME, username=user, password=f"{user}-password"
                )
            )
        except TidemqError:
            return False
        return True

    await wait_until(logged_in, what=f"{user} logged in at {address}")
    return connections[-1]


def test_a_producer_id_stays_its_users_after_a_failover(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    async def run() -> None:
        async with group(tmp_path, etcd_single, SECRET, auth_enabled=True) as g:
            g.broker = {"auth_enabled": True, "bootstrap_user": ADMIN}
            g.bootstrap_password = PASSWORD
            for name in ("m0", "m1", "m2"):
                await g.start(name)
            first = await g.wait_leader()
            await wait_all_in_sync(first)
            # The name server takes logins once the leader pushed its users to it.
            await wait_until(lambda: g.nameserver.security.snapshot is not None, what="users")
            login = ClientConfig(username=ADMIN, password=PASSWORD)
            async with AsyncAdmin(g.bootstrap, client_config=login) as admin:
                await admin.create_topic("owned", 1)
                for user in ("alice", "mallory"):
                    await admin.create_user(user, f"{user}-password")
            assert first.broker is not None
            alice = await _login(first.broker.address, "alice")
            try:
                issued, _ = await alice.request(
                    InitProducerRequest(), InitProducerResponse, timeout_s=_REQUEST_S
                )
                pid = issued.producer_id
                await alice.request(_produce(pid, 0), ProduceResponse, _batch(),
                                    timeout_s=_REQUEST_S)  # fmt: skip
            finally:
                alice.close()
            await g.stop(first.member)
            leader = await g.wait_leader(not_=first)
            assert leader.broker is not None
            mallory = await _login(leader.broker.address, "mallory")
            alice = await _login(leader.broker.address, "alice")
            try:
                with pytest.raises(FencedProducer, match=f"producer id {pid} was issued"):
                    await mallory.request(
                        _produce(pid, 1), ProduceResponse, _batch(), timeout_s=_REQUEST_S
                    )
                stored, _ = await alice.request(
                    _produce(pid, 1), ProduceResponse, _batch(), timeout_s=_REQUEST_S
                )
                assert (stored.base_offset, stored.duplicate) == (1, False)
            finally:
                alice.close()
                mallory.close()

    loop.run(run(), timeout_s=110)
