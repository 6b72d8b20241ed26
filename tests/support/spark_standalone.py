"""A Spark standalone cluster for tests: a master and one worker started from the pyspark
package (`bin/spark-class`), on free ports of 127.0.0.1, stopped by their PIDs at the end.

Each process's output is copied by a thread to a log file, and the start waits (with a
deadline) for the line that says it is up: the master's "Starting Spark master at
spark://...", the worker's "Successfully registered with master". No sleep.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyspark

__all__ = ["StandaloneCluster", "standalone_cluster"]

#: The longest a master or worker JVM may take to come up on a loaded machine.
START_TIMEOUT_S = 90.0
_MASTER_UP = re.compile(rb"Starting Spark master at (spark://\S+)")
_WORKER_UP = re.compile(rb"Successfully registered with master")


@dataclass(frozen=True)
class StandaloneCluster:
    #: `spark://127.0.0.1:PORT`
    master: str
    #: Where the worker runs executors (their logs are under `app-*/`).
    work_dir: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _Process:
    def __init__(self, argv: list[str], log: Path, ready: re.Pattern[bytes]) -> None:
        env = {
            **os.environ,
            "SPARK_HOME": str(Path(pyspark.__file__).parent),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_NO_DAEMONIZE": "1",
        }
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: stopped with its children
        )
        self.log = log
        self.found: bytes | None = None
        self._ready = ready
        self._up = threading.Event()
        self._copier = threading.Thread(target=self._copy, daemon=True)
        self._copier.start()

    def _copy(self) -> None:
        assert self.proc.stdout is not None
        with self.log.open("ab") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                match = self._ready.search(line)
                if match and not self._up.is_set():
                    self.found = match.group(match.lastindex or 0)
                    self._up.set()
        self._up.set()  # ended: wake the waiter

    def wait_up(self) -> bytes:
        if not self._up.wait(START_TIMEOUT_S) or self.found is None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.log.name}: not up in {START_TIMEOUT_S:.0f} s:\n{tail}")
        return self.found

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._copier.join(10)  # it ends at the pipe's end
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@contextlib.contextmanager
def standalone_cluster(
    tmp: Path, *, cores: int = 2, memory: str = "1g"
) -> Iterator[StandaloneCluster]:
    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    started: list[_Process] = []
    try:
        master = _Process(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(_free_port()), "--webui-port", str(_free_port())],
            tmp / "spark-master.log",
            _MASTER_UP,
        )  # fmt: skip
        started.append(master)
        url = master.wait_up().decode()
        work = tmp / "spark-work"
        work.mkdir()
        worker = _Process(
            [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
             "--cores", str(cores), "--memory", memory, "--webui-port", str(_free_port()),
             "--work-dir", str(work), url],
            tmp / "spark-worker.log",
            _WORKER_UP,
        )  # fmt: skip
        started.append(worker)
        worker.wait_up()
        yield StandaloneCluster(url, work)
    finally:
        for p in reversed(started):
            p.stop()
