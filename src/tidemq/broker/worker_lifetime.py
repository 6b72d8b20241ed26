"""Worker processes that die with the broker that started them.

A broker killed with SIGKILL runs no clean-up: a compaction worker it started
(`compaction_runner.py`) was left running, an orphan waiting for work for ever, holding
the broker's stderr and whatever its run had open, and a run in progress went on writing
into a data directory that a new broker may already have opened. Linux sends a process
a signal of its choosing when its parent dies (`prctl(PR_SET_PDEATHSIG)`); each worker
asks for SIGKILL as it starts. Elsewhere the call is not available and workers outlive
a killed broker as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
from typing import Final

__all__ = ["die_with_parent"]

log = logging.getLogger(__name__)

#: From <linux/prctl.h>.
_PR_SET_PDEATHSIG: Final = 1


def die_with_parent(parent_pid: int) -> None:
    """A worker's initializer: SIGKILL this process when its parent dies. `parent_pid`:
    the parent as it started the worker; if it died before the request took effect
    (the worker now belongs to another process), exit at once."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(ctypes.get_errno()))
        return
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent is gone already: no signal will come
