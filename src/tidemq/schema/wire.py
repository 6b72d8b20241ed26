"""Confluent's wire format for a schema'd value, which every Kafka-ecosystem serializer
writes and reads:

    0      1              5
    +------+--------------+-------------------------------------------+
    |magic |schema id     |payload (Avro binary, JSON text, Protobuf) |
    |0x00  |u32 big-endian|                                           |
    +------+--------------+-------------------------------------------+

Protobuf payloads start with the message indexes (which message of the schema file):
a zigzag varint count, then that many zigzag varint indexes; the single byte 0 stands
for [0], the first message. Newer clients may write magic 0x01 and a 16-byte schema GUID
instead of the id.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

__all__ = [
    "MAGIC_GUID",
    "MAGIC_ID",
    "Framed",
    "WireFormatError",
    "decode_message_indexes",
    "encode_message_indexes",
    "frame",
    "unframe",
]

MAGIC_ID: Final = 0
MAGIC_GUID: Final = 1
_ID: Final = struct.Struct(">bI")
#: Message indexes one Protobuf value may name (nesting depth of its message type).
_MAX_INDEXES: Final = 64


class WireFormatError(ValueError):
    """A value that is not in Confluent's wire format."""


@dataclass(frozen=True, slots=True)
class Framed:
    """A value taken apart: its schema id (or GUID) and the payload after the framing."""

    schema_id: int
    guid: bytes
    payload: memoryview


def frame(schema_id: int, payload: bytes) -> bytes:
    """A payload with the magic byte and its schema id in front."""
    if not 0 <= schema_id < 1 << 31:
        raise ValueError(f"schema id must be 0..2**31-1, got {schema_id}")
    return _ID.pack(MAGIC_ID, schema_id) + payload


def unframe(value: bytes | memoryview) -> Framed:
    """Split a framed value; InvalidBatch naming what is wrong with one that is not."""
    view = memoryview(value)
    if len(view) < 1:
        raise WireFormatError("an empty value has no schema id (Confluent's wire format)")
    magic = view[0]
    if magic == MAGIC_ID:
        if len(view) < _ID.size:
            raise WireFormatError(f"a framed value needs {_ID.size} bytes, got {len(view)}")
        _, schema_id = _ID.unpack_from(view)
        return Framed(schema_id, b"", view[_ID.size :])
    if magic == MAGIC_GUID:
        if len(view) < 17:
            raise WireFormatError(f"a GUID-framed value needs 17 bytes, got {len(view)}")
        return Framed(-1, bytes(view[1:17]), view[17:])
    raise WireFormatError(
        f"value does not start with Confluent's magic byte 0 (or 1), but {magic:#04x}: "
        "it was not written by a schema registry serializer"
    )


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_message_indexes(indexes: list[int]) -> bytes:
    """Protobuf's message indexes as Confluent writes them ([0]: the single byte 0)."""
    if indexes == [0]:
        return b"\x00"
    return b"".join(_varint(_zigzag(i)) for i in [len(indexes), *indexes])


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(view) or shift > 63:
            raise WireFormatError("protobuf message indexes are truncated")
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def decode_message_indexes(payload: memoryview) -> tuple[list[int], memoryview]:
    """(message indexes, the Protobuf bytes after them)."""
    count, pos = _read_varint(payload, 0)
    count = _unzigzag(count)
    if count == 0:
        return [0], payload[pos:]
    if not 0 < count <= _MAX_INDEXES:
        raise WireFormatError(f"protobuf message index count {count} is out of range")
    indexes = []
    for _ in range(count):
        raw, pos = _read_varint(payload, pos)
        indexes.append(_unzigzag(raw))
    return indexes, payload[pos:]
