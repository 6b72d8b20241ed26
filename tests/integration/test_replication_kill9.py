"""kill -9 of a replica group's leader, in cycles, with real processes: a name server,
three `tidemq broker --group g1 --etcd ...` members and a real etcd. Each cycle sends
messages, kills the member that leads (found in etcd), sends on until the group
acknowledges again under a new leader (the failover time), and starts the killed
member again on its data directory. At the end every acknowledged message is in the
group's topic exactly once, in per-queue send order, and a consumer group's offsets
committed before each kill are what the next leader answers.

`make test` runs 3 cycles; `make soak` (TIDEMQ_SOAK=1) runs 30. Each cycle prints its
failover time; the last line the median and the worst.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.integration.test_cli import ok
from tests.support.etcd_server import EtcdCluster, etcd_single
from tests.support.server_process import START_TIMEOUT_S, ServerProcess

import tidemq
from tidemq.client.cluster import ClientConfig
from tidemq.cluster.etcd_client import EtcdClient, EventKind, Get
from tidemq.cluster.group_keys import GroupKeys, decode_leader

__all__ = ["etcd_single"]  # a fixture, used by name below

GROUP = "g1"
MEMBERS = ("m0", "m1", "m2")
#: Messages sent before each kill and after each failover.
PER_PHASE = 40
#: The longest a failover may take here (lease 2 s, plus a loaded machine's slack).
FAILOVER_LIMIT_S = 30.0
FAST = ["--set", "broker.broker_heartbeat_interval_ms=200", "--set", "broker.broker_ttl_ms=1500"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(args: list[str], log: Path) -> ServerProcess:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidemq.cli.main", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    server = ServerProcess(proc, log)
    server.wait_serving(START_TIMEOUT_S)
    return server


class Members:
    def __init__(self, root: Path, etcd: list[str], namesrv: str) -> None:
        self.root, self.etcd, self.namesrv = root, etcd, namesrv
        self.ports = {m: _free_port() for m in MEMBERS}
        self.procs: dict[str, ServerProcess] = {}

    def start(self, member: str) -> None:
        args = ["broker", "--data-dir", str(self.root / member), "--port", str(self.ports[member])]
        args += ["--broker-name", member, "--namesrv", self.namesrv, "--group", GROUP]
        args += ["--etcd", ",".join(self.etcd), "--http-port", "-1", "--log-level", "info"]
        args += [*FAST, "--set", "replication.replica_lag_max_ms=3000"]
        self.procs[member] = _start(args, self.root / f"{member}.log")

    def kill(self, member: str) -> None:
        proc = self.procs.pop(member)
        os.kill(proc.pid, signal.SIGKILL)
        proc.proc.wait(timeout=10)
        proc.stop()  # reaps, closes the pipe

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.stop()
        self.procs.clear()


def _leader(etcd: list[str]) -> str:
    return _wait_leader(etcd, other_than=None)


def _wait_leader(etcd: list[str], *, other_than: str | None = "") -> str:
    """The member etcd names leader, once it is not `other_than` ("": any member; None:
    whatever is there now, "" for none). Woken by etcd's watch of the key, from the
    revision after the value read (a read-only transaction reports no revision: watching
    from it replayed the key's first change at once, again and again)."""

    async def wait() -> str:
        client = EtcdClient(etcd)
        await client.connect()
        keys = GroupKeys(GROUP)
        deadline = time.monotonic() + FAILOVER_LIMIT_S
        try:
            read = await client.txn(compare=[], success=[Get(keys.leader), Get(keys.epoch)])
            found, epoch = read.gets
            member = "" if found is None else decode_leader(keys.leader, found.value).member
            # No leader now: it was deleted after the epoch key was last written.
            seen = found or epoch
            start = 1 if seen is None else seen.mod_revision + 1
            while other_than is not None and not (member and member != other_than):
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    raise AssertionError(
                        f"no leader other than {other_than!r} within {FAILOVER_LIMIT_S} s"
                    )
                event = await client.watch_once(
                    keys.leader, start_revision=start, timeout_ms=left_ms
                )
                if event is not None:
                    start = event.kv.mod_revision + 1
                    deleted = event.kind is EventKind.DELETE
                    member = "" if deleted else decode_leader(keys.leader, event.kv.value).member
            return member
        finally:
            await client.close()

    return asyncio.run(wait())


def _read_all(bootstrap: str) -> dict[int, list[bytes]]:
    got: dict[int, list[bytes]] = {0: [], 1: []}
    with tidemq.StreamConsumer(bootstrap) as consumer:
        consumer.assign([("t", 0), ("t", 1)])
        consumer.seek_to_beginning()
        idle = 0
        while idle < 3:
            batch = consumer.poll(timeout_ms=500)
            idle = 0 if batch else idle + 1
            for m in batch:
                got[m.queue].append(m.value or b"")
    return got


def _sender(producer: tidemq.Producer, acked: dict[int, list[bytes]]) -> Callable[[int, str], None]:
    """send(n, tag): n messages over queues 0 and 1, each recorded once acknowledged."""

    def send(n: int, tag: str) -> None:
        for i in range(n):
            value = f"{tag}-{i}".encode()
            receipt = producer.send("t", value, queue=i % 2)
            acked[receipt.queue].append(value)

    return send


def _commit_latest(bootstrap: str) -> dict[tuple[str, int], int]:
    """Commit the group "readers" at the end of every queue of t; what was committed."""
    with tidemq.Admin(bootstrap) as admin:
        done = admin.reset_offsets("readers", "t", to="latest", execute=True)
    return {(o.topic, o.queue): o.offset for o in done}


def _committed(bootstrap: str) -> dict[tuple[str, int], int]:
    with tidemq.Admin(bootstrap) as admin:
        return {(o.topic, o.queue): o.committed for o in admin.describe_group("readers").offsets}


@pytest.fixture
def namesrv(tmp_path: Path) -> Iterator[str]:
    proc = _start(["namesrv", "--port", "0", "--log-level", "warning", *FAST], tmp_path / "ns.log")
    try:
        yield proc.address
    finally:
        proc.stop()


def test_every_acknowledged_message_survives_kill_9_of_the_leader(
    tmp_path: Path, etcd_single: EtcdCluster, namesrv: str, soak: bool
) -> None:
    etcd = etcd_single.endpoints
    members = Members(tmp_path, etcd, namesrv)
    cycles = 30 if soak else 3
    acked: dict[int, list[bytes]] = {0: [], 1: []}
    failovers: list[float] = []
    try:
        for m in MEMBERS:
            members.start(m)
        leader = _wait_leader(etcd)
        with tidemq.Admin(namesrv) as admin:
            admin.create_topic("t", 2)
        with tidemq.Producer(namesrv) as producer:
            send = _sender(producer, acked)

            send(PER_PHASE, "warm")
            for cycle in range(cycles):
                send(PER_PHASE, f"c{cycle}-before")
                committed = _commit_latest(namesrv)
                members.kill(leader)
                killed_at = time.monotonic()
                send(1, f"c{cycle}-first")  # retried until a new leader takes it
                failovers.append(time.monotonic() - killed_at)
                print(f"cycle {cycle}: killed {leader}, failover {failovers[-1]:.2f} s")
                # The group's offsets are in the log: the new leader has them, unchanged.
                assert _committed(namesrv) == committed, f"cycle {cycle}: offsets changed"
                new = _wait_leader(etcd, other_than=leader)
                members.start(leader)  # back on its data directory, as a follower
                leader = new
                send(PER_PHASE, f"c{cycle}-after")
        got = _read_all(namesrv)
        shown = ok("cluster", "status", "--bootstrap", namesrv).stdout
        assert re.search(rf"{leader} epoch \d+, committed \d+, in sync", shown), shown
    finally:
        members.stop_all()
    for q in (0, 1):
        assert len(set(got[q])) == len(got[q]), f"queue {q} holds a message twice"
        assert got[q] == acked[q], f"queue {q}: stored {len(got[q])}, acknowledged {len(acked[q])}"
    print(
        f"failover over {cycles} kill -9: median {statistics.median(failovers):.2f} s, "
        f"max {max(failovers):.2f} s"
    )
    assert max(failovers) < FAILOVER_LIMIT_S


def test_a_paused_leader_acknowledges_nothing_after_its_lease(
    tmp_path: Path, etcd_single: EtcdCluster, namesrv: str
) -> None:
    """SIGSTOP of the leader until another member leads, then SIGCONT: the old leader
    answers nothing it stored alone (its lease deadline passed while it was stopped),
    steps down, cuts what the group did not commit, and every acknowledged message is
    there once, in order."""
    etcd = etcd_single.endpoints
    members = Members(tmp_path, etcd, namesrv)
    acked: dict[int, list[bytes]] = {0: [], 1: []}
    quick = ClientConfig(request_timeout_ms=3_000)
    try:
        for m in MEMBERS:
            members.start(m)
        leader = _wait_leader(etcd)
        with tidemq.Admin(namesrv) as admin:
            admin.create_topic("t", 2)
        with tidemq.Producer(namesrv, client_config=quick) as producer:
            send = _sender(producer, acked)

            send(PER_PHASE, "before")
            paused = members.procs[leader]
            os.kill(paused.pid, signal.SIGSTOP)
            try:
                new = _wait_leader(etcd, other_than=leader)
                send(PER_PHASE, "during")  # at the new leader
            finally:
                os.kill(paused.pid, signal.SIGCONT)
            send(PER_PHASE, "after")
            assert _leader(etcd) == new
        got = _read_all(namesrv)
    finally:
        members.stop_all()
    for q in (0, 1):
        assert got[q] == acked[q], f"queue {q}: stored {len(got[q])}, acknowledged {len(acked[q])}"
