"""A member that comes back after the leader's retention deleted the segments it needs
next starts over at the leader's log start and catches up (docs/design/replication.md,
"Starting over"), also when it is killed (-9) in the middle of starting over.

A group of three on a real etcd with small segments: one follower is stopped, the
leader writes a compact topic (compacted) and a topic with a 1 s retention, its
retention deletes its first segments, and then a topic whose messages all lie past the
new log start. The stopped member comes back, starts over at the log start, catches up,
joins the in-sync set, and once leadership is handed to it serves every message of that
topic, the newest value of every key of the compact topic, and the offsets consumer
groups committed before and after the log start moved.

The members run in this process (real sockets and files); the one killed in the middle
of its start-over runs as a process of its own (`tests/support/start_over_member.py`),
held at a step of the start-over until the test kills it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tests.integration.conftest import wait_until
from tests.support.etcd_server import EtcdCluster, etcd_single
from tests.support.replica_group import GROUP, Group, free_port, group

from tidemq import aio
from tidemq.broker.replica_node import ReplicaNode
from tidemq.client.admin import AsyncAdmin
from tidemq.client.producer import AsyncProducer
from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.core.errors import BrokerNotAvailable
from tidemq.net.client import ClientConnection
from tidemq.protocol.commands import (
    InitProducerRequest,
    InitProducerResponse,
    ProduceRequest,
    ProduceResponse,
)
from tidemq.store.start_over import MARKER

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

__all__ = ["etcd_single"]  # a fixture, used by name below

#: Messages of the compact topic (over KEYS keys), of the expiring topic, and of the
#: topic written after the log start moved.
KV_MESSAGES: Final = 200
KEYS: Final = 10
OLD_MESSAGES: Final = 300
NEW_MESSAGES: Final = 100
VALUE_BYTES: Final = 1000
#: Settings of every member: small segments and index files, so retention frees
#: segments after a few hundred messages; compaction and the services' saves often, so
#: neither holds them long.
BROKER: Final[dict[str, object]] = {
    "store_overrides": {"segment_size_bytes": 64 << 10, "index_entries_per_file": 16},
    "compaction_check_interval_ms": 100,
    "service_checkpoint_interval_ms": 200,
}
#: How long the whole catch-up may take on a loaded machine.
CATCH_UP_S: Final = 60.0


async def _produce(g: Group, topic: str, values: list[bytes], *, keyed: bool) -> None:
    producer = AsyncProducer(g.bootstrap)
    try:
        for i, value in enumerate(values):
            key = b"k%d" % (i % KEYS) if keyed else None
            await producer.send(topic, value, key=key, queue=0 if keyed else i % 2)
    finally:
        await producer.close()


def _value(tag: str, i: int) -> bytes:
    return f"{tag}{i}:".encode().ljust(VALUE_BYTES, b".")


async def _write_until_the_log_start_moves(g: Group, leader: ReplicaNode, past: int) -> int:
    """Write the compact topic and the expiring one until the leader's retention has
    deleted its log up to past `past`; the leader's log start then."""
    await _produce(g, "kv", [_value("kv", i) for i in range(KV_MESSAGES)], keyed=True)
    await _produce(g, "old", [_value("old", i) for i in range(OLD_MESSAGES)], keyed=False)
    broker = leader.broker
    assert broker is not None
    gateway = broker._gateway

    async def moved() -> bool:
        # Retention runs every minute on its own: here at once, as often as it takes
        # for "old" to expire and "kv" to be compacted.
        await gateway.call(lambda s: s.enforce_retention())
        return bool(gateway.store.log.start_position > past)

    await wait_until(moved, timeout_s=CATCH_UP_S, interval_s=0.2, what="the leader's retention")
    return int(gateway.store.log.start_position)


async def _commit_all(
    g: Group, group_name: str, topic: str, count: int
) -> dict[tuple[str, int], int]:
    """A consumer group reads `count` messages of `topic` and commits; the offsets the
    group's coordinator then answers."""
    consumer = aio.GroupConsumer(g.bootstrap, group_name, [topic], start="earliest")
    seen = 0
    try:
        async with asyncio.timeout(CATCH_UP_S):
            while seen < count:
                seen += len(await consumer.poll(200))
        await consumer.commit()
    finally:
        await consumer.close()
    return await _offsets(g, group_name)


async def _offsets(g: Group, group_name: str) -> dict[tuple[str, int], int]:
    async with AsyncAdmin(g.bootstrap) as admin:
        described = await admin.describe_group(group_name)
    return {(o.topic, o.queue): o.committed for o in described.offsets}


async def _caught_up(g: Group, member: str) -> None:
    """`member` holds the leader's whole log and is in the in-sync set."""

    def done() -> bool:
        node, leader = g.nodes.get(member), g.leader()
        if node is None or node.follower is None or leader is None or leader.leader is None:
            return False
        broker = leader.broker
        assert broker is not None
        end = broker._gateway.store.end_position
        return node.follower.store.end_position == end and member in leader.leader.in_sync

    await wait_until(done, timeout_s=CATCH_UP_S, what=f"{member} to catch up and be in sync")


async def _read_after_handover(g: Group, member: str) -> None:
    """Hand leadership to `member`; it serves every message of "new", in order, and the
    newest value of every key of "kv"."""
    async with AsyncAdmin(g.bootstrap) as admin:
        await admin.elect_leader(GROUP, member)
    await wait_until(lambda: g.leader() is g.nodes[member], what=f"{member} to lead")
    consumer = aio.StreamConsumer(g.bootstrap)
    consumer.assign([("new", 0), ("new", 1), ("kv", 0)])

    async def positioned() -> bool:
        # The deposed leader's broker unregisters the group's name as it stops, which
        # can remove the new leader's registration until its next heartbeat (a known
        # race of handovers, not of starting over): ask again meanwhile.
        try:
            await consumer.seek_to_beginning()
        except BrokerNotAvailable:
            return False
        return True

    await wait_until(positioned, what="the group's route to its new leader")
    got: dict[int, list[bytes]] = {0: [], 1: []}
    newest: dict[bytes, bytes] = {}
    last_kv = _value("kv", KV_MESSAGES - 1)
    try:
        async with asyncio.timeout(CATCH_UP_S):
            while len(got[0]) + len(got[1]) < NEW_MESSAGES or newest.get(b"k9") != last_kv:
                for m in await consumer.poll(200):
                    if m.topic == "new":
                        got[m.queue].append(m.value or b"")
                    else:
                        newest[m.key or b""] = m.value or b""
    except TimeoutError:
        raise AssertionError(
            f"read {len(got[0])} + {len(got[1])} messages of 'new', keys of 'kv': "
            f"{ {k: v[:8] for k, v in newest.items()} }"
        ) from None
    finally:
        await consumer.close()
    values = [_value("new", i) for i in range(NEW_MESSAGES)]
    assert got == {0: values[0::2], 1: values[1::2]}
    assert newest == {b"k%d" % k: _value("kv", KV_MESSAGES - KEYS + k) for k in range(KEYS)}


async def _setup(g: Group) -> tuple[ReplicaNode, str]:
    """Three members and the topics; a follower stopped after the first messages.
    Returns the leader and the stopped member's name."""
    g.broker = dict(BROKER)
    leader = await g.start_three("kv", 1, config={"cleanup.policy": "compact"})
    async with AsyncAdmin(g.bootstrap) as admin:
        await admin.create_topic("old", 2, config={"retention.ms": "1000"})
        await admin.create_topic("new", 2)
    await _produce(g, "old", [b"first"] * 4, keyed=False)
    stopped = next(n for n in g.nodes.values() if n is not leader)
    await _caught_up(g, stopped.member)
    await g.stop(stopped.member)
    return leader, stopped.member


def test_a_member_back_after_the_leaders_retention_starts_over_and_catches_up(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    async def run() -> None:
        async with group(tmp_path, etcd_single) as g:
            leader, member = await _setup(g)
            end_when_stopped = _log_end(tmp_path / member)
            # Committed before the log start moves: the offset book's record of it is
            # then only in the leader's compacted log of the offsets topic.
            early = await _commit_all(g, "early", "old", 4)
            assert early == {("old", 0): 2, ("old", 1): 2}
            start = await _write_until_the_log_start_moves(g, leader, end_when_stopped)
            new = [_value("new", i) for i in range(NEW_MESSAGES)]
            await _produce(g, "new", new, keyed=False)
            late = await _commit_all(g, "late", "new", NEW_MESSAGES)
            node = await g.start(member)
            await _caught_up(g, member)
            follower = node.follower
            assert follower is not None
            assert follower.start_overs == 1
            assert follower.store.log.start_position >= start  # retention may run again
            store = follower.store
            kv = store.compacted.get((store.topic("kv").id, 0))
            assert kv is not None  # the leader's compacted log, copied
            await _read_after_handover(g, member)
            assert await _offsets(g, "early") == early
            assert await _offsets(g, "late") == late

    loop.run(run(), timeout_s=240)


def test_a_member_killed_while_starting_over_starts_over_again_and_catches_up(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    """kill -9 of the member while it starts over (held at the switch to the compacted
    files: its store wiped, its new log made): started again, its store opens empty
    (the marker stands), it starts over again and catches up."""

    async def run() -> None:
        async with group(tmp_path, etcd_single) as g:
            leader, member = await _setup(g)
            start = await _write_until_the_log_start_moves(g, leader, _log_end(tmp_path / member))
            await _produce(g, "new", [_value("new", i) for i in range(NEW_MESSAGES)], keyed=False)
            data_dir = tmp_path / member
            log_path = tmp_path / f"{member}-process.log"
            with log_path.open("wb") as log_file:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.support.start_over_member",
                        str(data_dir),
                        member,
                        str(free_port()),
                        g.bootstrap,
                        ",".join(g.etcd),
                        "compacted",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                )
            try:
                await wait_until(
                    lambda: (data_dir / MARKER).exists() or proc.poll() is not None,
                    timeout_s=CATCH_UP_S,
                    what="the member to start over",
                )
                assert proc.poll() is None, log_path.read_text()
                # Starting over, it is not in sync (and so never elected): the leader
                # drops it at its next check if it was still in the set.
                term = leader.leader
                assert term is not None
                await wait_until(lambda: member not in term.in_sync, what="it out of sync")
            finally:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            assert (data_dir / MARKER).exists()
            node = await g.start(member)
            await _caught_up(g, member)
            follower = node.follower
            assert follower is not None
            assert follower.start_overs == 1  # from an empty store, in this process
            assert follower.store.log.start_position >= start
            await _read_after_handover(g, member)

    loop.run(run(), timeout_s=240)


class _Stamped:
    """Idempotent sends with stamps of the test's choosing (what a producer's retry
    carries), on a connection to one broker."""

    def __init__(self, conn: ClientConnection, producer_id: int, epoch: int) -> None:
        self.conn, self.producer_id, self.epoch = conn, producer_id, epoch

    @classmethod
    async def open(cls, address: str) -> _Stamped:
        conn = await ClientConnection.open(address, max_frame_bytes=1 << 24)
        init, _ = await conn.request(InitProducerRequest(), InitProducerResponse, timeout_s=10)
        return cls(conn, init.producer_id, init.epoch)

    async def send(self, seq: int, value: bytes) -> ProduceResponse:
        req = ProduceRequest(
            topic="old", queue=0, producer_id=self.producer_id, epoch=self.epoch,
            base_sequence=seq,
        )  # fmt: skip
        batch = encode_batch([MessageRecord(value=value)])
        answer, _ = await self.conn.request(req, ProduceResponse, batch, timeout_s=10)
        return answer


def test_a_member_that_started_over_answers_a_retry_of_a_batch_before_the_log_start(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    """An idempotent producer's batches stored before the leader's log start moved are
    not in the log a member starts over with; their windows come with the start-over,
    so once that member leads, a retry of one (same producer id and sequence) is
    answered with its first offset and not stored again."""

    async def run() -> None:
        async with group(tmp_path, etcd_single) as g:
            leader, member = await _setup(g)
            assert leader.broker is not None
            stamped = await _Stamped.open(leader.broker.address)
            try:
                first = [await stamped.send(seq, b"idem-%d" % seq) for seq in range(3)]
            finally:
                stamped.conn.close()
            assert not any(a.duplicate for a in first)
            end_when_stopped = _log_end(tmp_path / member)
            await _write_until_the_log_start_moves(g, leader, end_when_stopped)
            node = await g.start(member)
            await _caught_up(g, member)
            assert node.follower is not None
            assert node.follower.start_overs == 1
            async with AsyncAdmin(g.bootstrap) as admin:
                await admin.elect_leader(GROUP, member)
            await wait_until(lambda: g.leader() is node, what=f"{member} to lead")
            assert node.broker is not None
            ends = node.broker._gateway.store.queue_bounds("old", 0)[1]
            again = await _Stamped.open(node.broker.address)
            again.producer_id, again.epoch = stamped.producer_id, stamped.epoch
            try:
                retries = [await again.send(seq, b"idem-%d" % seq) for seq in (0, 2)]
            finally:
                again.conn.close()
            assert [(a.base_offset, a.duplicate) for a in retries] == [
                (first[0].base_offset, True),
                (first[2].base_offset, True),
            ]
            assert node.broker._gateway.store.queue_bounds("old", 0)[1] == ends

    loop.run(run(), timeout_s=240)


def _log_end(data_dir: Path) -> int:
    """A stopped member's log end: its last segment's start plus its length."""
    segments = sorted((data_dir / "commitlog").glob("*.log"))
    last = segments[-1]
    return int(last.stem) + last.stat().st_size
