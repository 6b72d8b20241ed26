"""etcd is the replica group's controller: what the group does when etcd members die.

A three-member etcd cluster keeps its quorum with one member killed (`kill -9`): the
group goes on acknowledging. With two killed, no lease can be kept: the leader stops
acknowledging at its lease deadline (its broker stops) and nothing is acknowledged until
etcd has a quorum again; then a leader writes on. Every acknowledged message is stored
once, in per-queue send order.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.integration.conftest import wait_until
from tests.support.etcd_server import EtcdCluster, etcd_cluster3
from tests.support.replica_group import group

from tidemq import aio
from tidemq.client.producer import AsyncProducer
from tidemq.core.errors import TidemqError

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

__all__ = ["etcd_cluster3"]  # a fixture, used by name below


async def _stored(bootstrap: str, want: int) -> dict[int, list[bytes]]:
    """Every message of t's two queues, read from the start until `want` are in (bounded)."""
    got: dict[int, list[bytes]] = {0: [], 1: []}
    consumer = aio.StreamConsumer(bootstrap)
    consumer.assign([("t", 0), ("t", 1)])
    consumer.seek("t", 0, 0)
    consumer.seek("t", 1, 0)
    try:
        async with asyncio.timeout(30):
            while len(got[0]) + len(got[1]) < want:
                for m in await consumer.poll(200):
                    got[m.queue].append(m.value or b"")
    finally:
        await consumer.close()
    return got


def test_one_etcd_member_lost_writes_go_on_a_quorum_lost_they_stop(
    loop: Loop, tmp_path: Path, etcd_cluster3: EtcdCluster
) -> None:
    etcd = etcd_cluster3

    async def run() -> None:
        async with group(tmp_path, etcd) as g:
            await g.start_three("t", 2)
            acked: dict[int, list[bytes]] = {0: [], 1: []}
            producer = AsyncProducer(g.bootstrap)

            async def send(tag: str, n: int) -> None:
                for i in range(n):
                    value = f"{tag}-{i}".encode()
                    receipt = await producer.send("t", value, queue=i % 2)
                    acked[receipt.queue].append(value)

            try:
                await send("all-up", 30)
                etcd.members[0].kill()
                await send("one-down", 30)  # two of three: a quorum
                etcd.members[1].kill()
                await wait_until(
                    lambda: g.leader() is None,
                    timeout_s=30,
                    what="the leader to stop leading without an etcd quorum",
                )
                impatient = AsyncProducer(g.bootstrap, delivery_timeout_ms=3_000)
                try:
                    with pytest.raises(TidemqError):
                        await impatient.send("t", b"no-quorum", queue=0)
                finally:
                    await impatient.close()
                for member in etcd.members[:2]:
                    member.start()
                await asyncio.to_thread(etcd.wait_ready)
                await g.wait_leader()
                await send("back", 30)
                stored = await _stored(g.bootstrap, sum(len(v) for v in acked.values()))
            finally:
                await producer.close()
        for q in (0, 1):
            kept = [v for v in stored[q] if v != b"no-quorum"]
            assert len(set(kept)) == len(kept), f"queue {q} holds a message twice"
            assert kept == acked[q], f"queue {q}: not every acknowledged message, in order"

    loop.run(run(), timeout_s=150)
