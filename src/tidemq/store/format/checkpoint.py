"""Checkpoint file: how far the log is known flushed and the indexes known written.

Little-endian, 32 bytes, replaced atomically (temp file, fsync, rename, fsync dir)::

    0        4        8                 16                24               28       32
    +--------+--------+-----------------+-----------------+----------------+--------+
    |magic   |version |flushed_position |indexed_position |written_ms (lo) |crc32c  |
    |u32     |u32     |u64              |u64              |u32             |u32     |
    +--------+--------+-----------------+-----------------+----------------+--------+

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
CHECKPOINT: Final = struct.Struct("<IIQQII")
assert CHECKPOINT.size == 32


@dataclass(frozen=True, slots=True)
class Checkpoint:
    flushed_position: int
    indexed_position: int


def encode_checkpoint(cp: Checkpoint, written_ms: int) -> bytes:
    assert cp.indexed_position <= cp.flushed_position
    body = CHECKPOINT.pack(
        MAGIC, VERSION, cp.flushed_position, cp.indexed_position, written_ms & 0xFFFFFFFF, 0
    )
    return body[:28] + crc32c.crc32c(body[:28]).to_bytes(4, "little")


def decode_checkpoint(raw: bytes) -> Checkpoint:
    if len(raw) != CHECKPOINT.size:
        raise CorruptRecordError(f"checkpoint is {len(raw)} bytes, expected {CHECKPOINT.size}")
    magic, version, flushed, indexed, _, crc = CHECKPOINT.unpack(raw)
    if magic != MAGIC or version != VERSION or crc != crc32c.crc32c(raw[:28]):
        raise CorruptRecordError("checkpoint magic, version or CRC is wrong")
    if indexed > flushed:
        raise CorruptRecordError("checkpoint indexed position is past its flushed position")
    return Checkpoint(flushed, indexed)
