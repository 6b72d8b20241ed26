"""A `tidemq` server process for tests: started on a free port of 127.0.0.1, ready once it
printed `serving on HOST:PORT`, stopped (and killed if need be) at the end.

Its stderr is copied by a thread to `log` (a file the test may read, for example to count
log lines), and the start waits on that thread's event, with a deadline, instead of
polling the file: no sleep, and the process never blocks on a full pipe.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

__all__ = ["ServerProcess", "server_process"]

_SERVING = re.compile(rb"^serving on (\S+:\d+)$")
#: Printed before "serving on" by a broker with an HTTP listener.
_HTTP = re.compile(rb"^http on (\S+:\d+)$")
#: The longest a server may take to print that it is serving, on a loaded machine.
START_TIMEOUT_S = 30.0
#: The longest a stopped server may take to exit before it is killed.
STOP_TIMEOUT_S = 15.0


class ServerProcess:
    """A running `tidemq <command>` (see the module's docstring)."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log
        self.address = ""
        #: The HTTP listener's host:port ("" without one).
        self.http_address = ""
        self._serving = threading.Event()
        self._copier = threading.Thread(target=self._copy, daemon=True)
        self._copier.start()

    def _copy(self) -> None:
        assert self.proc.stderr is not None
        with self.log.open("ab") as out:
            for line in self.proc.stderr:
                out.write(line)
                out.flush()
                http = _HTTP.match(line.strip())
                if http:
                    self.http_address = http.group(1).decode()
                found = _SERVING.match(line.strip())
                if found and not self._serving.is_set():
                    self.address = found.group(1).decode()
                    self._serving.set()
        self._serving.set()  # the process ended: wake the waiter either way

    def wait_serving(self, timeout_s: float) -> str:
        if not self._serving.wait(timeout_s) or not self.address:
            self.stop()
            pytest.fail(f"tidemq did not start: {self.log.read_text(errors='replace')}")
        return self.address

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        self._copier.join(STOP_TIMEOUT_S)
        if self._copier.is_alive():
            # Another process holds the pipe open: a child the process left behind.
            # Closing it would wait for the copier's read for ever.
            raise AssertionError(
                f"process {self.proc.pid} exited, but its stderr is still open in another "
                "process (a child left running?)"
            )
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@contextlib.contextmanager
def server_process(
    cwd: Path,
    args: Sequence[str] = (),
    *,
    command: str = "server",
    log_name: str = "server.log",
    start_timeout_s: float = START_TIMEOUT_S,
    data_dir: str | None = "data",
) -> Iterator[ServerProcess]:
    """`tidemq <command> --data-dir DATA_DIR --port 0 --log-level warning ARGS` run in
    `cwd` (no --data-dir when `data_dir` is None: `tidemq namesrv`), serving when the
    block starts, stopped when it ends."""
    data = [] if data_dir is None else ["--data-dir", data_dir]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidemq.cli.main", command, *data,
         "--port", "0", "--log-level", "warning", *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd,
    )  # fmt: skip
    server = ServerProcess(proc, cwd / log_name)
    try:
        server.wait_serving(start_timeout_s)
        yield server
    finally:
        server.stop()
