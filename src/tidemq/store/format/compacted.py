"""The compacted log of one queue: what compaction kept of the queue's older offsets.

A compact topic's queue reads offsets below `end_offset` from this file and the rest from
the commit log. Compaction writes a whole new file (the next generation) and switches to
it in one metadata transaction, so a file is never changed once named. Little-endian::

    <queue dir>/compacted/<generation, 20 digits>.clog

    0                 records: commit-log records (`core/record.py`) with the COMPACTED flag
                      and version-2 batch payloads (per-message offset deltas), back to back
    entries_position  entries: one per record, in offset order (`ENTRY`, 64 bytes)
    keys_position     key index: (key_hash u64, offset u64) per kept message, sorted by hash
                      then offset (`KEY`, 16 bytes); key_hash is `key_hash(key)`
    end - 48          footer (`FOOTER`, 48 bytes)

Entry::

    0          8      12      16           24          32             40           48
    +----------+------+-------+------------+-----------+--------------+------------+
    |position  |size  |count  |base_offset |end_offset |store_time_ms |tag_summary |
    |u64       |u32   |u32    |u64         |u64        |i64           |u64         |
    +----------+------+-------+------------+-----------+--------------+------------+
    48           56           60       64
    +------------+------------+--------+
    |cleaned_ms  |tombstones  |rsvd    |
    |i64         |u32         |u32     |
    +------------+------------+--------+

`end_offset` is one past the record's last message; `cleaned_ms` is when compaction first
reached the record's tombstones (a tombstone stays `delete.retention.ms` after that);
`tombstones` counts its null values.

Footer::

    0      4        6      8      12           16          24                 32
    +------+--------+------+------+------------+-----------+------------------+
    |magic |version |rsvd  |crc32c|entry_count |generation |entries_position  |
    |"TQCL"|u16 = 1 |u16   |u32   |u32         |u64        |u64               |
    +------+--------+------+------+------------+-----------+------------------+
    32             40
    +--------------+------------+
    |keys_position |end_offset  |
    |u64           |u64         |
    +--------------+------------+

`crc32c` covers the entries, the key index and the footer's bytes other than itself. The
records carry their own CRCs (header and batch), checked when read.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Final

import numpy as np

__all__ = ["ENTRY", "ENTRY_DTYPE", "FOOTER", "KEY_DTYPE", "MAGIC", "SUFFIX", "VERSION", "key_hash"]

MAGIC: Final = b"TQCL"
VERSION: Final = 1
SUFFIX: Final = ".clog"

ENTRY: Final = struct.Struct("<QIIQQqQqII")
assert ENTRY.size == 64
ENTRY_DTYPE: Final = np.dtype(
    [
        ("position", "<u8"),
        ("size", "<u4"),
        ("count", "<u4"),
        ("base_offset", "<u8"),
        ("end_offset", "<u8"),
        ("store_time_ms", "<i8"),
        ("tag_summary", "<u8"),
        ("cleaned_ms", "<i8"),
        ("tombstones", "<u4"),
        ("reserved", "<u4"),
    ]
)
assert ENTRY_DTYPE.itemsize == ENTRY.size

KEY_DTYPE: Final = np.dtype([("hash", "<u8"), ("offset", "<u8")])
assert KEY_DTYPE.itemsize == 16

FOOTER: Final = struct.Struct("<4sHHIIQQQQ")
assert FOOTER.size == 48
#: Footer bytes not covered by the CRC: the CRC itself.
CRC_SLICE: Final = slice(8, 12)


def key_hash(key: bytes) -> int:
    """The 64-bit hash the key index sorts by (collisions are resolved by reading the
    message and comparing its key)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
