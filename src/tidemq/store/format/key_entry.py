"""The key index's files: entries naming where each message key is (`store/key_index.py`).

One entry per (message, key): a message's `key` and each of its `keys` (a key equal to
one of its `keys` once). Little-endian, 40 bytes::

    0           8          16              24               32          36         40
    +-----------+----------+---------------+----------------+-----------+----------+
    |key_hash   |offset    |log_position   |store_time_ms   |topic_id   |queue_id  |
    |8 bytes    |u64       |u64            |i64             |u32        |u32       |
    +-----------+----------+---------------+----------------+-----------+----------+

* ``key_hash``: `index_hash(key)`, FNV-1a 64 over the key's bytes (of a key over 64
  bytes, its first 32 and last 32), then its length mixed in. Not the compacted logs'
  BLAKE2b: this one is computed for a whole batch's key column at once with numpy
  (`column_hashes`), where a hash per key in Python halved keyed produce throughput;
  collisions cost only a read, since every lookup reads the message and compares its
  key. A `keys` entry (UTF-8 text) hashes its UTF-8 bytes, so a key given as bytes or as
  text finds both. The topic is not hashed: ``topic_id`` is in the entry, and ids are
  never reused, so a deleted topic's entries match no live topic.
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
    |"TQKI"|u16 = 2 |u16   |u32     |u32     |u64          |u64            |
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

import struct
from collections.abc import Iterable
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "ENTRY",
    "ENTRY_DTYPE",
    "FOOTER",
    "MAGIC",
    "OPEN_SUFFIX",
    "SEALED_SUFFIX",
    "VERSION",
    "column_hashes",
    "entry_array",
    "entry_bytes",
    "index_hash",
]

ENTRY: Final = struct.Struct("<QQQqII")
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
#: 2: FNV-1a key hashes (1 had BLAKE2b ones).
VERSION: Final = 2
#: Footer bytes not covered by its CRC: the CRC itself.
CRC_SLICE: Final = slice(8, 12)
OPEN_SUFFIX: Final = ".open"
SEALED_SUFFIX: Final = ".kix"

_FNV_OFFSET: Final = 0xCBF29CE484222325
_FNV_PRIME: Final = 0x100000001B3
_MASK: Final = (1 << 64) - 1
#: Bytes of a key hashed: all of a key this long or shorter, else its first and last half
#: of this many (a numpy step per byte position, so the loop stays short).
_SAMPLE: Final = 64
_HALF: Final = _SAMPLE // 2


def index_hash(key: bytes) -> int:
    """The key index's 64-bit hash of one key (as `column_hashes` computes for many)."""
    sample = key if len(key) <= _SAMPLE else key[:_HALF] + key[-_HALF:]
    h = _FNV_OFFSET
    for byte in sample:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return ((h ^ (len(key) & _MASK)) * _FNV_PRIME) & _MASK


def column_hashes(
    offsets: npt.NDArray[np.uint32], data: npt.NDArray[np.uint8], rows: npt.NDArray[np.intp]
) -> npt.NDArray[np.uint64]:
    """`index_hash` of entries `rows` of an Arrow binary column (offsets, data): the bytes
    gathered into a (position, row) matrix in one step, then one FNV step per byte
    position (at most `_SAMPLE`) over all rows at once."""
    starts = offsets[rows].astype(np.int64)
    lengths = offsets[rows + 1].astype(np.int64) - starts
    h = np.full(len(rows), _FNV_OFFSET, dtype=np.uint64)
    if not len(rows):
        return h
    span = int(min(int(lengths.max()), _SAMPLE))
    j = np.arange(span, dtype=np.int64)[:, None]
    at = starts[None, :] + j
    long = lengths > _SAMPLE
    if long.any():  # over _SAMPLE bytes: the last half of the sample is the key's end
        at = np.where(long[None, :] & (j >= _HALF), at + lengths[None, :] - _SAMPLE, at)
    valid = j < lengths[None, :]
    matrix = data[np.where(valid, at, 0)].astype(np.uint64)  # row j: byte j of each key
    prime = np.uint64(_FNV_PRIME)
    ragged = not valid.all()
    for step in range(span):
        mixed = (h ^ matrix[step]) * prime  # wraps mod 2**64, as FNV does
        h = np.where(valid[step], mixed, h) if ragged else mixed
    return (h ^ lengths.astype(np.uint64)) * prime


def entry_array(
    rows: npt.NDArray[np.intp],
    hashes: npt.NDArray[np.uint64],
    *,
    base_offset: int,
    log_position: int,
    store_time_ms: int,
    topic_id: int,
    queue_id: int,
) -> npt.NDArray[np.void]:
    """The entries of one record: message `rows` of the batch, with their key hashes."""
    out = np.empty(len(rows), dtype=ENTRY_DTYPE)
    out["key_hash"] = hashes
    out["offset"] = rows.astype(np.uint64) + np.uint64(base_offset)
    out["log_position"] = log_position
    out["store_time_ms"] = store_time_ms
    out["topic_id"] = topic_id
    out["queue_id"] = queue_id
    return out


def entry_bytes(
    keys: Iterable[tuple[int, bytes]],
    *,
    base_offset: int,
    log_position: int,
    store_time_ms: int,
    topic_id: int,
    queue_id: int,
) -> bytes:
    """The entries for (message index in the batch, key bytes) pairs, one by one (the
    `keys` lists of a batch; the `key` column goes through `column_hashes`)."""
    pack = ENTRY.pack
    return b"".join(
        [
            pack(index_hash(key), base_offset + i, log_position, store_time_ms, topic_id, queue_id)
            for i, key in keys
        ]
    )
