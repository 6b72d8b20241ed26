"""glibc malloc thresholds for a process that moves large buffers: the server, every `tidemq`
command, and any client process that calls `tidemq.tune_malloc()` (a library does not
change its host process's allocator on its own).

Every produce request of a batch of 256 x 1 KiB and every fetch answer is a fresh buffer of
a few hundred KiB to a few MiB. glibc serves an allocation that large with mmap, or from the
top of the heap, which it trims back to the kernel as soon as that much is free; either way
the next request's buffer lands on new pages that the kernel must fault in and zero. In
the P2 benchmark (batches of 256 x 1 KiB) that was about 40% of the broker's system time:
page faults and zeroing under `memmove` (`perf record -e cpu-clock`), 400 -> 230 us of
system time per batch with the thresholds below. A client encoding batches of 256 x 1 KiB
spends 350 us per batch without them and 120 us with them, two thirds of it in page faults
(docs/design/performance.md).

Fixed thresholds (which also turn off glibc's own adjustment of them) keep buffers up to
`MMAP_THRESHOLD` in the heap and up to `TRIM_THRESHOLD` of free heap in the process,
so memory a request frees is reused by the next one. The cost is that much memory kept
after a burst, bounded. A process started with glibc's own MALLOC_MMAP_THRESHOLD_ or
MALLOC_TRIM_THRESHOLD_ in its environment keeps what those say.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
from typing import Final

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_malloc"]

log = logging.getLogger(__name__)

#: Allocations up to this size come from the heap, not from mmap (glibc's maximum is 32 MiB).
MMAP_THRESHOLD: Final = 16 << 20
#: Free memory at the top of the heap is returned to the kernel only beyond this.
TRIM_THRESHOLD: Final = 128 << 20

_M_TRIM_THRESHOLD: Final = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD: Final = -3
_ENV: Final = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def tune_malloc() -> bool:
    """Set the thresholds on glibc; True when they were set. Elsewhere (musl, macOS) or
    when the environment sets them already, nothing changes."""
    if platform.libc_ver()[0] != "glibc" or any(name in os.environ for name in _ENV):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not ok:
        log.debug("mallopt refused the thresholds; keeping glibc's defaults")
    return ok
