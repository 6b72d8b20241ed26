"""A `tidemq server` process a test kills (kill -9 cycles, disk-full runs): started on a
free port of 127.0.0.1 with sync flush, its stderr kept in `lines` by a thread (so it
never blocks on a full pipe, and a failing test can show the log), reaped at the end."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["KillableServer"]

_SERVING = re.compile(r"serving on (\S+:\d+)")
START_TIMEOUT_S = 60.0


class KillableServer:
    def __init__(self, data_dir: Path, *extra: str) -> None:
        """`extra`: more `tidemq server` arguments (`--set key=value` ...)."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tidemq.cli.main", "server", "--data-dir", str(data_dir),
             "--port", "0", "--flush", "sync", "--log-level", "warning", *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stderr is not None
        self.lines: list[str] = []
        self.address = ""
        self._drain: threading.Thread | None = None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline().decode(errors="replace")
            if not line:
                break
            self.lines.append(line)
            found = _SERVING.search(line)
            if found:
                self.address = found.group(1)
                self._drain = threading.Thread(target=self._read, daemon=True)
                self._drain.start()
                return
        self.reap()
        raise AssertionError(f"server did not start: {''.join(self.lines)}")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.lines.append(raw.decode(errors="replace"))

    def reap(self) -> int:
        """Kill the server if it still runs (SIGKILL); wait for it; close its pipe."""
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait(30)
        if self._drain is not None:
            self._drain.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code

    def stop(self) -> int:
        """SIGTERM (a clean stop), then `reap`; the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(20)
        return self.reap()
