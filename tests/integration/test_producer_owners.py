"""Producer ids belong to the user they were issued to (issue 16), with authentication
on: another user's PRODUCE with that id is refused and does not disturb its sequence;
the owner goes on, also after a restart (owners are records of a compact internal topic;
after a failover too: `test_replication_security.py`); an id nobody knows (issued before
owners were stored) is bound to its first user."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest

import tidemq.aio
from tidemq.broker.broker import Broker
from tidemq.broker.producer_owners import ProducerOwners
from tidemq.client.cluster import ClientConfig
from tidemq.core.batch import encode_values
from tidemq.core.errors import FencedProducer
from tidemq.net.client import ClientConnection
from tidemq.protocol.commands import (
    InitProducerRequest,
    InitProducerResponse,
    ProduceRequest,
    ProduceResponse,
)

if TYPE_CHECKING:
    from tests.integration.conftest import Loop, StartBroker

pytestmark = pytest.mark.timeout(60)

ADMIN, ADMIN_PASSWORD = "admin", "admin-secret-1"
_FRAME = 8 << 20


def _batch() -> bytes:
    return encode_values([b"v"], timestamp_ms=int(time.time() * 1000))


def test_another_users_producer_id_is_refused(loop: Loop, start_broker: StartBroker) -> None:
    env = start_broker(auth_enabled=True, bootstrap_user=ADMIN, bootstrap_password=ADMIN_PASSWORD)

    async def go() -> None:
        admin_login = ClientConfig(username=ADMIN, password=ADMIN_PASSWORD)
        async with tidemq.aio.Admin(env.address, client_config=admin_login) as admin:
            await admin.create_topic("owned", 1)
            for user in ("alice", "mallory"):
                await admin.create_user(user, f"{user}-password")
        alice, mallory = [
            await ClientConnection.open(
                env.address, max_frame_bytes=_FRAME, username=u, password=f"{u}-password"
            )
            for u in ("alice", "mallory")
        ]
        try:
            issued, _ = await alice.request(
                InitProducerRequest(), InitProducerResponse, timeout_s=10
            )
            pid = issued.producer_id

            def produce(seq: int) -> ProduceRequest:
                return ProduceRequest(
                    topic="owned", queue=0, producer_id=pid, epoch=0, base_sequence=seq
                )

            with pytest.raises(FencedProducer, match=f"producer id {pid} was issued to another"):
                await mallory.request(produce(0), ProduceResponse, _batch(), timeout_s=10)
            stored, _ = await alice.request(produce(0), ProduceResponse, _batch(), timeout_s=10)
            assert (stored.base_offset, stored.duplicate) == (0, False)
            # An id issued before this broker process started (as if: allocated in the
            # store, never bound) is bound to its first user, then refused to others.
            earlier = await env.broker._gateway.call(lambda s: s.allocate_producer_id())
            unknown = ProduceRequest(
                topic="owned", queue=0, producer_id=earlier, epoch=0, base_sequence=0
            )
            await mallory.request(unknown, ProduceResponse, _batch(), timeout_s=10)
            with pytest.raises(FencedProducer):
                await alice.request(unknown, ProduceResponse, _batch(), timeout_s=10)
        finally:
            alice.close()
            mallory.close()

    loop.run(go(), timeout_s=40)


def test_owners_are_bounded() -> None:
    async def go() -> None:
        owners = ProducerOwners(max_owners=2)
        await owners.issued(1, "User:a")
        await owners.issued(2, "User:b")
        await owners.check(1, "User:a")  # 1 is now the most recently used
        await owners.issued(3, "User:c")  # forgets 2
        assert len(owners) == 2
        await owners.check(2, "User:x")  # forgotten: bound to its next user
        with pytest.raises(FencedProducer):
            await owners.check(2, "User:b")

    asyncio.run(go())


def test_owners_survive_a_restart(loop: Loop, start_broker: StartBroker) -> None:
    """Owners are stored: after a restart another user's PRODUCE with an id is refused as
    before (it used to be bound to whoever sent first after the restart)."""
    env = start_broker(auth_enabled=True, bootstrap_user=ADMIN, bootstrap_password=ADMIN_PASSWORD)

    async def connect(address: str, user: str) -> ClientConnection:
        return await ClientConnection.open(
            address, max_frame_bytes=_FRAME, username=user, password=f"{user}-password"
        )

    def produce(pid: int, seq: int) -> ProduceRequest:
        return ProduceRequest(topic="owned", queue=0, producer_id=pid, epoch=0, base_sequence=seq)

    async def go() -> None:
        admin_login = ClientConfig(username=ADMIN, password=ADMIN_PASSWORD)
        async with tidemq.aio.Admin(env.address, client_config=admin_login) as admin:
            await admin.create_topic("owned", 1)
            for user in ("alice", "mallory"):
                await admin.create_user(user, f"{user}-password")
        alice = await connect(env.address, "alice")
        try:
            issued, _ = await alice.request(
                InitProducerRequest(), InitProducerResponse, timeout_s=10
            )
            await alice.request(produce(issued.producer_id, 0), ProduceResponse, _batch(),
                                timeout_s=10)  # fmt: skip
        finally:
            alice.close()
        await env.broker.stop()
        again = Broker(env.broker.config, embedded_nameserver=True)
        address = await again.start()
        mallory, alice = await connect(address, "mallory"), await connect(address, "alice")
        try:
            with pytest.raises(FencedProducer):
                await mallory.request(
                    produce(issued.producer_id, 1), ProduceResponse, _batch(), timeout_s=10
                )
            stored, _ = await alice.request(
                produce(issued.producer_id, 1), ProduceResponse, _batch(), timeout_s=10
            )
            assert (stored.base_offset, stored.duplicate) == (1, False)
        finally:
            alice.close()
            mallory.close()
            await again.stop()

    loop.run(go(), timeout_s=40)


def test_owners_forgotten_in_memory_are_found_in_the_store() -> None:
    stored: dict[int, str] = {}

    async def save(producer_id: int, principal: str) -> None:
        stored[producer_id] = principal

    async def load(producer_id: int) -> str | None:
        return stored.get(producer_id)

    async def go() -> None:
        owners = ProducerOwners(max_owners=1, save=save, load=load)
        await owners.issued(1, "User:a")
        await owners.issued(2, "User:b")  # 1 leaves the memory, not the store
        assert not owners.known(1, "User:a")
        with pytest.raises(FencedProducer):
            await owners.check(1, "User:x")
        await owners.check(1, "User:a")
        await owners.check(3, "User:c")  # nobody's: bound, and stored
        assert stored == {1: "User:a", 2: "User:b", 3: "User:c"}
        with pytest.raises(FencedProducer):
            owners.known(3, "User:a")  # in memory, another's: refused without a wait

    asyncio.run(go())
