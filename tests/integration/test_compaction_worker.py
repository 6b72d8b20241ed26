"""A broker killed with `kill -9` takes its compaction worker process with it. The worker
used to live on as an orphan: waiting for work for ever, holding the broker's stderr
open (a test reading it hung), and free to go on writing a run's file into a data
directory that a new broker had opened meanwhile."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.integration.conftest import wait_until
from tests.support.server_process import server_process

from tidemq import Admin, Producer

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

pytestmark = pytest.mark.timeout(120)


def _children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its ")".
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie is dead, waiting for its parent to reap it


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads processes from /proc")
def test_the_compaction_worker_dies_with_a_killed_broker(loop: Loop, tmp_path: Path) -> None:
    with server_process(tmp_path) as server:
        before = _children(server.pid)
        with Admin(server.address) as admin, Producer(server.address) as producer:
            admin.create_topic("state", 1, config={"cleanup.policy": "compact"})
            for i in range(200):
                producer.send("state", b"v%d" % i, key=b"k%d" % (i % 10), queue=0)
            producer.flush()
            admin.compact("state")  # runs in the worker process, which stays for the next
        workers = _children(server.pid) - before
        assert workers, "no worker process was started for the compaction"
        os.kill(server.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
        loop.run(wait_until(lambda: not any(_alive(w) for w in workers), what="the workers gone"))
