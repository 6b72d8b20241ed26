"""`valueFormat=avro` on the executors: a batch's values decoded a block at a time.

fastavro's per-value call (`schemaless_reader`) costs a Python call, a stream object and
its checks for every value, and resolving the writer's schema to the reader's costs as
much again. So the payloads of consecutive values with the same writer schema are laid
end to end as one block of an in-memory Avro container (a header naming the writer's
schema, the count, the size, the payloads, the sync marker: the container format's
block is exactly that) and read by fastavro's compiled block reader in one call; when
the writer's schema is the reader's (Avro's parsing canonical form, the usual case), no
resolution is asked for. A block that does not decode is read again value by value, so
that the error names the offset of the value at fault.
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any, Final

import fastavro
import fastavro.schema

from tidemq.core.errors import InvalidBatch
from tidemq.schema.wire import WireFormatError, unframe

if TYPE_CHECKING:
    from tidemq.spark.value_format import ValueFormat

__all__ = ["decode_avro"]

_MAGIC: Final = b"Obj\x01"
#: Any 16 bytes do: the block is read from memory, right after its header.
_SYNC: Final = bytes(16)
_METADATA: Final = fastavro.parse_schema({"type": "map", "values": "bytes"})
_ERRORS: Final = (WireFormatError, ValueError, TypeError, EOFError, KeyError, IndexError)


def _long(n: int) -> bytes:
    """Avro's long: zigzag, then base-128 varint."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Writer:
    """What one writer schema needs: the container header naming it, its parsed form
    (for the value-by-value path), and the reader schema to resolve to (None: the same)."""

    def __init__(self, text: str, reader: Any, reader_canonical: str) -> None:
        schema = json.loads(text)
        self.parsed = fastavro.parse_schema(schema)
        same = fastavro.schema.to_parsing_canonical_form(schema) == reader_canonical
        self.reader = None if same else reader
        head = io.BytesIO()
        head.write(_MAGIC)
        metadata = {"avro.schema": text.encode(), "avro.codec": b"null"}
        fastavro.schemaless_writer(head, _METADATA, metadata)
        head.write(_SYNC)
        self.header = head.getvalue()


#: (registry URL, reader schema) -> schema id -> its _Writer (per executor process).
_WRITERS: dict[tuple[str, str], dict[int, _Writer]] = {}


def decode_avro(
    values: list[Any], offsets: list[int], fmt: ValueFormat, where: tuple[str, int]
) -> list[Any]:
    """The values (framed Avro; None stays None) as dicts of the reader schema."""
    reader = json.loads(fmt.reader_schema)
    writers = _WRITERS.setdefault((fmt.registry_url, fmt.reader_schema), {})
    canonical = fastavro.schema.to_parsing_canonical_form(reader)
    out: list[Any] = [None] * len(values)
    run: list[int] = []  # indexes of consecutive values with one writer schema
    run_id = -1
    for i, value in enumerate(values):
        if value is None:
            continue
        try:
            schema_id = unframe(value).schema_id
        except WireFormatError as exc:
            raise _not_avro(where, offsets[i], exc) from None
        if schema_id != run_id and run:
            _decode_run(run, values, offsets, out, (writers[run_id], where))
            run = []
        if schema_id not in writers:
            text, _ = fmt.registry().schema_text(schema_id)
            writers[schema_id] = _Writer(text, reader, canonical)
        run_id = schema_id
        run.append(i)
    if run:
        _decode_run(run, values, offsets, out, (writers[run_id], where))
    return out


def _decode_run(
    run: list[int],
    values: list[Any],
    offsets: list[int],
    out: list[Any],
    context: tuple[_Writer, tuple[str, int]],
) -> None:
    writer, where = context
    data = b"".join([memoryview(values[i])[5:] for i in run])
    block = b"".join((writer.header, _long(len(run)), _long(len(data)), data, _SYNC))
    try:
        records = list(fastavro.reader(io.BytesIO(block), reader_schema=writer.reader))
        if len(records) != len(run):
            raise ValueError(f"{len(records)} values decoded, {len(run)} expected")
    except _ERRORS:
        records = [_one(values[i], offsets[i], writer, where) for i in run]
    for i, record in zip(run, records, strict=True):
        out[i] = record


def _one(value: Any, offset: int, writer: _Writer, where: tuple[str, int]) -> Any:
    """One value decoded on its own (to name the one that does not decode)."""
    try:
        payload = io.BytesIO(memoryview(value)[5:])
        return fastavro.schemaless_reader(payload, writer.parsed, writer.reader)
    except _ERRORS as exc:
        raise _not_avro(where, offset, exc) from None


def _not_avro(where: tuple[str, int], offset: int, exc: Exception) -> InvalidBatch:
    topic, queue = where
    return InvalidBatch(
        f"{topic}/{queue} offset {offset}: the value is not Avro of the subject's schema "
        f"({type(exc).__name__}: {exc})"
    )
