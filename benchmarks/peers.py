"""Start and stop the servers bench_broker.py measures: tidemq, Redis and NATS.

Every server listens on 127.0.0.1 only, keeps its files in a temporary directory of its
own (removed when it stops), runs in its own session (so a Ctrl+C in the terminal reaches
only the benchmark, which then stops each server by its PID), and is stopped in a
`finally`: `Server` is a context manager, and `stop_all()` runs at exit for anything a
crash left behind.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "PeerMissing",
    "Server",
    "free_port",
    "machine_jiffies",
    "nats_available",
    "process_cpu",
    "redis_available",
    "redis_benchmark_binary",
    "start_echo",
    "start_nats",
    "start_redis",
    "start_tidemq",
    "stop_all",
    "versions",
]

VENV_BIN = Path(sys.executable).parent
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0

_RUNNING: list[Server] = []


class PeerMissing(RuntimeError):
    """A peer's server binary or Python client is not installed."""


class Jiffies(NamedTuple):
    """CPU time of the whole machine, every tenant, from /proc/stat (jiffies)."""

    busy: int
    iowait: int
    steal: int  # given by the hypervisor to other guests
    total: int

    def __sub__(self, earlier: tuple[int, ...]) -> Jiffies:
        return Jiffies(*(a - b for a, b in zip(self, earlier, strict=True)))


def machine_jiffies() -> Jiffies:
    """Now; all zeros where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return Jiffies(0, 0, 0, 0)
    fields += [0] * (8 - len(fields))
    idle, iowait, steal = fields[3], fields[4], fields[7]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return Jiffies(total - idle - iowait, iowait, steal, total)


def process_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds a process has used (/proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def free_port() -> int:
    """A port the kernel has just handed out on 127.0.0.1 (free unless someone races us)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """One server process with its own temporary directory; stops by its PID."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        directory: Path,
        *,
        ready: re.Pattern[str] | None,
        address: str | None = None,
        cpus: Sequence[int] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.directory = directory
        self.address = address or ""
        self._ready = ready
        self._cpus = cpus
        self._lines: deque[str] = deque(maxlen=200)
        self._seen = threading.Condition()
        self.proc: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, probe: tuple[str, int] | None = None) -> Server:
        """Start the process; wait for its `ready` line on stderr/stdout, or until `probe`
        (host, port) accepts a TCP connection."""
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=self.directory,
            start_new_session=True,  # Ctrl+C reaches the benchmark, which stops us by PID
        )
        _RUNNING.append(self)
        if self._cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.proc.pid, self._cpus)
        threading.Thread(target=self._drain, name=f"{self.name}-output", daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            if self._ready is not None:
                self._wait_line(self._ready, deadline)
            if probe is not None:
                _wait_port(probe, deadline, self.proc)
        except BaseException:
            self.stop()
            raise
        return self

    def _drain(self) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._seen:
                self._lines.append(line.rstrip("\n"))
                self._seen.notify_all()

    def _wait_line(self, pattern: re.Pattern[str], deadline: float) -> None:
        assert self.proc is not None
        with self._seen:
            while True:
                for line in self._lines:
                    m = pattern.search(line)
                    if m:
                        if m.groupdict().get("address"):
                            self.address = m.group("address")
                        return
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited at start: {self.output()}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{self.name} not ready in time: {self.output()}")
                self._seen.wait(min(remaining, 0.2))

    def output(self) -> str:
        return " | ".join(list(self._lines)[-10:])

    @property
    def http_address(self) -> str:
        """A tidemq server's HTTP listener ("http on HOST:PORT"; "" without one)."""
        with self._seen:
            for line in self._lines:
                m = re.search(r"http on (\S+)", line)
                if m:
                    return m.group(1)
        return ""

    def stop(self) -> None:
        """SIGTERM to our PID (then SIGKILL after a timeout); remove the directory."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(STOP_TIMEOUT_S)
            if proc.stdout is not None:
                with contextlib.suppress(OSError):
                    proc.stdout.close()
        if self in _RUNNING:
            _RUNNING.remove(self)
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_port(probe: tuple[str, int], deadline: float, proc: subprocess.Popen[str]) -> None:
    while True:
        try:
            with socket.create_connection(probe, timeout=0.5):
                return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited at start (status {proc.returncode})") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on {probe[0]}:{probe[1]}") from None
            time.sleep(0.05)


def stop_all() -> None:
    for server in list(_RUNNING):
        server.stop()


atexit.register(stop_all)


def _tempdir(name: str, root: Path | None) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"bench-{name}-", dir=root))


# --------------------------------------------------------------------------- tidemq


def start_tidemq(
    flush: str,
    *,
    root: Path | None = None,
    cpus: Sequence[int] | None = None,
    extra: Sequence[str] = (),
) -> Server:
    """`tidemq server` (broker + name server in one process) on a free port."""
    directory = _tempdir(f"tidemq-{flush}", root)
    exe = VENV_BIN / "tidemq"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "tidemq.cli.main"]
    argv += [
        "server",
        "--http-port",
        "-1",  # no HTTP listener: the benchmarks measure the broker
        "--data-dir",
        str(directory / "data"),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--flush",
        flush,
        "--log-level",
        "warning",
        *extra,
    ]
    ready = re.compile(r"serving on (?P<address>\S+)")
    return Server(f"tidemq-{flush}", argv, directory, ready=ready, cpus=cpus).start()


# --------------------------------------------------------------------------- redis


def redis_available() -> str | None:
    """None when redis-server and redis-py are installed, else what is missing."""
    if shutil.which("redis-server") is None:
        return "redis-server binary"
    if importlib.util.find_spec("redis") is None:
        return "redis (redis-py)"
    return None


def redis_benchmark_binary() -> str | None:
    return shutil.which("redis-benchmark")


def start_redis(
    *, appendonly: bool, root: Path | None = None, cpus: Sequence[int] | None = None
) -> Server:
    """redis-server on a free port; AOF with appendfsync everysec, or no persistence.
    RDB snapshots are off in both (`save ""`): a fork in the middle of a run is noise."""
    missing = redis_available()
    if missing:
        raise PeerMissing(missing)
    name = "redis-aof" if appendonly else "redis-nopersist"
    directory = _tempdir(name, root)
    port = free_port()
    argv = [
        shutil.which("redis-server") or "redis-server",
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--protected-mode",
        "yes",
        "--dir",
        str(directory),
        "--save",
        "",
        "--appendonly",
        "yes" if appendonly else "no",
        "--appendfsync",
        "everysec",
        "--daemonize",
        "no",
        "--logfile",
        "",
        "--loglevel",
        "warning",
    ]
    server = Server(name, argv, directory, ready=None, address=f"127.0.0.1:{port}", cpus=cpus)
    return server.start(probe=("127.0.0.1", port))


# --------------------------------------------------------------------------- nats


def nats_available() -> str | None:
    if shutil.which("nats-server") is None:
        return "nats-server binary"
    if importlib.util.find_spec("nats") is None:
        return "nats (nats-py)"
    return None


def start_nats(*, root: Path | None = None, cpus: Sequence[int] | None = None) -> Server:
    """nats-server with JetStream on a free port; file storage in its own directory."""
    missing = nats_available()
    if missing:
        raise PeerMissing(missing)
    directory = _tempdir("nats", root)
    port = free_port()
    argv = [
        shutil.which("nats-server") or "nats-server",
        "--addr",
        "127.0.0.1",
        "--port",
        str(port),
        "--jetstream",
        "--store_dir",
        str(directory),
    ]
    ready = re.compile(r"Server is ready")
    server = Server("nats", argv, directory, ready=ready, address=f"127.0.0.1:{port}", cpus=cpus)
    return server.start(probe=("127.0.0.1", port))


# --------------------------------------------------------------------------- echo floor

_ECHO_SERVER = """
import os, socket, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if sys.argv[1:] else -1
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(8)
print("serving on 127.0.0.1:%d" % s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with c:
        while d := c.recv(65536):
            if fd >= 0:
                os.write(fd, d)
                os.fdatasync(fd)
            c.sendall(d)
"""


def start_echo(*, fsync: bool = False, root: Path | None = None) -> Server:
    """A Python echo server (blocking sockets, TCP_NODELAY, one connection at a time) on a
    free port: the floor under one message per round trip. With `fsync`, it appends each
    message it receives to a file in its directory and fdatasyncs before answering (the
    floor under one durable message per round trip)."""
    name = "echo-fdatasync" if fsync else "echo"
    directory = _tempdir(name, root)
    argv = [sys.executable, "-c", _ECHO_SERVER]
    if fsync:
        argv.append(str(directory / "log"))
    ready = re.compile(r"serving on (?P<address>\S+)")
    return Server(name, argv, directory, ready=ready).start()


# --------------------------------------------------------------------------- versions


def _run(argv: Sequence[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""


def _module_version(name: str) -> str | None:
    if importlib.util.find_spec(name) is None:
        return None
    try:
        from importlib.metadata import version  # noqa: PLC0415

        dist = {"nats": "nats-py"}.get(name, name)
        return version(dist)
    except Exception:  # a version string is nice to have, never required
        return "unknown"


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {}
    if shutil.which("redis-server"):
        m = re.search(r"v=(\S+)", _run(["redis-server", "--version"]))
        out["redis_server"] = m.group(1) if m else "unknown"
    if shutil.which("redis-benchmark"):
        out["redis_benchmark"] = shutil.which("redis-benchmark")
    if shutil.which("nats-server"):
        out["nats_server"] = _run(["nats-server", "--version"]).replace("nats-server: ", "")
    for module in ("redis", "hiredis", "nats", "uvloop"):
        out[f"py_{module}"] = _module_version(module)
    return out
