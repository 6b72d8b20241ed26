"""Checkpoint file: how far the log is known flushed and the indexes known written.

Little-endian, 40 bytes, replaced atomically (temp file, fsync, rename, fsync dir)::

    0        4        8                 16                24                  32       36        40
    +--------+--------+-----------------+-----------------+-------------------+--------+---------+
    |magic   |version |flushed_position |indexed_position |max_store_time_ms  |crc32c  |reserved |
    |u32     |u32     |u64              |u64              |i64                |u32     |u32      |
    +--------+--------+-----------------+-----------------+-------------------+--------+---------+

``crc32c`` covers bytes 0-31. ``max_store_time_ms`` is the newest store time in the log
before ``indexed_position``, so that store times stay monotone across a restart even if
the wall clock went back.

Invariant: indexed_position <= flushed_position <= end of the recovered log.
A missing or corrupt checkpoint is not fatal: recovery then replays the whole log.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import crc32c

from tidemq.core.errors import CorruptRecordError

__all__ = ["CHECKPOINT", "Checkpoint", "decode_checkpoint", "encode_checkpoint"]

MAGIC: Final = 0x50434D54  # "TMCP"
VERSION: Final = 1
CHECKPOINT: Final = struct.Struct("<IIQQqII")
assert CHECKPOINT.size == 40
_CRC_END: Final = 32


@dataclass(frozen=True, slots=True)
class Checkpoint:
    flushed_position: int
    indexed_position: int
    max_store_time_ms: int = 0


def encode_checkpoint(cp: Checkpoint) -> bytes:
    assert cp.indexed_position <= cp.flushed_position
    body = CHECKPOINT.pack(
        MAGIC, VERSION, cp.flushed_position, cp.indexed_position, cp.max_store_time_ms, 0, 0
    )
    crc = crc32c.crc32c(body[:_CRC_END]).to_bytes(4, "little")
    return body[:_CRC_END] + crc + body[_CRC_END + 4 :]


def decode_checkpoint(raw: bytes) -> Checkpoint:
    if len(raw) != CHECKPOINT.size:
        raise CorruptRecordError(f"checkpoint is {len(raw)} bytes, expected {CHECKPOINT.size}")
    magic, version, flushed, indexed, max_store_time, crc, _ = CHECKPOINT.unpack(raw)
    if magic != MAGIC or version != VERSION or crc != crc32c.crc32c(raw[:_CRC_END]):
        raise CorruptRecordError("checkpoint magic, version or CRC is wrong")
    if indexed > flushed:
        raise CorruptRecordError("checkpoint indexed position is past its flushed position")
    return Checkpoint(flushed, indexed, max_store_time)
