"""A replica group of three members on a real etcd: the leader serves the group's
clients, followers copy its log, an append is acknowledged only once two members hold
it, and when the leader leaves another member takes over with every acknowledged
message (docs/design/replication.md).

Members run in this process on one event loop (real sockets on 127.0.0.1, real files);
killed processes and network partitions are the Jepsen-style check's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.integration.conftest import broker_config, wait_until
from tests.support.etcd_server import EtcdCluster, etcd_single
from tests.support.replica_group import GROUP, group, wait_all_in_sync

from tidemq import aio
from tidemq.broker import replica_node
from tidemq.broker.replica_node import ReplicaNode
from tidemq.broker.system_topics import TIMER_TOPIC
from tidemq.client.admin import AsyncAdmin
from tidemq.client.producer import AsyncProducer
from tidemq.core.errors import AuthenticationFailed, InvalidRequest, RequestTimeout
from tidemq.net.client import ClientConnection
from tidemq.protocol.commands import InitProducerRequest, InitProducerResponse
from tidemq.protocol.replica_messages import ReplicaFetchRequest, ReplicaFetchResponse
from tidemq.store.message_store import MessageStore
from tidemq.testing.replication import ReplicaFaultSwitch

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

__all__ = ["etcd_single"]  # a fixture, used by name below


async def _send(producer: AsyncProducer, values: list[bytes]) -> list[tuple[int, int]]:
    receipts = await asyncio.gather(
        *(producer.send("t", v, queue=i % 2) for i, v in enumerate(values))
    )
    return [(r.queue, r.offset) for r in receipts]


def _stored(data_dir: Path) -> dict[int, list[bytes]]:
    """Every message of topic t's queues in a (stopped) member's store, in order."""
    from tidemq.core.batch import decode_messages  # noqa: PLC0415

    store = MessageStore.open(broker_config(data_dir).store)
    try:
        out: dict[int, list[bytes]] = {}
        for q in range(2):
            lo, hi = store.queue_bounds("t", q)
            values, offset = [], lo
            while offset < hi:
                got = store.read("t", q, offset, max_bytes=1 << 20)
                for b in got.batches:
                    payload = b.record[64 + int.from_bytes(b.record[54:56], "little") :]
                    values += [m.value or b"" for m in decode_messages(payload)]
                offset = got.next_offset
            out[q] = values
        return out
    finally:
        store.close()


def test_a_group_commits_on_two_members_and_a_new_leader_has_every_acknowledged_message(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    async def run() -> None:
        async with group(tmp_path, etcd_single) as g:
            for name in ("m0", "m1", "m2"):
                await g.start(name)
            first = await g.wait_leader()
            async with AsyncAdmin(g.bootstrap) as admin:
                await wait_until(lambda: first.broker is not None, what="the leader's broker")
                await admin.create_topic("t", 2)
            producer = AsyncProducer(g.bootstrap)
            try:
                sent = [b"m%d" % i for i in range(200)]
                await _send(producer, sent)
                # Acknowledged: the leader's committed position covers it, and at least one
                # follower has it durably.
                leader = first.leader
                assert leader is not None
                await wait_all_in_sync(first)
                positions = leader.follower_positions()
                assert max(durable for _, durable in positions.values()) >= leader.committed
                assert leader.committed > 0
                async with AsyncAdmin(g.bootstrap) as admin:
                    status = (await admin.broker_status(first.address)).replication
                assert status is not None
                assert (status.group, status.member, status.epoch) == (GROUP, first.member, 1)
                assert status.in_sync == ("m0", "m1", "m2")
                assert status.committed == leader.committed
                assert {f.member for f in status.followers} == {"m0", "m1", "m2"} - {first.member}
                await first.stop()  # resigns: another in-sync member takes over
                second = await g.wait_leader(not_=first)
                more = [b"n%d" % i for i in range(50)]
                await _send(producer, more)
            finally:
                await producer.close()
            stored = second.config.store.data_dir
            await second.stop()
            got = _stored(stored)
            everything = sorted(got[0] + got[1])
            assert everything == sorted([*sent, *more])
            assert got[0] == [v for i, v in enumerate(sent) if i % 2 == 0] + [
                v for i, v in enumerate(more) if i % 2 == 0
            ]

    loop.run(run(), timeout_s=120)


def test_without_enough_members_in_sync_writes_are_refused(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    async def run() -> None:
        async with group(tmp_path, etcd_single) as g:
            await g.start("m0")
            only = await g.wait_leader()
            assert only.broker is not None
            async with AsyncAdmin(g.bootstrap) as admin:
                await admin.create_topic("t", 2)  # metadata: no log write to replicate
            producer = AsyncProducer(g.bootstrap, delivery_timeout_ms=1_500)
            try:
                with pytest.raises(RequestTimeout, match="min_insync_replicas is 2"):
                    await producer.send("t", b"v")
            finally:
                await producer.close()

    loop.run(run(), timeout_s=60)


def test_a_deposed_leader_cuts_what_the_group_never_committed(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    """The leader appends a batch its followers never fetch, then loses its lease: another
    member leads, the producer's retry is stored there once, and the old leader, now a
    follower, cuts the batch from its log and ends with the new leader's log."""

    async def run() -> None:
        faults = {n: ReplicaFaultSwitch() for n in ("m0", "m1", "m2")}
        async with group(tmp_path, etcd_single) as g:
            for name, switch in faults.items():
                # Followers cut off from the leader for longer than the lease: they must
                # stay in the in-sync set meanwhile to be electable.
                await g.start(name, switch, replica_lag_max_ms=15_000)
            old = await g.wait_leader()
            async with AsyncAdmin(g.bootstrap) as admin:
                await admin.create_topic("t", 2)
            producer = AsyncProducer(g.bootstrap)
            try:
                sent = [b"a%d" % i for i in range(20)]
                await _send(producer, sent)
                followers = [n for n in g.nodes.values() if n is not old]
                for f in followers:
                    faults[f.member].hold_fetches()
                assert old.broker is not None
                store = old.broker._gateway.store
                end = store.end_position
                late = asyncio.ensure_future(producer.send("t", b"late", queue=0))
                await wait_until(lambda: store.end_position > end, what="the late append")
                faults[old.member].hold_campaigns()
                faults[old.member].pause_keepalive()  # its lease lapses: deposed
                await wait_until(lambda: old.broker is None, what="the old leader to step down")
                for f in followers:
                    faults[f.member].release_fetches()
                new = await g.wait_leader(not_=old)
                receipt = await late  # retried at the new leader
                assert receipt.queue == 0
                await wait_until(
                    lambda: old.follower is not None and old.follower.truncations >= 1,
                    what="the old leader's cut",
                )
                await _send(producer, [b"b%d" % i for i in range(10)])
                leader = new.leader
                assert leader is not None
                await wait_until(
                    lambda: old.member in leader.in_sync, what="the old leader back in sync"
                )
            finally:
                await producer.close()
            await new.stop()
            await old.stop()
            on_new, on_old = _stored(new.config.store.data_dir), _stored(old.config.store.data_dir)
            assert on_old == on_new
            assert on_new[0].count(b"late") == 1
            assert sorted(on_new[0] + on_new[1]) == sorted(
                [*sent, b"late", *(b"b%d" % i for i in range(10))]
            )

    loop.run(run(), timeout_s=120)


def test_with_a_cluster_secret_only_members_read_the_replication_listener(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    """Followers log in with the cluster secret and replicate; a connection without the
    login is refused before it can fetch a byte of the log."""
    secret = "s3cret-" * 6

    async def run() -> None:
        async with group(tmp_path, etcd_single, secret) as g:
            for name in ("m0", "m1"):
                await g.start(name)
            leader = await g.wait_leader()
            async with AsyncAdmin(g.bootstrap) as admin:
                await admin.create_topic("t", 2)
            producer = AsyncProducer(g.bootstrap)
            try:
                await _send(producer, [b"v%d" % i for i in range(20)])  # needs the follower
            finally:
                await producer.close()
            conn = await ClientConnection.open(leader.replication_address, max_frame_bytes=1 << 20)
            try:
                fetch = ReplicaFetchRequest(
                    group=GROUP, member="intruder", epoch=1, position=0, durable=0
                )
                with pytest.raises(AuthenticationFailed, match="authenticate first"):
                    await conn.request(fetch, ReplicaFetchResponse, timeout_s=10)
            finally:
                conn.close()

    loop.run(run(), timeout_s=60)


def test_a_new_leader_resumes_the_services_from_the_state_its_leader_saved(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    """The leader's saved service state reaches the followers with the trims of the
    internal queues: a delayed message scheduled on one leader is delivered once by the
    next, and the followers trim the timer queue as the leader does."""

    async def run() -> None:
        async with group(tmp_path, etcd_single) as g:
            g.broker = {"service_checkpoint_interval_ms": 100, "timer_precision_ms": 50}
            first = await g.start_three("t", 1)
            producer = AsyncProducer(g.bootstrap)
            try:
                await producer.send("t", b"now", queue=0)
                await producer.send("t", b"later", queue=0, delay=2.0)
                followers = [n for n in g.nodes.values() if n is not first]
                applied = [f.follower.state_applied if f.follower else 0 for f in followers]
                await wait_until(
                    lambda: all(
                        f.follower is not None and f.follower.state_applied > a + 1
                        for f, a in zip(followers, applied, strict=True)
                    ),
                    what="the followers to hold a state saved after the schedule",
                )
                await first.stop()
                second = await g.wait_leader(not_=first)
                consumer = aio.StreamConsumer(g.bootstrap)
                consumer.assign([("t", 0)])
                consumer.seek("t", 0, 0)
                values: list[bytes] = []
                try:
                    async with asyncio.timeout(30):
                        while b"later" not in values:
                            values += [m.value or b"" for m in await consumer.poll(200)]
                finally:
                    await consumer.close()
                assert values == [b"now", b"later"]
                # The timer queue's first offsets are done: trimmed on the followers too.
                third = next(n for n in g.nodes.values() if n not in (first, second))
                await wait_until(
                    lambda: (
                        third.follower is not None
                        and third.follower.store.queue_bounds(TIMER_TOPIC, 0)[0] > 0
                    ),
                    what="the timer queue trimmed on a follower",
                )
            finally:
                await producer.close()

    loop.run(run(), timeout_s=90)


def test_leadership_moves_by_hand_to_an_in_sync_member_losing_nothing(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    """`elect_leader` while a producer keeps sending: the chosen member leads under the
    next epoch, the producer's sends all end acknowledged, and every one is stored once."""

    async def run() -> None:
        async with group(tmp_path, etcd_single) as g:
            for name in ("m0", "m1", "m2"):
                await g.start(name)
            first = await g.wait_leader()
            target = next(n for n in g.nodes.values() if n is not first)
            async with AsyncAdmin(g.bootstrap) as admin:
                await admin.create_topic("t", 2)
                with pytest.raises(InvalidRequest, match="already leads"):
                    await admin.elect_leader(GROUP, first.member)
                with pytest.raises(InvalidRequest, match="is not in sync"):
                    await admin.elect_leader(GROUP, "m9")
            producer = AsyncProducer(g.bootstrap)
            sent: list[bytes] = []
            stop = asyncio.Event()

            async def keep_sending() -> None:
                while not stop.is_set() or len(sent) < 50:
                    value = b"v%d" % len(sent)
                    await producer.send("t", value, queue=len(sent) % 2)
                    sent.append(value)

            sending = asyncio.ensure_future(keep_sending())
            try:
                await wait_until(lambda: len(sent) >= 20, what="sends before the handover")
                async with AsyncAdmin(g.bootstrap) as admin:
                    done = await admin.elect_leader(GROUP, target.member)
                assert (done.previous, done.member) == (first.member, target.member)
                assert done.address == target.address
                assert 0 <= done.paused_ms <= done.took_ms
                print(
                    f"handover: writes refused {done.paused_ms:.1f} ms, took {done.took_ms:.0f} ms"
                )
                await wait_until(lambda: g.leader() is target, what="the target to lead")
                count = len(sent)
                await wait_until(lambda: len(sent) >= count + 20, what="sends after it")
                stop.set()
                await sending
            finally:
                stop.set()
                await producer.close()
            status = target.leader
            assert status is not None
            assert status.epoch == 2
            await target.stop()
            got = _stored(target.config.store.data_dir)
            assert sorted(got[0] + got[1]) == sorted(sent)
            assert got[0] == [v for i, v in enumerate(sent) if i % 2 == 0]

    loop.run(run(), timeout_s=120)


def test_roles_outlast_the_elections_wait(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member leads (or follows) for much longer than one wait on its election: the
    wait's timeout is not an end of the role (it once made a leader step down, and a
    follower stop looking, after an hour)."""
    monkeypatch.setattr(replica_node, "_ROLE_WAIT_S", 0.01)

    async def run() -> None:
        async with group(tmp_path, etcd_single) as g:
            for name in ("m0", "m1"):
                await g.start(name)
            first = await g.wait_leader()
            async with AsyncAdmin(g.bootstrap) as admin:
                await admin.create_topic("t", 2)
            producer = AsyncProducer(g.bootstrap)
            try:
                for i in range(50):  # each waits for the follower: many 10 ms waits pass
                    await producer.send("t", b"v%d" % i, queue=i % 2)
            finally:
                await producer.close()
            assert g.leader() is first
            assert first.leader is not None
            assert first.leader.epoch == 1
            for node in g.nodes.values():
                assert node._roles_task is not None
                assert not node._roles_task.done()

    loop.run(run(), timeout_s=60)


def test_committed_offsets_survive_a_failover(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    """A group's committed offsets are records of the leader's log (the offset book), so
    the next leader answers them, and a consumer of the group goes on where it was, with
    nothing read twice or skipped."""

    async def run() -> None:
        async with group(tmp_path, etcd_single) as g:
            first = await g.start_three("t", 2)
            producer = AsyncProducer(g.bootstrap)
            try:
                await _send(producer, [b"a%d" % i for i in range(40)])
                consumer = aio.GroupConsumer(g.bootstrap, "readers", ["t"], start="earliest")
                seen: list[bytes] = []
                try:
                    async with asyncio.timeout(30):
                        while len(seen) < 40:
                            seen += [m.value or b"" for m in await consumer.poll(200)]
                    await consumer.commit()
                finally:
                    await consumer.close()
                async with AsyncAdmin(g.bootstrap) as admin:
                    before = {
                        (o.topic, o.queue): o.committed
                        for o in (await admin.describe_group("readers")).offsets
                    }
                assert before == {("t", 0): 20, ("t", 1): 20}
                await first.stop()
                await g.wait_leader(not_=first)
                await _send(producer, [b"b%d" % i for i in range(10)])
            finally:
                await producer.close()
            async with AsyncAdmin(g.bootstrap) as admin:
                after = {
                    (o.topic, o.queue): o.committed
                    for o in (await admin.describe_group("readers")).offsets
                }
            assert after == before
            consumer = aio.GroupConsumer(g.bootstrap, "readers", ["t"], start="earliest")
            rest: list[bytes] = []
            try:
                async with asyncio.timeout(30):
                    while len(rest) < 10:
                        rest += [m.value or b"" for m in await consumer.poll(200)]
            finally:
                await consumer.close()
            assert sorted(rest) == sorted(b"b%d" % i for i in range(10))

    loop.run(run(), timeout_s=120)


def test_followers_compact_their_copy_of_compact_topics(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    """A follower compacts the committed part of its log as the leader does (a follower
    that never compacted kept every segment holding a compact topic's records: with the
    offset book, every segment a group committed in), and a follower that becomes leader
    serves the newest value of every key."""

    async def run() -> None:
        async with group(tmp_path, etcd_single) as g:
            g.broker = {"compaction_check_interval_ms": 100}
            first = await g.start_three("kv", 1, config={"cleanup.policy": "compact"})
            producer = AsyncProducer(g.bootstrap)
            try:
                for i in range(300):
                    await producer.send("kv", b"v%d" % i, key=b"k%d" % (i % 10), queue=0)
            finally:
                await producer.close()
            followers = [n for n in g.nodes.values() if n is not first]

            def compacted(node: ReplicaNode) -> int:
                if node.follower is None:
                    return 0
                store = node.follower.store
                log = store.compacted.get((store.topic("kv").id, 0))
                return 0 if log is None else log.end

            await wait_until(
                lambda: all(compacted(f) >= 150 for f in followers),
                what="both followers to compact most of kv",
            )
            await first.stop()
            await g.wait_leader(not_=first)
            consumer = aio.StreamConsumer(g.bootstrap)
            consumer.assign([("kv", 0)])
            consumer.seek("kv", 0, 0)
            newest: dict[bytes, bytes] = {}
            count = 0
            try:
                async with asyncio.timeout(30):
                    while newest.get(b"k9") != b"v299":
                        for m in await consumer.poll(200):
                            count += 1
                            newest[m.key or b""] = m.value or b""
            finally:
                await consumer.close()
            assert newest == {b"k%d" % k: b"v%d" % (290 + k) for k in range(10)}
            assert count < 300  # compacted: superseded values are gone

    loop.run(run(), timeout_s=120)


def test_an_idempotent_retry_at_the_next_leader_is_stored_once(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    """A send the leader appended and one follower copied, but that was never
    acknowledged (the other follower, in sync, was cut off), is retried by the producer
    at the next leader, which holds the copy: the retry carries the same producer id and
    sequence, so it is answered from the copy, not written again. (Producer ids were kept
    per broker address: at the new leader's address the producer took a new id, and the
    retry was stored twice.)"""

    async def run() -> None:
        faults = {n: ReplicaFaultSwitch() for n in ("m0", "m1", "m2")}
        async with group(tmp_path, etcd_single) as g:
            for name, switch in faults.items():
                await g.start(name, switch, replica_lag_max_ms=15_000)
            old = await g.wait_leader()
            keep, held = sorted(
                (n for n in g.nodes.values() if n is not old), key=lambda n: n.member
            )
            async with AsyncAdmin(g.bootstrap) as admin:
                await admin.create_topic("t", 2)
            producer = AsyncProducer(g.bootstrap)
            try:
                sent = [b"a%d" % i for i in range(10)]
                await _send(producer, sent)
                # Both followers in the in-sync set first (each joins once caught up):
                # the held one must be, or the late send is acknowledged without it.
                await wait_all_in_sync(old)
                faults[held.member].hold_fetches()
                faults[held.member].hold_campaigns()
                assert old.broker is not None
                store = old.broker._gateway.store
                end = store.end_position
                late = asyncio.ensure_future(producer.send("t", b"late", queue=0))
                await wait_until(lambda: store.end_position > end, what="the late append")
                copy = keep.follower
                assert copy is not None
                await wait_until(
                    lambda: copy.store.flushed_position >= store.end_position,
                    what="the follower's durable copy",
                )
                assert not late.done()  # the held follower is still in the in-sync set
                faults[old.member].hold_campaigns()
                faults[old.member].pause_keepalive()  # deposed at its lease deadline
                new = await g.wait_leader(not_=old)
                assert new is keep
                faults[held.member].release_fetches()
                receipt = await late
                assert receipt.queue == 0
            finally:
                await producer.close()
            for node in (held, old, new):
                await node.stop()
            got = _stored(new.config.store.data_dir)
            assert got[0].count(b"late") == 1, got[0]
            assert got[0] == [*(v for i, v in enumerate(sent) if i % 2 == 0), b"late"]

    loop.run(run(), timeout_s=120)


def test_a_producer_id_a_deposed_leader_gave_out_is_never_given_again(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    """Producer ids are kept across a failover (a retry must carry its id to the next
    leader), so the next leader must never hand out an id the one before gave, even one
    its followers never saw in a record: each term takes its ids from its own block."""

    async def init_producer(address: str) -> int:
        conn = await ClientConnection.open(address, max_frame_bytes=1 << 20)
        try:
            answer, _ = await conn.request(
                InitProducerRequest(), InitProducerResponse, timeout_s=10
            )
            return answer.producer_id
        finally:
            conn.close()

    async def run() -> None:
        faults = {n: ReplicaFaultSwitch() for n in ("m0", "m1")}
        async with group(tmp_path, etcd_single) as g:
            for name, switch in faults.items():
                await g.start(name, switch)
            old = await g.wait_leader()
            async with AsyncAdmin(g.bootstrap) as admin:
                await admin.create_topic("t", 2)
            producer = AsyncProducer(g.bootstrap)
            try:  # the follower holds the topic, and this producer's id, from the log
                await _send(producer, [b"v"])
            finally:
                await producer.close()
            given = await init_producer(old.address)
            faults[old.member].hold_campaigns()
            faults[old.member].pause_keepalive()
            new = await g.wait_leader(not_=old)
            await wait_until(lambda: new.broker is not None, what="the new leader's broker")
            again = await init_producer(new.address)
            assert again > given

    loop.run(run(), timeout_s=60)
