"""`valueFormat=json` on the executors: a batch's values decoded into the subject's
struct column a batch at a time (ADR 0024).

The framing is read with numpy (`value_frames.py`); the payloads, sliced by Arrow, become
bytes objects and go through msgspec's decoder in a `map` (no Python frame a value), and
the decoded values into Arrow in one `pa.array` call against the struct type that
`json_types.py` derives from the subject's JSON Schema. These are the very calls the
value-by-value path (`json_rows`) makes for each value, so the two give the same column
for every value they accept, missing, extra and null fields, nested objects and arrays
and Arrow's own conversions included (`tests/unit/test_spark_json_decode.py` holds them
to it). Whatever the batch path cannot take (a value not framed with a schema id, one
that is not JSON, one that does not fit the struct) sends the batch down the
value-by-value path, which decodes it the same way or fails the task naming the offset of
the value at fault, as before.

Parsing the payloads as newline-delimited JSON in one call was measured and not taken:
pyarrow's JSON reader crashed the process (SIGSEGV) on a value `null` with an explicit
schema (pyarrow 26), polars' NDJSON reader turns numbers and booleans into strings and
keeps the first of two equal keys where msgspec keeps the last, and msgspec's
`decode_lines` reads a whitespace-separated stream, in which payloads can merge.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
import pyarrow as pa

from tidemq.core.errors import InvalidBatch
from tidemq.schema.wire import WireFormatError, unframe
from tidemq.spark.value_frames import Frames, scatter

__all__ = ["decode_json_column", "json_batch_column", "json_rows"]

_JSON_DECODE: Final = msgspec.json.Decoder().decode
#: What Arrow raises for a Python value that does not fit the struct type.
_MISFIT: Final = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError)


def decode_json_column(
    column: Any, offsets: list[int], arrow_type: Any, where: tuple[str, int]
) -> Any:
    """The values of a binary column (framed JSON; null stays null) as a pa.Array of
    `arrow_type` (the subject's struct)."""
    found = json_batch_column(column, arrow_type)
    if found is not None:
        return found
    return json_rows(column.to_pylist(), offsets, arrow_type, where)


def json_batch_column(column: Any, arrow_type: Any) -> Any | None:
    """The batch path: the column decoded in one pass, or None when a value is not
    framed with a schema id, is not JSON or does not fit (the value-by-value path then
    decides, and names it)."""
    frames = Frames(column)
    if frames.unframed >= 0:
        return None
    try:
        decoded = list(map(_JSON_DECODE, frames.payload_list(frames.present)))
        piece = pa.array(decoded, type=arrow_type)
    except (msgspec.DecodeError, *_MISFIT):
        return None
    return scatter([piece], [frames.present], len(frames.column), arrow_type)


def json_rows(
    values: list[Any], offsets: list[int], arrow_type: Any, where: tuple[str, int]
) -> Any:
    """The values decoded one at a time (GUID framing too), failing on the first that
    is not framed JSON or does not fit the struct, naming its offset."""
    topic, queue = where
    decoded: list[Any] = []
    for value, offset in zip(values, offsets, strict=True):
        if value is None:
            decoded.append(None)
            continue
        try:
            # msgspec's decoder: the same JSON, a few times faster than json.loads.
            decoded.append(_JSON_DECODE(unframe(value).payload))
        except (WireFormatError, ValueError, msgspec.DecodeError) as exc:
            raise InvalidBatch(
                f"{topic}/{queue} offset {offset}: the value is not framed JSON ({exc})"
            ) from None
    try:
        return pa.array(decoded, type=arrow_type)
    except _MISFIT:
        # Find the value that does not fit, to name it.
        for value, offset in zip(decoded, offsets, strict=True):
            try:
                pa.array([value], type=arrow_type)
            except _MISFIT as exc:
                raise InvalidBatch(
                    f"{topic}/{queue} offset {offset}: the JSON value does not fit the "
                    f"subject's schema ({exc})"
                ) from None
        raise
