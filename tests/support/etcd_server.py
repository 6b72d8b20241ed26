"""Real etcd processes for tests: Debian's `etcd` binary (`make etcd` installs it), one
member or a cluster of three, each on free client and peer ports of 127.0.0.1 with its data
in a temporary directory, stopped by PID at the end. `etcd_cluster(..., host=ADDRESS)` listens
on another local address instead (a test network's bridge, `tidemq.testing.netns`).

Readiness is a bounded poll of the member's `/health` endpoint (every `READY_POLL_S`, for at
most `START_TIMEOUT_S`), never a fixed sleep. For fault tests a member can be killed
(SIGKILL), paused (SIGSTOP), resumed (SIGCONT) and started again on the same ports and data
directory. Each member's output goes to `<data dir>.log`, shown when a start fails.

Ports are taken by binding port 0 and closing the socket; another process may take one in
between, so a member that exits during its start is tried again on new ports (at most
`START_ATTEMPTS` times) while it has never run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = [
    "EtcdCluster",
    "EtcdMember",
    "etcd_binary",
    "etcd_cluster",
    "etcd_cluster3",
    "etcd_single",
]

#: The longest a member (or a cluster's quorum) may take to answer healthy on a loaded
#: two-core machine; etcd itself starts in well under a second.
START_TIMEOUT_S = 30.0
#: Between two polls of /health while waiting for a start.
READY_POLL_S = 0.05
#: The longest one /health request may take.
HEALTH_REQUEST_TIMEOUT_S = 1.0
#: The longest a stopped member may take to exit after SIGTERM before it is killed.
STOP_TIMEOUT_S = 10.0
#: Starts tried on fresh ports when a member exits at once (its port was taken meanwhile).
START_ATTEMPTS = 3


def etcd_binary() -> str:
    """The etcd binary's path, or skip the test with how to get it."""
    path = shutil.which("etcd")
    if path is None:
        pytest.skip("the etcd binary is not installed: run `make etcd` (Debian's etcd-server)")
    return path


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class EtcdMember:
    """One etcd member process. `start()` runs it; the ports and data directory stay the
    same across restarts, so a restarted member rejoins with its data."""

    name: str
    data_dir: Path
    #: The local address it listens on (clients and peers).
    host: str = "127.0.0.1"
    #: 0: a free port of `host`, chosen at creation.
    client_port: int = 0
    peer_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    #: The `--initial-cluster` value (every member's name=peer URL).
    initial_cluster: str = ""

    def __post_init__(self) -> None:
        self.client_port = self.client_port or _free_port(self.host)
        self.peer_port = self.peer_port or _free_port(self.host)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def log(self) -> Path:
        return self.data_dir.with_suffix(".log")

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"etcd member {self.name} was never started"
        return self.proc.pid

    def start(self) -> None:
        """Run the member (again). Returns at once; `wait_ready` waits for it."""
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} still runs"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [etcd_binary(), "--name", self.name, "--data-dir", str(self.data_dir),
                 "--listen-client-urls", self.endpoint,
                 "--advertise-client-urls", self.endpoint,
                 "--listen-peer-urls", self.peer_url,
                 "--initial-advertise-peer-urls", self.peer_url,
                 "--initial-cluster", self.initial_cluster or f"{self.name}={self.peer_url}",
                 "--initial-cluster-state", "new",
                 "--initial-cluster-token", f"tidemq-test-{os.getpid()}",
                 "--log-level", "warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        """One bounded /health request: true when the member answers and has a quorum."""
        try:
            with urllib.request.urlopen(
                f"{self.endpoint}/health", timeout=HEALTH_REQUEST_TIMEOUT_S
            ) as answer:
                body = json.loads(answer.read())
        except (OSError, urllib.error.URLError, ValueError):
            return False
        return bool(body.get("health") == "true")

    def kill(self) -> None:
        """SIGKILL and reap: a crash, nothing flushed by etcd on the way out."""
        if self.running():
            assert self.proc is not None
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(STOP_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after `STOP_TIMEOUT_S`; reaped either way."""
        if self.running():
            assert self.proc is not None
            self.resume()  # a stopped process does not act on SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()

    def pause(self) -> None:
        """SIGSTOP: the member stops answering but keeps its sockets (a stall)."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after `pause`."""
        os.kill(self.pid, signal.SIGCONT)

    def log_tail(self, size_bytes: int = 4_000) -> str:
        if not self.log.exists():
            return ""
        return self.log.read_bytes()[-size_bytes:].decode(errors="replace")


@dataclass
class EtcdCluster:
    """One or more members forming one etcd cluster."""

    members: list[EtcdMember]

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Poll until every running member answers healthy; fail the test after
        `timeout_s`, with the members' logs."""
        deadline = time.monotonic() + timeout_s
        pending = [m for m in self.members if m.running()]
        while pending:
            pending = [m for m in pending if not m.healthy()]
            exited = [m for m in pending if not m.running()]
            if exited or (pending and time.monotonic() > deadline):
                logs = "\n".join(f"--- {m.name}:\n{m.log_tail()}" for m in pending)
                what = "exited" if exited else f"not healthy after {timeout_s} s"
                raise EtcdStartError(f"etcd {what}:\n{logs}", exited=bool(exited))
            if pending:
                time.sleep(READY_POLL_S)

    def stop(self) -> None:
        for member in self.members:
            member.stop()


class EtcdStartError(Exception):
    """A member exited during its start (`exited`), or never became healthy."""

    def __init__(self, message: str, *, exited: bool) -> None:
        super().__init__(message)
        self.exited = exited


def _new_cluster(root: Path, size: int, attempt: int, host: str) -> EtcdCluster:
    members = [
        EtcdMember(name=f"etcd{i}", data_dir=root / f"etcd{i}-try{attempt}", host=host)
        for i in range(size)
    ]
    initial = ",".join(f"{m.name}={m.peer_url}" for m in members)
    for member in members:
        member.initial_cluster = initial
    return EtcdCluster(members)


@contextlib.contextmanager
def etcd_cluster(root: Path, size: int = 1, *, host: str = "127.0.0.1") -> Iterator[EtcdCluster]:
    """`size` members (1 or 3) under `root`, listening on `host`, healthy when the block
    starts, stopped when it ends."""
    assert size in (1, 3), "an etcd cluster here has one member or three"
    etcd_binary()
    root.mkdir(parents=True, exist_ok=True)
    cluster: EtcdCluster | None = None
    for attempt in range(START_ATTEMPTS):
        cluster = _new_cluster(root, size, attempt, host)
        for member in cluster.members:
            member.start()
        try:
            cluster.wait_ready()
            break
        except EtcdStartError as error:
            cluster.stop()
            if attempt == START_ATTEMPTS - 1 or not error.exited:
                raise
    assert cluster is not None
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def etcd_single(tmp_path: Path) -> Iterator[EtcdCluster]:
    """One etcd member on free ports of 127.0.0.1, data in `tmp_path`."""
    with etcd_cluster(tmp_path, 1) as cluster:
        yield cluster


@pytest.fixture
def etcd_cluster3(tmp_path: Path) -> Iterator[EtcdCluster]:
    """Three etcd members forming one cluster on free ports of 127.0.0.1."""
    with etcd_cluster(tmp_path, 3) as cluster:
        yield cluster
