"""A replica group's tier ranges and static-topic chains replicate through the log
(`broker/member_tables.py`, ADR 23): the leader offloads a topic to a file:// tier and
drops its local copies; a follower learns the remote ends, so its own retention drops its
copies too; leadership moves to it, and it serves every offloaded offset from the tier.
A static topic's chain opened on the group is on the next leader, writable, and the
topic is written and read on through it.

Members run in this process (real sockets, files and etcd: `tests/support/replica_group.py`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tests.integration.conftest import wait_until
from tests.support.etcd_server import EtcdCluster, etcd_single
from tests.support.replica_group import GROUP, Group, group, wait_all_in_sync

from tidemq import aio
from tidemq.broker.replica_node import ReplicaNode
from tidemq.client.admin import AsyncAdmin
from tidemq.client.producer import AsyncProducer
from tidemq.core.errors import BrokerNotAvailable
from tidemq.store.message_store import MessageStore
from tidemq.tiered.config import TieredConfig

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

__all__ = ["etcd_single"]  # a fixture, used by name below

TIERED: Final = "offloaded"
STATIC: Final = "chained"
QUEUES: Final = 2
MESSAGES: Final = 300
STATIC_MESSAGES: Final = 40
#: Offloaded, and no local copy kept once offloaded.
OFFLOADED: Final = {"remote.storage.enable": "true", "local.retention.ms": "0"}
HOUR_MS: Final = 3_600_000
READ_S: Final = 60.0


def _value(tag: str, i: int) -> bytes:
    return f"{tag}-{i}-".encode() * (1 + i % 7)


async def _produce(g: Group, topic: str, values: list[bytes]) -> None:
    producer = AsyncProducer(g.bootstrap)
    try:
        for i, value in enumerate(values):
            await producer.send(topic, value, queue=i % QUEUES)
    finally:
        await producer.close()


async def _read(g: Group, topic: str, count: int) -> dict[int, list[tuple[int, bytes]]]:
    """queue -> [(offset, value)] from each queue's start, until `count` messages came."""
    consumer = aio.StreamConsumer(g.bootstrap, fetch_wait_ms=50)
    consumer.assign([(topic, q) for q in range(QUEUES)])

    async def positioned() -> bool:
        try:  # the name server may route to the old leader for a heartbeat
            await consumer.seek_to_beginning()
        except BrokerNotAvailable:
            return False
        return True

    got: dict[int, list[tuple[int, bytes]]] = {q: [] for q in range(QUEUES)}
    try:
        await wait_until(positioned, what="the group's route to its new leader")
        async with asyncio.timeout(READ_S):
            while sum(len(v) for v in got.values()) < count:
                for m in await consumer.poll(200):
                    got[m.queue].append((m.offset, m.value or b""))
    except TimeoutError:
        raise AssertionError(f"read {[len(v) for v in got.values()]} of {count}") from None
    finally:
        await consumer.close()
    return got


def _expected(tag: str, count: int) -> dict[int, list[tuple[int, bytes]]]:
    values = [_value(tag, i) for i in range(count)]
    return {q: [(n, v) for n, v in enumerate(values[q::QUEUES])] for q in range(QUEUES)}


def _local_mins(store: MessageStore) -> list[int]:
    return [store.index_of(TIERED, q)[1].min_offset for q in range(QUEUES)]


def _remote_ends(store: MessageStore) -> list[int | None]:
    tid = store.topic(TIERED).id
    ranges = [store.remote.get((tid, q)) for q in range(QUEUES)]
    return [None if r is None else r.remote_end for r in ranges]


async def _offload_and_drop(leader: ReplicaNode) -> list[int]:
    """Offload the tiered topic on the leader and apply its retention; the remote ends."""
    broker = leader.broker
    assert broker is not None
    assert broker.tier is not None
    await broker.tier.offload_now(TIERED)
    store = broker._gateway.store
    await broker._gateway.call(lambda s: s.enforce_retention())
    ends = _remote_ends(store)
    assert all(e is not None and e > 0 for e in ends), ends
    assert all(m > 0 for m in _local_mins(store)), "the leader kept its local copies"
    return [e for e in ends if e is not None]


def test_a_promoted_member_serves_the_offloaded_offsets_and_static_links(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    bucket = tmp_path / "bucket"
    bucket.mkdir()

    async def run() -> None:
        async with group(tmp_path, etcd_single) as g:
            g.broker = {
                "tiered": TieredConfig(
                    url=f"file://{bucket}",
                    file_bytes=8 * 1024,
                    row_group_bytes=2 * 1024,
                    check_interval_ms=HOUR_MS,  # no background pass: the test offloads
                )
            }
            leader = await g.start_three(TIERED, QUEUES, config=OFFLOADED)
            async with AsyncAdmin(g.bootstrap) as admin:
                await admin.create_topic(STATIC, QUEUES, static=True, brokers=[GROUP])
            await _produce(g, TIERED, [_value(TIERED, i) for i in range(MESSAGES)])
            first = [_value(STATIC, i) for i in range(STATIC_MESSAGES)]
            await _produce(g, STATIC, first)
            await wait_all_in_sync(leader)
            ends = await _offload_and_drop(leader)
            assert leader.broker is not None
            chains = [leader.broker._gateway.store.static_chain(STATIC, q) for q in range(QUEUES)]
            assert all(c is not None for c in chains)

            heir = next(n for n in g.nodes.values() if n is not leader)

            def learned() -> bool:
                follower = heir.follower
                return follower is not None and _remote_ends(follower.store) == ends

            await wait_until(learned, what="the follower to learn the remote ends")
            follower = heir.follower
            assert follower is not None
            follower.store.enforce_retention()  # its own retention (every minute) now
            assert all(m > 0 for m in _local_mins(follower.store)), (
                "the follower kept its local copies of offloaded offsets"
            )

            async with AsyncAdmin(g.bootstrap) as admin:
                await admin.elect_leader(GROUP, heir.member)
            await wait_until(lambda: g.leader() is heir, what=f"{heir.member} to lead")
            assert heir.broker is not None
            store = heir.broker._gateway.store
            assert [store.static_chain(STATIC, q) for q in range(QUEUES)] == chains
            assert all(store.static_writable(STATIC, q) for q in range(QUEUES))

            assert await _read(g, TIERED, MESSAGES) == _expected(TIERED, MESSAGES)
            assert heir.broker.tier is not None
            assert heir.broker.tier.stats.remote_reads > 0  # from the bucket, not a copy
            more = [_value(STATIC, i) for i in range(STATIC_MESSAGES, 2 * STATIC_MESSAGES)]
            await _produce(g, STATIC, more)
            assert await _read(g, STATIC, 2 * STATIC_MESSAGES) == _expected(
                STATIC, 2 * STATIC_MESSAGES
            )

    loop.run(run(), timeout_s=180)
