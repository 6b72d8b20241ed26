"""A batch's binary `value` column taken apart with numpy, without a Python object per
value: Confluent's framing of each value and where its payload is (ADR 0022, 0024).

Confluent's wire format, as the decoders here read it (`tidemq.schema.wire`):

    magic u8 (0) | schema id u32, big-endian | payload
    (Protobuf only: the payload starts with the message indexes, varints)

Values with magic 1 (a GUID instead of the id) or shorter than 5 bytes are "unframed"
here: the decoders leave those batches to their value-by-value path, which names the
value at fault or reads the GUID framing.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["FRAMING", "Frames", "scatter"]

#: The magic byte and the 4-byte schema id.
FRAMING: Final = 5


class Frames:
    """A binary column's framing read with numpy: where each value's bytes are, which
    are present, and each one's schema id."""

    def __init__(self, column: Any) -> None:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if not pa.types.is_binary(column.type):
            column = column.cast(pa.binary())
        self.column = column
        n = len(column)
        _, offsets, data = column.buffers()
        bounds = np.frombuffer(offsets, dtype=np.int32)[column.offset : column.offset + n + 1]
        self.data = (
            np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        )
        self.starts = bounds[:-1].astype(np.int64)
        self.ends = bounds[1:].astype(np.int64)
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        self.present = np.flatnonzero(valid)
        starts = self.starts[self.present]
        framed = self.ends[self.present] - starts >= FRAMING
        head = np.where(framed, starts, 0)
        # Padded so that the bytes read at a short value's place stay in bounds.
        self.padded = np.concatenate([self.data, np.zeros(FRAMING + 2, np.uint8)])
        framed &= self.padded[head] == 0
        #: Index (in `present`) of the first value not in Confluent's framing, or -1.
        self.unframed = int(np.argmin(framed)) if not framed.all() else -1
        self.ids = np.zeros(len(head), dtype=np.int64)
        for k in range(1, FRAMING):  # the big-endian schema id after the magic byte
            self.ids = (self.ids << 8) | self.padded[head + k].astype(np.int64)

    def runs(self) -> list[tuple[int, Any]]:
        """(schema id, row indexes) of each run of present values with one schema id."""
        if not len(self.present):
            return []
        cuts = np.flatnonzero(self.ids[1:] != self.ids[:-1]) + 1
        return [
            (int(self.ids[rows[0]]), self.present[rows])
            for rows in np.split(np.arange(len(self.present)), cuts)
        ]

    def payloads(self, rows: Any) -> bytes:
        """The rows' payloads (past the 5 framing bytes), end to end."""
        starts, ends = self.starts[rows] + FRAMING, self.ends[rows]
        lengths = ends - starts
        total = int(lengths.sum())
        ends_out = np.cumsum(lengths)
        gather = np.arange(total) + np.repeat(starts - (ends_out - lengths), lengths)
        return bytes(self.data[gather].tobytes())

    def payload_list(self, rows: Any, skip: int = FRAMING) -> list[bytes]:
        """The rows' values as bytes objects, each without its first `skip` bytes: one
        Python object a value (sliced by Arrow: gathering the bytes with numpy index
        arrays cost about 1 us a 150-byte value, the slice 0.1)."""
        column = self.column
        if len(rows) != len(column) or column.null_count:
            column = column.take(pa.array(rows))
        return pc.binary_slice(column, skip, _TO_THE_END).to_pylist()  # type: ignore[no-any-return]


#: `binary_slice`'s stop for "to the end" (without one, pyarrow 26 fails: negative resize).
_TO_THE_END: Final = (1 << 31) - 1


def scatter(pieces: list[Any], rows: list[Any], length: int, arrow_type: Any) -> Any:
    """The column of `length` rows in which row `rows[i][j]` is `pieces[i][j]` and every
    other row is null (tombstones; values read in groups of one writer schema)."""
    placed = sum(len(r) for r in rows)
    if len(pieces) == 1 and placed == length:
        return pieces[0]
    position = np.full(length, placed, dtype=np.int64)
    if rows:
        position[np.concatenate(rows)] = np.arange(placed)
    whole = pa.concat_arrays([*pieces, pa.nulls(1, arrow_type)])
    return whole.take(pa.array(position))
