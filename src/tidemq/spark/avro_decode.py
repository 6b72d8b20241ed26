"""`valueFormat=avro` on the executors: a batch's values decoded a block at a time,
into Arrow columns (ADR 0022).

The framing (magic byte, schema id) of the batch's binary column is read with numpy, and
the payloads of consecutive values with the same writer schema are gathered end to end,
with no Python object per value, as one block of an in-memory Avro container (a header
naming the writer's schema, the count, the size, the payloads, the sync marker: the
container format's block is exactly that). When the writer's schema is the reader's
(Avro's parsing canonical form: the usual case) and polars reads its types (not maps,
not unions other than [null, T]), polars' compiled Avro reader turns the block into
Arrow columns, cast to the struct's types: no Python object per value or field.
Otherwise (an older writer schema to resolve, a type polars does not read, polars not
installed) fastavro's block reader gives records that Arrow converts. A block that does
not decode is read again value by value, so that the error names the offset of the
value at fault. `tests/unit/test_spark_avro_decode.py` holds polars' columns to
fastavro's records.
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any, Final

import fastavro
import fastavro.schema
import pyarrow as pa

from tidemq.core.errors import InvalidBatch
from tidemq.schema.wire import WireFormatError, unframe
from tidemq.spark.value_frames import Frames, scatter

if TYPE_CHECKING:
    from tidemq.spark.value_format import ValueFormat

__all__ = ["columns_of_block", "decode_avro_column", "polars_reads"]

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
        #: Decoded by polars into columns (its types only; until it fails on it once).
        self.columnar = polars_reads(schema)
        head = io.BytesIO()
        head.write(_MAGIC)
        metadata = {"avro.schema": text.encode(), "avro.codec": b"null"}
        fastavro.schemaless_writer(head, _METADATA, metadata)
        head.write(_SYNC)
        self.header = head.getvalue()


#: (registry URL, reader schema) -> schema id -> its _Writer (per executor process).
_WRITERS: dict[tuple[str, str], dict[int, _Writer]] = {}


def decode_avro_column(
    column: Any, offsets: list[int], fmt: ValueFormat, arrow_type: Any, where: tuple[str, int]
) -> Any:
    """The values of a binary column (framed Avro; null stays null) as a pa.Array of
    `arrow_type` (the reader schema's struct)."""
    frames = Frames(column)
    if frames.unframed >= 0:
        row = int(frames.present[frames.unframed])
        problem = WireFormatError("GUID-framed: schemas are named by id in this registry")
        try:
            unframe(column[row].as_py())
        except WireFormatError as exc:
            problem = exc
        raise _not_avro(where, offsets[row], problem)
    reader = json.loads(fmt.reader_schema)
    writers = _WRITERS.setdefault((fmt.registry_url, fmt.reader_schema), {})
    canonical = fastavro.schema.to_parsing_canonical_form(reader)
    pieces = []
    runs = frames.runs()
    for schema_id, rows in runs:
        if schema_id not in writers:
            text, _ = fmt.registry().schema_text(schema_id)
            writers[schema_id] = _Writer(text, reader, canonical)
        context = (writers[schema_id], arrow_type, where)
        pieces.append(_run_column(rows, frames, offsets, context))
    return scatter(pieces, [rows for _, rows in runs], len(column), arrow_type)


def _run_column(
    rows: Any, frames: Frames, offsets: list[int], context: tuple[_Writer, Any, Any]
) -> Any:
    writer, arrow_type, where = context
    data = frames.payloads(rows)
    block = b"".join((writer.header, _long(len(rows)), _long(len(data)), data, _SYNC))
    tried = writer.reader is None and writer.columnar
    if tried:
        try:
            return columns_of_block(block, arrow_type)
        except (Exception, _panic()):  # polars missing, or failing on this data:
            pass  # fastavro reads every schema, and decides what is an error
    try:
        records = list(fastavro.reader(io.BytesIO(block), reader_schema=writer.reader))
        if len(records) != len(rows):
            raise ValueError(f"{len(records)} values decoded, {len(rows)} expected")
    except _ERRORS:
        records = [
            _one(frames.column[int(i)].as_py(), offsets[int(i)], writer, where) for i in rows
        ]
    if tried:  # the data was good: polars does not read this schema
        writer.columnar = False
    return pa.array(records, type=arrow_type)


def columns_of_block(block: bytes, arrow_type: Any) -> Any:
    """An Avro container (one writer schema, the reader's) read by polars' compiled
    reader straight into columns, as a pa.StructArray of `arrow_type`. Raises whatever
    polars raises for a type it does not read (maps, ...), ValueError when its columns
    are not the struct's fields."""
    import polars as pl  # noqa: PLC0415 - optional: without it, fastavro decodes

    table = pl.read_avro(io.BytesIO(block)).to_arrow()
    names = [arrow_type.field(i).name for i in range(arrow_type.num_fields)]
    if table.column_names != names:
        raise ValueError(f"polars read the columns {table.column_names}, not {names}")
    columns = [
        table.column(i).combine_chunks().cast(arrow_type.field(i).type) for i in range(len(names))
    ]
    return pa.StructArray.from_arrays(columns, fields=list(arrow_type))


def _panic() -> type[BaseException]:
    """polars' Rust panics (a BaseException), or Exception when polars is missing."""
    try:
        from polars.exceptions import PanicException  # noqa: PLC0415
    except ImportError:
        return Exception
    return PanicException


_POLARS_PRIMITIVES: Final = frozenset(
    ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
)
_POLARS_LOGICAL: Final = frozenset(("date", "timestamp-millis", "timestamp-micros"))


def polars_reads(  # noqa: PLR0911 - one answer per kind of Avro type
    schema: Any, named: frozenset[str] = frozenset()
) -> bool:
    """Whether polars' Avro reader reads this schema (it panics on maps and on unions
    other than [null, T]; refusing them here keeps its panics out of executor logs)."""
    if isinstance(schema, str):
        return schema in _POLARS_PRIMITIVES or schema in named
    if isinstance(schema, list):
        members = [m for m in schema if m != "null"]
        return len(members) == 1 and len(schema) <= 2 and polars_reads(members[0], named)
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if "logicalType" in schema:
        return schema["logicalType"] in _POLARS_LOGICAL
    if kind == "record":
        inner = named | {schema.get("name", "")}
        return all(polars_reads(f.get("type"), inner) for f in schema.get("fields", []))
    if kind == "array":
        return polars_reads(schema.get("items"), named)
    if kind == "enum":
        return True
    return isinstance(kind, str) and polars_reads(kind, named)


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
