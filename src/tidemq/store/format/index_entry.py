"""Queue index entry: one per batch, fixed width, so lookups are a binary search.

Little-endian, 40 bytes::

    0               8         12        16              24               32
    +---------------+---------+---------+---------------+----------------+---------------+
    |log_position   |size     |count    |base_offset    |store_time_ms   |tag_summary    |
    |u64            |u32      |u32      |u64            |i64             |u64            |
    +---------------+---------+---------+---------------+----------------+---------------+

No checksum: index files are derived from the commit log and rebuilt past the checkpoint
after a crash. `store_time_ms` never decreases within a log, so time lookups are a binary
search too.
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np

__all__ = ["ENTRY", "ENTRY_DTYPE"]

ENTRY: Final = struct.Struct("<QIIQqQ")
assert ENTRY.size == 40
ENTRY_DTYPE: Final = np.dtype(
    [
        ("log_position", "<u8"),
        ("size", "<u4"),
        ("count", "<u4"),
        ("base_offset", "<u8"),
        ("store_time_ms", "<i8"),
        ("tag_summary", "<u8"),
    ]
)
assert ENTRY_DTYPE.itemsize == ENTRY.size
