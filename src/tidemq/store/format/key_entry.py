"""The key index's files: entries naming where each message key is (`store/key_index.py`).

One entry per (message, key): a message's `key` and each of its `keys` (a key equal to
one of its `keys` once). Little-endian, 40 bytes::

    0           8          16              24               32          36         40
    +-----------+----------+---------------+----------------+-----------+----------+
    |key_hash   |offset    |log_position   |store_time_ms   |topic_id   |queue_id  |
    |8 bytes    |u64       |u64            |i64             |u32        |u32       |
    +-----------+----------+---------------+----------------+-----------+----------+

* ``key_hash``: the first 8 bytes of BLAKE2b(key), the compacted logs' `key_hash` (read
  as a little-endian u64). A `keys` entry (UTF-8 text) hashes its UTF-8 bytes, so a key
  given as bytes or as text finds both. The topic is not hashed: ``topic_id`` is in the
  entry, and ids are never reused, so a deleted topic's entries match no live topic.
* ``offset``: the message's own queue offset (a batch's message i is at base + i).
* ``log_position``: where the message's commit-log record starts: recovery cuts entries
  at the replay position by it, and retention drops files whose records are all gone.
* ``store_time_ms``: the record's store time (the broker's clock, never decreasing along
  the log): what a query's time range selects on.

Two kinds of file in ``<data_dir>/keyindex/``, each named by the log position of its
first entry's record (20 digits):

``<position>.open``, the open file: entries in append order, written at checkpoints,
no header. After a crash its entries at or past the checkpoint's position are cut and
re-derived from the log, as the queue indexes are.

``<position>.kix``, a sealed file, written whole (temp, fsync, rename) and never changed::

    0                 entries sorted by (key_hash, log_position, offset), N x 40 bytes
    N * 40            fence: the key_hash of entries 0, S, 2S, ... (S = stride), u64 each
    end - 56          footer (`FOOTER`)

    0      4        6      8        12       16            24              32
    +------+--------+------+--------+--------+-------------+---------------+
    |magic |version |rsvd  |crc32c  |stride  |entry_count  |first_position |
    |"TQKI"|u16 = 1 |u16   |u32     |u32     |u64          |u64            |
    +------+--------+------+--------+--------+-------------+---------------+
    32              40               48
    +---------------+----------------+---------------+
    |last_position  |first_time_ms   |last_time_ms   |
    |u64            |i64             |i64            |
    +---------------+----------------+---------------+

``crc32c`` covers the fence and the footer but itself; the entries are not covered
(reading them all back to check would cost what the fence saves): an entry is only a
candidate, and every lookup reads the message it names and compares the key.
A lookup reads the fence (N / S hashes), finds the stride blocks that may hold the hash,
and reads just those entries.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from typing import Final

import numpy as np

from tidemq.store.format.compacted import key_hash

__all__ = [
    "ENTRY",
    "ENTRY_DTYPE",
    "FOOTER",
    "MAGIC",
    "OPEN_SUFFIX",
    "SEALED_SUFFIX",
    "VERSION",
    "entry_bytes",
    "key_hash",
]

ENTRY: Final = struct.Struct("<8sQQqII")
assert ENTRY.size == 40
ENTRY_DTYPE: Final = np.dtype(
    [
        ("key_hash", "<u8"),
        ("offset", "<u8"),
        ("log_position", "<u8"),
        ("store_time_ms", "<i8"),
        ("topic_id", "<u4"),
        ("queue_id", "<u4"),
    ]
)
assert ENTRY_DTYPE.itemsize == ENTRY.size

FOOTER: Final = struct.Struct("<4sHHIIQQQqq")
assert FOOTER.size == 56
MAGIC: Final = b"TQKI"
VERSION: Final = 1
#: Footer bytes not covered by its CRC: the CRC itself.
CRC_SLICE: Final = slice(8, 12)
OPEN_SUFFIX: Final = ".open"
SEALED_SUFFIX: Final = ".kix"


def entry_bytes(
    keys: Iterable[tuple[int, bytes]],
    *,
    base_offset: int,
    log_position: int,
    store_time_ms: int,
    topic_id: int,
    queue_id: int,
) -> bytes:
    """The entries of one record: `keys` are (message index in the batch, key bytes).

    Hot code (every keyed message of every indexed topic): one BLAKE2b and one pack per
    key, nothing else per key (see docs/design/performance.md for what it costs)."""
    pack, blake2b = ENTRY.pack, hashlib.blake2b
    return b"".join(
        [
            pack(
                blake2b(key, digest_size=8).digest(),
                base_offset + i,
                log_position,
                store_time_ms,
                topic_id,
                queue_id,
            )
            for i, key in keys
        ]
    )


# The raw digest read as a little-endian u64 is `key_hash`: one hash for both indexes.
assert int.from_bytes(hashlib.blake2b(b"k", digest_size=8).digest(), "little") == key_hash(b"k")
