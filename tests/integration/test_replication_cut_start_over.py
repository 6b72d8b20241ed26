"""A follower told to cut its log below its own log start starts over
(docs/design/replication.md, "Starting over"; `ReplicaFollower._round`,
`replica_start_over.restart_empty`).

A leader whose followers stopped copying (their fetches held, still in the in-sync set)
appends records alone that the group never commits, then its own retention deletes its
log up to past the committed position: the point where it will have to cut. It is
deposed (its keep-alives stop), a follower leads under the next epoch, and the old
leader, following now, is told its log differs from the committed position on, below
its own log start. It throws its log away, copies the new leader's from the start and
joins the in-sync set; what it wrote alone is gone, what the group committed is there.

Members run in this process (real sockets, files and etcd: `tests/support/replica_group.py`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tests.integration.conftest import wait_until
from tests.support.etcd_server import EtcdCluster, etcd_single
from tests.support.replica_group import group, wait_all_in_sync

from tidemq.client.admin import AsyncAdmin
from tidemq.client.producer import AsyncProducer
from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.store.start_over import MARKER
from tidemq.testing.replication import ReplicaFaultSwitch

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

__all__ = ["etcd_single"]  # a fixture, used by name below

#: Small segments and index files, so the leader's retention frees segments after a few
#: hundred messages; the services' saves often, so their scan position never holds them.
BROKER: Final[dict[str, object]] = {
    "store_overrides": {"segment_size_bytes": 64 << 10, "index_entries_per_file": 16},
    "service_checkpoint_interval_ms": 200,
}
#: Committed messages before the followers stop copying (of the expiring topic), and
#: after the failover (of the other).
COMMITTED: Final = 20
#: Messages the leader appends alone (about 6 segments of 64 KiB).
ALONE: Final = 400
VALUE_BYTES: Final = 1000
CATCH_UP_S: Final = 60.0


async def _send(bootstrap: str, topic: str, count: int) -> None:
    producer = AsyncProducer(bootstrap)
    try:
        for i in range(count):
            await producer.send(topic, b"%d" % i, queue=0)
    finally:
        await producer.close()


def test_a_follower_told_to_cut_below_its_own_log_start_starts_over(
    loop: Loop, tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    async def run() -> None:
        faults = {n: ReplicaFaultSwitch() for n in ("m0", "m1", "m2")}
        async with group(tmp_path, etcd_single) as g:
            g.broker = dict(BROKER)
            for name, switch in faults.items():
                await g.start(name, switch, replica_lag_max_ms=15_000)
            old = await g.wait_leader()
            async with AsyncAdmin(g.bootstrap) as admin:
                await admin.create_topic("x", 1, config={"retention.ms": "1000"})
                await admin.create_topic("y", 1)
            await _send(g.bootstrap, "x", COMMITTED)  # expires with the rest
            await wait_all_in_sync(old)
            others = [n for n in g.nodes.values() if n is not old]
            for node in others:
                faults[node.member].hold_fetches()
            assert old.broker is not None
            gateway = old.broker._gateway
            store = gateway.store
            committed = store.end_position
            value = b"." * VALUE_BYTES
            alone = [
                asyncio.ensure_future(gateway.append("x", 0, encode_batch([MessageRecord(value)])))
                for _ in range(ALONE)
            ]
            await wait_until(
                lambda: store.queue_bounds("x", 0)[1] == COMMITTED + ALONE, what="the appends alone"
            )

            async def deleted_past_the_cut() -> bool:
                await gateway.call(lambda s: s.enforce_retention())
                return bool(store.log.start_position > committed)

            await wait_until(
                deleted_past_the_cut, timeout_s=CATCH_UP_S, interval_s=0.2,
                what="the leader's retention past the committed position",
            )  # fmt: skip
            faults[old.member].hold_campaigns()
            faults[old.member].pause_keepalive()  # deposed at its lease deadline
            new = await g.wait_leader(not_=old)
            for node in others:
                faults[node.member].release_fetches()
            outcomes = await asyncio.gather(*alone, return_exceptions=True)
            assert all(isinstance(o, Exception) for o in outcomes)  # none acknowledged
            await _send(g.bootstrap, "y", COMMITTED)
            assert new.broker is not None
            leader_store = new.broker._gateway.store

            def caught_up() -> bool:
                follower, term = old.follower, new.leader
                return (
                    follower is not None
                    and term is not None
                    and follower.store.end_position == leader_store.end_position
                    and old.member in term.in_sync
                )

            await wait_until(caught_up, timeout_s=CATCH_UP_S, what="the old leader to catch up")
            follower = old.follower
            assert follower is not None
            assert follower.truncations == 1
            copy = follower.store
            assert copy.log.start_position <= committed  # a new log, from the group's
            # What it wrote alone is gone; what the group committed is there.
            assert copy.queue_bounds("x", 0)[1] == COMMITTED
            assert leader_store.queue_bounds("x", 0)[1] == COMMITTED
            assert copy.queue_bounds("y", 0)[1] == COMMITTED
            assert not (old.config.store.data_dir / MARKER).exists()

    loop.run(run(), timeout_s=180)
