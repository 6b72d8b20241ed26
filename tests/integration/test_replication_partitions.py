"""A Jepsen-style check of a replica group under network partitions and process faults
(issue 23). Three members of group g1 run as real processes, each in its own network
namespace (`tidemq.testing.netns`); etcd and the name server listen on the bridge in the
root namespace, where this test's clients run: two producers (idempotent, acks=all, one
per queue, sending one message at a time) and a consumer reading both queues from the
start, all the time, and a member of consumer group `checker` committing after each poll.

Each cycle strikes one fault chosen at random (the seed is printed; `--seed N` or
TIDEMQ_PARTITION_SEED=N replays the same faults in the same order; which member leads,
and so which one a leader fault strikes, is up to the elections):

* partition the leader's host: its lease lapses, another member leads, and once healed
  the old leader cuts what it wrote alone and rejoins the in-sync set;
* partition a follower's host; kill -9 a follower (started again);
* SIGSTOP the leader until another member leads, then SIGCONT (a zombie: whatever it
  still does must not acknowledge anything); kill -9 the leader (started again);
* cut the leader off from etcd alone: it still reaches its followers, the name server
  and the clients, but can renew nothing, so it must stop acknowledging at its lease's
  end while another member is elected;
* SIGSTOP etcd, or kill -9 it: no lease is renewed and no one can campaign, so the leader
  must stop serving at its lease's end; etcd is resumed (or started again, on its data)
  once it has, and a leader is elected under a new epoch.

A fault lasts until the group has acknowledged `PER_PHASE` messages sent after it was
struck (after etcd named a new leader, for a leader fault): a condition, not a
duration; a paused etcd lasts until the leader has stopped serving. Then it is mended,
and the cycle ends when etcd's in-sync set names every member again. At the end the
members are stopped and their stores read, and the history is checked
(`tests/support/replica_history.py`): every acknowledged message present once, at its
receipt's offset, in per-queue send order; the same records at the same offsets on every
member; nothing a consumer read later missing, consumer offsets moving one at a time;
one member per epoch (etcd's leader key history and the members' logs); the replica
group's committed position and the consumer group's committed offsets, sampled after
each cycle, never going back; every message the group member read still there. A zombie or a cut-off
leader that acknowledged alone would show as an acknowledged message missing or moved.

`make test` runs `CYCLES` cycles (the issue's 50: about 4 s each here, 4 minutes with the
start and the checks); `make soak` (TIDEMQ_SOAK=1) runs `SOAK_CYCLES`;
TIDEMQ_PARTITION_CYCLES=N runs N. Each cycle prints its fault and timings (from the fault
to etcd naming a new leader, to the first acknowledgement of a send made after the
fault, to the group whole again); the last line is a summary. Skipped where network
namespaces are not permitted (not root, no bridge driver), with the reason.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest
from tests.support.netns_group import (
    GROUP,
    InSyncHistory,
    LeaderHistory,
    NetnsGroup,
    netns_group,
    poll_until,
)
from tests.support.replica_history import Ack, History, Read, stored_messages, violations

from tidemq import aio
from tidemq.client.cluster import ClientConfig
from tidemq.cluster.etcd_client import EtcdClient
from tidemq.cluster.group_keys import GroupKeys
from tidemq.core.errors import TidemqError
from tidemq.testing import netns

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

SOAK: Final = os.environ.get("TIDEMQ_SOAK") == "1"
CYCLES: Final = 50
SOAK_CYCLES: Final = 1_000
MEMBERS: Final = ("m0", "m1", "m2")
TOPIC: Final = "t"
#: The consumer group whose one member reads and commits all the time.
CONSUMER_GROUP: Final = "checker"
QUEUES: Final = 2
#: Acknowledgements of sends made after a fault began that end the fault.
PER_PHASE: Final = 10
#: A connection to a member's client port not made within this counts as refused.
CONNECT_TIMEOUT_S: Final = 1.0
#: The longest a failover or a recovery may take here (lease 2 s, a loaded machine).
LIMIT_S: Final = 60.0
#: Clients give up on one request after this and ask the name server again (a
#: partitioned leader never answers; the default, 30 s, would be the failover time).
CLIENT: Final = ClientConfig(request_timeout_ms=2_000, route_refresh_ms=1_000)
#: Members: a follower that has not caught up for 1 s leaves the in-sync set (writes
#: wait for it until then).
SETTINGS: Final = ["--set", "replication.replica_lag_max_ms=1000"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(4 * 3600 if SOAK else 600)]


# ---------------------------------------------------------------------- the workload


@dataclass
class Workload:
    """Producers and a consumer in this process, recording the history."""

    history: History = field(default_factory=History)
    #: (send started, acknowledged) in monotonic seconds, per acknowledgement.
    acked_at: list[tuple[float, float]] = field(default_factory=list)
    failed: int = 0
    read_errors: int = 0
    #: Polls or commits of the consumer group's member that failed (retried).
    group_errors: int = 0
    #: Set to stop the producers; then `drain` lets the consumer stop once it has read
    #: past every acknowledged message.
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    drain: asyncio.Event = field(default_factory=asyncio.Event)
    _progress: asyncio.Event = field(default_factory=asyncio.Event)

    def _wake(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    async def send(self, producer: aio.Producer, queue: int) -> None:
        n = 0
        while not self.stop.is_set():
            value = b"q%d-%d" % (queue, n)
            n += 1
            self.history.attempted.add(value)
            started = time.monotonic()
            try:
                receipt = await producer.send(TOPIC, value, queue=queue)
            except TidemqError:
                self.failed += 1  # indeterminate: stored or not, either is right
                continue
            self.history.acked.append(Ack(receipt.queue, receipt.offset, value))
            self.acked_at.append((started, time.monotonic()))
            self._wake()

    async def read(self, consumer: aio.StreamConsumer[bytes]) -> None:
        consumer.assign([(TOPIC, q) for q in range(QUEUES)])
        for q in range(QUEUES):
            consumer.seek(TOPIC, q, 0)
        while not (self.drain.is_set() and self._all_read()):
            try:
                batch = await consumer.poll(200)
            except TidemqError:
                self.read_errors += 1
                continue
            self.history.reads += [Read(m.queue, m.offset, m.value or b"") for m in batch]
            if batch:
                self._wake()

    async def read_in_group(self, consumer: aio.GroupConsumer[bytes]) -> None:
        """A consumer group's one member: reads from the earliest offsets, commits after
        each poll, until the producers stop."""
        while not self.stop.is_set():
            try:
                batch = await consumer.poll(200)
                self.history.group_reads += [Read(m.queue, m.offset, m.value or b"") for m in batch]
                await consumer.commit()
            except TidemqError:
                self.group_errors += 1

    def _all_read(self) -> bool:
        last_acked = {a.queue: a.offset for a in self.history.acked}
        last_read = {r.queue: r.offset for r in self.history.reads}
        return all(last_read.get(q, -1) >= o for q, o in last_acked.items())

    async def wait_acks_after(self, t0: float, count: int) -> float:
        """Wait until `count` sends started after `t0` are acknowledged; the time the
        first of them was."""

        def after() -> list[float]:
            return [done for started, done in self.acked_at if started > t0]

        async with asyncio.timeout(LIMIT_S):
            while len(after()) < count:
                await self._progress.wait()
        return after()[0]


# ---------------------------------------------------------------------- faults


@dataclass
class Cycle:
    fault: str
    member: str
    #: From the fault (once struck) to the first acknowledgement of a send made after it.
    write_gap_s: float
    #: From the fault to etcd naming another leader (leader faults only).
    elected_s: float | None
    #: From the fault to every member back in the in-sync set.
    whole_s: float


@dataclass(frozen=True)
class Fault:
    #: Struck at the leader (else at a follower chosen at random).
    at_leader: bool
    #: Applies the fault to a member; `mend` undoes it (both may block: run off the loop).
    strike: Callable[[str], None]
    mend: Callable[[str], None]
    #: Nothing can be acknowledged while it lasts (etcd is down): it is mended once the
    #: leader has stopped serving, and writes resume under a new epoch after that.
    stalls_group: bool = False


@dataclass
class Nemesis:
    group: NetnsGroup
    leaders: LeaderHistory
    in_sync: InSyncHistory
    work: Workload

    def leader(self) -> str:
        record = self.leaders.leader
        assert record is not None, "no leader between cycles"
        return record.member

    def faults(self) -> dict[str, Fault]:
        group, net = self.group, self.group.net
        return {
            "partition-leader": Fault(at_leader=True, strike=net.partition, mend=net.heal),
            "pause-leader": Fault(at_leader=True, strike=group.pause, mend=group.resume),
            "kill-leader": Fault(at_leader=True, strike=group.kill, mend=group.start),
            "partition-follower": Fault(at_leader=False, strike=net.partition, mend=net.heal),
            "kill-follower": Fault(at_leader=False, strike=group.kill, mend=group.start),
            "cut-leader-from-etcd": Fault(
                at_leader=True, strike=group.cut_from_etcd, mend=group.join_etcd
            ),
            "pause-etcd": Fault(
                at_leader=True, strike=group.pause_etcd, mend=group.resume_etcd, stalls_group=True
            ),
            "kill-etcd": Fault(
                at_leader=True, strike=group.kill_etcd, mend=group.start_etcd, stalls_group=True
            ),
        }

    async def cycle(self, rng: random.Random) -> Cycle:
        """Strike one fault at random; it lasts until the group has acknowledged
        `PER_PHASE` sends made since (a leader fault: under a new leader); mend it; wait
        until every member is back in the in-sync set."""
        faults = self.faults()
        name = rng.choice(sorted(faults))
        fault = faults[name]
        leader = self.leader()
        member = leader if fault.at_leader else rng.choice([m for m in MEMBERS if m != leader])
        epoch = self.leaders.leader.epoch if self.leaders.leader is not None else 0
        await asyncio.to_thread(fault.strike, member)
        t0 = time.monotonic()
        elected = None
        if fault.stalls_group:
            await self._stopped_serving(member)
            await asyncio.to_thread(fault.mend, member)
            resumed = time.monotonic()
            await self.leaders.wait_leader(other_than="", timeout_s=LIMIT_S, after_epoch=epoch)
            elected = self.leaders.values[-1][2] - t0
            gap = await self.work.wait_acks_after(resumed, PER_PHASE) - t0
        else:
            since = t0
            if fault.at_leader:
                await self.leaders.wait_leader(other_than=member, timeout_s=LIMIT_S)
                since = self.leaders.values[-1][2]
                elected = since - t0
            # Sends made under the new leader: a leader cut off from etcd alone still
            # acknowledges until its lease ends, which must not end the fault.
            gap = await self.work.wait_acks_after(since, PER_PHASE) - t0
            await asyncio.to_thread(fault.mend, member)
        whole = await self.in_sync.wait_members(set(MEMBERS), LIMIT_S) - t0
        return Cycle(name, member, gap, elected, max(whole, 0.0))

    async def _stopped_serving(self, member: str) -> None:
        """Until `member`'s client port refuses connections: its broker stopped when its
        lease could not be renewed."""
        host, port = self.group.address(member).rsplit(":", 1)

        async def refused() -> bool:
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, int(port)), CONNECT_TIMEOUT_S
                )
            except (OSError, TimeoutError):
                return True
            writer.close()
            await writer.wait_closed()
            return False

        await poll_until(refused, timeout_s=LIMIT_S, what=f"{member} no longer serving")


# ---------------------------------------------------------------------- the test


def _seed(replay_seed: int | None) -> int:
    if replay_seed is not None:
        return replay_seed
    env = os.environ.get("TIDEMQ_PARTITION_SEED")
    return int(env) if env else random.randrange(1 << 32)


def _summary(cycles: list[Cycle], work: Workload, group: NetnsGroup, took_s: float) -> str:
    gaps = [c.write_gap_s for c in cycles]
    leader = [c.write_gap_s for c in cycles if c.elected_s is not None]
    elected = [c.elected_s for c in cycles if c.elected_s is not None]
    counts = {f: sum(c.fault == f for c in cycles) for f in sorted({c.fault for c in cycles})}
    median = statistics.median
    parts = [
        f"{len(cycles)} cycles in {took_s:.0f} s {counts}",
        f"acked {len(work.history.acked)}, failed sends {work.failed}, "
        f"read {len(work.history.reads)}, read in the group {len(work.history.group_reads)} "
        f"(group errors {work.group_errors}, {len(work.history.group_offsets)} offset samples)",
        f"write gap median {median(gaps):.2f} s max {max(gaps):.2f} s",
    ]
    if leader:
        parts.append(
            f"leader faults: elected median {median(elected):.2f} s, writes again median "
            f"{median(leader):.2f} s max {max(leader):.2f} s"
        )
    epochs = len({epoch for epoch, _ in work.history.leaders})
    parts.append(f"{epochs} epochs; suffixes cut {group.count_in_logs(b'log differs from leader')}")
    return "; ".join(parts)


async def _committed(admin: aio.Admin, group: NetnsGroup, leader: str) -> int:
    status = (await admin.broker_status(group.address(leader))).replication
    assert status is not None
    return status.committed


async def _settle(admin: aio.Admin, group: NetnsGroup, leader: str) -> None:
    """Wait until every follower holds the leader's whole log."""

    async def caught_up() -> bool:
        status = (await admin.broker_status(group.address(leader))).replication
        assert status is not None
        ends = {f.position for f in status.followers}
        return len(status.followers) == len(MEMBERS) - 1 and ends == {status.log_end}

    await poll_until(caught_up, timeout_s=LIMIT_S, what="every follower at the leader's end")


async def _sample(work: Workload, admin: aio.Admin, group: NetnsGroup, leader: str) -> None:
    """The replica group's committed position and the consumer group's offsets, now."""
    work.history.committed.append(await _committed(admin, group, leader))
    try:
        described = await admin.describe_group(CONSUMER_GROUP)
    except TidemqError:
        work.group_errors += 1  # one sample fewer: the check still holds on the others
        return
    work.history.group_offsets.append(
        {lag.queue: lag.committed for lag in described.offsets if lag.topic == TOPIC}
    )


@dataclass
class Clients:
    """The test's clients of the group, all through the name server."""

    admin: aio.Admin
    producer: aio.Producer
    consumer: aio.StreamConsumer[bytes]
    member: aio.GroupConsumer[bytes]

    @classmethod
    def open(cls, namesrv: str) -> Clients:
        return cls(
            aio.Admin(namesrv, client_config=CLIENT),
            aio.Producer(namesrv, client_config=CLIENT),
            aio.StreamConsumer(namesrv, client_config=CLIENT),
            aio.GroupConsumer(
                namesrv, CONSUMER_GROUP, [TOPIC], start="earliest", auto_commit=False,
                client_config=CLIENT,
            ),
        )  # fmt: skip

    def start(self, work: Workload) -> list[asyncio.Task[None]]:
        """The producers' tasks first (one per queue), then the readers'."""
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(work.send(self.producer, q)) for q in range(QUEUES)]
        tasks.append(loop.create_task(work.read_in_group(self.member)))
        tasks.append(loop.create_task(work.read(self.consumer)))
        return tasks

    async def close(self) -> None:
        await self.member.close()
        await self.consumer.close()
        await self.producer.close()
        await self.admin.close()


async def _cycles(
    nemesis: Nemesis, admin: aio.Admin, cycles: int, rng: random.Random
) -> tuple[list[Cycle], float]:
    """Run the cycles, sampling after each; the cycles, and how long they took."""
    done: list[Cycle] = []
    started = time.monotonic()
    for n in range(cycles):
        cycle = await nemesis.cycle(rng)
        done.append(cycle)
        await _sample(nemesis.work, admin, nemesis.group, nemesis.leader())
        elected = "" if cycle.elected_s is None else f", elected {cycle.elected_s:.2f} s"
        print(
            f"cycle {n}: {cycle.fault} {cycle.member}{elected}, writes again "
            f"{cycle.write_gap_s:.2f} s, whole {cycle.whole_s:.2f} s"
        )
    return done, time.monotonic() - started


async def _run(group: NetnsGroup, cycles: int, rng: random.Random) -> History:
    keys = GroupKeys(GROUP)
    etcd = EtcdClient([group.etcd])
    await etcd.connect()
    leaders, in_sync = LeaderHistory(etcd, keys), InSyncHistory(etcd, keys)
    leaders.start()
    in_sync.start()
    work = Workload()
    clients = Clients.open(group.namesrv)
    tasks: list[asyncio.Task[None]] = []
    try:
        for m in MEMBERS:
            await asyncio.to_thread(group.start, m)
        await in_sync.wait_members(set(MEMBERS), LIMIT_S)
        await clients.admin.create_topic(TOPIC, QUEUES)
        tasks = clients.start(work)
        await work.wait_acks_after(0.0, PER_PHASE)
        nemesis = Nemesis(group, leaders, in_sync, work)
        done, took = await _cycles(nemesis, clients.admin, cycles, rng)
        work.stop.set()
        async with asyncio.timeout(LIMIT_S):
            await asyncio.gather(*tasks[: QUEUES + 1])
            work.drain.set()
            await tasks[-1]
        work.history.reads_complete = True
        leader = nemesis.leader()
        await _settle(clients.admin, group, leader)
        await _sample(work, clients.admin, group, leader)
        # Who etcd granted each epoch; the members' own logs are added below.
        work.history.leaders = [
            (c.record.epoch, c.record.member) for c in leaders.changes() if c.record is not None
        ]
        print(_summary(done, work, group, took))
    finally:
        work.stop.set()
        work.drain.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await clients.close()
        await leaders.stop()
        await in_sync.stop()
        await etcd.close()
    followers_first = sorted(MEMBERS, key=lambda m: m == leader)
    for m in followers_first:
        await asyncio.to_thread(group.stop, m)
    history = work.history
    history.leaders += group.leaderships()
    for m in MEMBERS:
        history.replicas[m] = stored_messages(group.data_dir(m), TOPIC, QUEUES)
    return history


def test_every_acknowledged_message_survives_partitions_pauses_and_kills(
    loop: Loop, tmp_path: Path, soak: bool, replay_seed: int | None
) -> None:
    usable, why = netns.available()
    if not usable:
        pytest.skip(why)
    seed = _seed(replay_seed)
    cycles = int(os.environ.get("TIDEMQ_PARTITION_CYCLES", SOAK_CYCLES if soak else CYCLES))
    print(f"seed {seed} (replay: TIDEMQ_PARTITION_SEED={seed}), {cycles} cycles")
    with netns_group(tmp_path, MEMBERS) as group:
        group.settings = SETTINGS
        history = loop.run(_run(group, cycles, random.Random(seed)), timeout_s=LIMIT_S * cycles)
    found = violations(history)
    assert not found, f"seed {seed}:\n" + "\n".join(found)
    assert history.acked, "nothing was acknowledged"
