"""A replica group whose members are test hosts in network namespaces
(`tidemq.testing.netns`): a name server listens on the bridge's address in the root
namespace and etcd on its second one (`service_address`), each member (`tidemq broker
--group g1 --etcd ...`) runs in its own namespace on its own address, and the test's
clients reach them all through the bridge.

`NetnsGroup` starts, kills (SIGKILL), pauses (SIGSTOP), resumes and stops members by
PID, partitions or heals their hosts, cuts a member off from etcd alone (it still
reaches its peers, the name server and the clients), and pauses or kills etcd itself.
`KeyHistory` records every change of one etcd key from a watch (no polling): the test
waits on it for a new leader or a whole in-sync set, and checks the leader key's
history at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tests.integration.conftest import wait_until
from tests.support.etcd_server import EtcdCluster, EtcdMember, etcd_cluster
from tests.support.server_process import START_TIMEOUT_S, ServerProcess

from tidemq.cluster.etcd_client import EtcdClient, EventKind
from tidemq.cluster.group_keys import GroupKeys, LeaderRecord, decode_in_sync, decode_leader
from tidemq.core.errors import EtcdUnavailable
from tidemq.testing.netns import HostNetwork, host_network

__all__ = [
    "GROUP",
    "InSyncHistory",
    "KeyHistory",
    "LeaderChange",
    "LeaderHistory",
    "NetnsGroup",
    "netns_group",
    "poll_until",
]

GROUP: Final = "g1"
#: Every member listens on the same ports, each on its own address (own namespace).
CLIENT_PORT: Final = 10911
REPLICATION_PORT: Final = 10920
#: At least 32 bytes: members log in to each other and to the name server with it.
CLUSTER_SECRET: Final = "netns-partition-test-secret-0123456789"
#: Heartbeats to the name server every 200 ms, gone after 1.5 s of silence.
FAST: Final = ["--set", "broker.broker_heartbeat_interval_ms=200",
               "--set", "broker.broker_ttl_ms=1500"]  # fmt: skip
#: Longest one watch call waits before it is asked again (a bound, not a poll: it
#: returns at the first change).
_WATCH_MS: Final = 2_000
#: How long the watch goes on asking a silent etcd (paused by a fault) before the test
#: fails: each call is bounded by `_WATCH_MS` plus a request timeout, so this is no spin.
_WATCH_OUTAGE_S: Final = 60.0
_LEADS: Final = re.compile(rb"member (\S+) leads group \S+ under epoch (\d+)")


async def poll_until(
    check: Callable[[], Awaitable[bool]], *, timeout_s: float, what: str, interval_s: float = 0.1
) -> None:
    """Ask `check` (a remote status: no event to wait on) until it says yes; fail after
    `timeout_s` (the suite's one bounded poll, `wait_until`)."""
    await wait_until(check, timeout_s=timeout_s, interval_s=interval_s, what=what)


@dataclass(frozen=True)
class LeaderChange:
    """One change of the leader key: its new record (None: deleted), when it was seen."""

    revision: int
    record: LeaderRecord | None
    seen_s: float


class KeyHistory:
    """Every change of one etcd key, from revision 1 on, recorded by a background watch.
    `wait(predicate)` wakes at each change."""

    def __init__(self, client: EtcdClient, key: bytes) -> None:
        self._client, self._key = client, key
        #: (revision, value or None when deleted, monotonic time seen), oldest first.
        self.values: list[tuple[int, bytes | None, float]] = []
        #: What ended the watch: etcd failing for longer than `_WATCH_OUTAGE_S`.
        self.failure: EtcdUnavailable | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def latest(self) -> bytes | None:
        return self.values[-1][1] if self.values else None

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _run(self) -> None:
        revision = 1
        failing_since: float | None = None
        while True:
            try:
                event = await self._client.watch_once(
                    self._key, start_revision=revision, timeout_ms=_WATCH_MS
                )
            except EtcdUnavailable as exc:
                # A paused etcd: ask again from the same revision, so no change is missed.
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since > _WATCH_OUTAGE_S:
                    self.failure = exc
                    self._wake()
                    return
                continue
            failing_since = None
            if event is None:
                continue
            revision = event.kv.mod_revision + 1
            value = None if event.kind is EventKind.DELETE else event.kv.value
            self.values.append((event.kv.mod_revision, value, time.monotonic()))
            self._wake()

    async def wait(self, predicate: Callable[[bytes | None], bool], timeout_s: float) -> float:
        """Wait until the key's latest value satisfies `predicate`; when it was seen."""
        async with asyncio.timeout(timeout_s):
            while not (self.values and predicate(self.latest)):
                if self.failure is not None:
                    raise AssertionError(f"the watch of {self._key!r} failed: {self.failure}")
                await self._changed.wait()
        return self.values[-1][2]


class LeaderHistory(KeyHistory):
    def __init__(self, client: EtcdClient, keys: GroupKeys) -> None:
        super().__init__(client, keys.leader)
        self._keys = keys

    def record(self, value: bytes | None) -> LeaderRecord | None:
        return None if value is None else decode_leader(self._keys.leader, value)

    def changes(self) -> list[LeaderChange]:
        return [LeaderChange(rev, self.record(v), at) for rev, v, at in self.values]

    @property
    def leader(self) -> LeaderRecord | None:
        return self.record(self.latest)

    async def wait_leader(
        self, *, other_than: str, timeout_s: float, after_epoch: int = 0
    ) -> LeaderRecord:
        """The leader, once etcd names one other than `other_than` ("": any) under an
        epoch above `after_epoch`."""

        def ok(value: bytes | None) -> bool:
            found = self.record(value)
            return found is not None and found.member != other_than and found.epoch > after_epoch

        await self.wait(ok, timeout_s)
        found = self.leader
        assert found is not None
        return found


class InSyncHistory(KeyHistory):
    def __init__(self, client: EtcdClient, keys: GroupKeys) -> None:
        super().__init__(client, keys.in_sync)
        self._keys = keys

    async def wait_members(self, members: set[str], timeout_s: float) -> float:
        def ok(value: bytes | None) -> bool:
            return (
                value is not None
                and set(decode_in_sync(self._keys.in_sync, value).members) == members
            )

        return await self.wait(ok, timeout_s)


class NetnsGroup:
    """Members of group `GROUP` in the hosts of `net` (see the module's docstring)."""

    def __init__(self, net: HostNetwork, root: Path, etcd: EtcdMember, namesrv: str) -> None:
        self.net, self.root, self.namesrv = net, root, namesrv
        self.etcd_member = etcd
        self.etcd = etcd.endpoint
        self.members = net.hosts
        self.procs: dict[str, ServerProcess] = {}
        self.paused: set[str] = set()
        #: More `--set` settings for every member started from now on.
        self.settings: list[str] = []

    def address(self, member: str) -> str:
        return f"{self.net.address(member)}:{CLIENT_PORT}"

    def data_dir(self, member: str) -> Path:
        return self.root / member

    def log(self, member: str) -> Path:
        return self.root / f"{member}.log"

    def start(self, member: str) -> None:
        args = [sys.executable, "-m", "tidemq.cli.main", "broker",
                "--data-dir", str(self.data_dir(member)), "--broker-name", member,
                "--host", self.net.address(member), "--port", str(CLIENT_PORT),
                "--namesrv", self.namesrv, "--group", GROUP, "--etcd", self.etcd,
                "--http-port", "-1", "--log-level", "info", *FAST,
                "--set", f"replication.port={REPLICATION_PORT}", *self.settings]  # fmt: skip
        proc = self.net.popen(
            member,
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=os.environ | {"TIDEMQ_CLUSTER_SECRET": CLUSTER_SECRET},
        )
        server = ServerProcess(proc, self.log(member))
        self.procs[member] = server
        server.wait_serving(START_TIMEOUT_S)

    def kill(self, member: str) -> None:
        """SIGKILL, reaped: a crash."""
        server = self.procs.pop(member)
        self.paused.discard(member)
        os.kill(server.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
        server.stop()  # closes the pipe, joins the copier

    def pause(self, member: str) -> None:
        os.kill(self.procs[member].pid, signal.SIGSTOP)
        self.paused.add(member)

    def resume(self, member: str) -> None:
        os.kill(self.procs[member].pid, signal.SIGCONT)
        self.paused.discard(member)

    def cut_from_etcd(self, member: str) -> None:
        """The member's packets to etcd fail; it still reaches everything else."""
        self.net.cut(member, self.net.service_address)

    def join_etcd(self, member: str) -> None:
        self.net.mend(member, self.net.service_address)

    def pause_etcd(self, _member: str = "") -> None:
        """SIGSTOP etcd (no member can renew a lease or campaign until `resume_etcd`)."""
        self.etcd_member.pause()

    def resume_etcd(self, _member: str = "") -> None:
        self.etcd_member.resume()

    def kill_etcd(self, _member: str = "") -> None:
        """SIGKILL etcd (it keeps its data directory: `start_etcd` brings it back)."""
        self.etcd_member.kill()

    def start_etcd(self, _member: str = "") -> None:
        self.etcd_member.start()
        EtcdCluster([self.etcd_member]).wait_ready()

    def stop(self, member: str) -> None:
        """SIGTERM (a graceful stop; SIGKILL after a bound)."""
        if member in self.paused:
            self.resume(member)
        self.procs.pop(member).stop()

    def stop_all(self) -> None:
        for member in list(self.procs):
            self.stop(member)

    def leaderships(self) -> list[tuple[int, str]]:
        """(epoch, member) for every term a member began, from the members' logs."""
        out = []
        for member in self.members:
            path = self.log(member)
            text = path.read_bytes() if path.exists() else b""
            out += [(int(e), m.decode()) for m, e in _LEADS.findall(text)]
        return sorted(out)

    def count_in_logs(self, pattern: bytes) -> int:
        return sum(
            self.log(m).read_bytes().count(pattern) for m in self.members if self.log(m).exists()
        )


@contextlib.contextmanager
def netns_group(root: Path, members: tuple[str, ...]) -> Iterator[NetnsGroup]:
    """The network, etcd and a name server on its bridge, and a `NetnsGroup` with no
    member started yet; everything stopped, by PID, and removed when the block ends."""
    with (
        host_network(members) as net,
        etcd_cluster(root / "etcd", 1, host=net.service_address) as etcd,
    ):
        ns = subprocess.Popen(
            [sys.executable, "-m", "tidemq.cli.main", "namesrv", "--host", net.bridge_address,
             "--port", "0", "--log-level", "warning", *FAST],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=os.environ | {"TIDEMQ_CLUSTER_SECRET": CLUSTER_SECRET},
        )  # fmt: skip
        namesrv = ServerProcess(ns, root / "namesrv.log")
        group = NetnsGroup(net, root, etcd.members[0], "")
        try:
            group.namesrv = namesrv.wait_serving(START_TIMEOUT_S)
            yield group
        finally:
            for member in list(group.procs):
                with contextlib.suppress(Exception):
                    group.kill(member)
            namesrv.stop()
