"""Tier files (`tidemq.tiered.parquet_rows`): stored records go to Parquet and come back
byte for byte (whole files and row group by row group), and the manifest keeps its
invariants."""

from __future__ import annotations

import io

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.core.batch import Codec, MessageRecord, encode_batch, encode_values, parse_envelope
from tidemq.core.errors import CorruptRecordError
from tidemq.core.record import RecordFlags, encode_header
from tidemq.tiered.manifest import QueueManifest, RemoteFile, decode_manifest, encode_manifest
from tidemq.tiered.parquet_rows import SCHEMA, encode_file, table_to_records

_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=8)
_tag = st.none() | st.sampled_from(["paid", "refund", "\u00e9t\u00e9"])
_message = st.builds(
    MessageRecord,
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=8),
    _tag,
    st.lists(_text.filter(bool), max_size=2).map(tuple),
    st.lists(st.tuples(_text, st.binary(max_size=6)), max_size=2).map(tuple),
    st.integers(1_700_000_000_000, 1_700_000_100_000),
)
_batch = st.tuples(
    st.lists(_message, min_size=1, max_size=12),
    st.sampled_from(list(Codec)),
    st.sampled_from([0, RecordFlags.LOG_APPEND_TIME, RecordFlags.FROM_TIMER]),
    st.sampled_from([b"", b"\x81\xa2pg\xa1g"]),
    st.integers(-1, 5),
)


def _record(
    payload: bytes, base: int, *, flags: int = 0, props: bytes = b"", pid: int = -1
) -> bytes:
    count = parse_envelope(payload).count
    header = encode_header(
        payload_size=len(payload),
        properties=props,
        flags=flags,
        topic_id=3,
        queue_id=1,
        count=count,
        base_offset=base,
        store_time_ms=1_700_000_200_000 + base,
        producer_id=pid,
        base_sequence=max(pid, 0) * 10,
        producer_epoch=max(pid, 0),
        payload_crc=parse_envelope(payload).crc,
    )
    return header + props + payload


def _records(batches: list[tuple[list[MessageRecord], Codec, int, bytes, int]]) -> list[bytes]:
    out, base = [], 100
    for messages, codec, flags, props, pid in batches:
        out.append(
            _record(encode_batch(messages, codec=codec), base, flags=flags, props=props, pid=pid)
        )
        base += len(messages)
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(_batch, min_size=1, max_size=6), st.sampled_from([64, 512, 1 << 20]))
def test_records_come_back_byte_for_byte(
    batches: list[tuple[list[MessageRecord], Codec, int, bytes, int]], group_bytes: int
) -> None:
    records = _records(batches)
    f = encode_file(records, topic="t", queue=1, broker="b", row_group_bytes=group_bytes)
    assert (f.start, f.end) == (100, 100 + sum(len(b[0]) for b in batches))
    parquet = pq.ParquetFile(io.BytesIO(f.data))
    assert parquet.schema_arrow.remove_metadata() == SCHEMA
    assert table_to_records(parquet.read(), 3, 1) == records
    # Row group by row group (what a ranged read does): whole records, same bytes.
    assert len(f.row_groups) == parquet.num_row_groups
    by_group: list[bytes] = []
    for g in range(parquet.num_row_groups):
        group = table_to_records(parquet.read_row_group(g), 3, 1)
        assert int.from_bytes(group[0][24:32], "little") == f.row_groups[g]
        by_group += group
    assert by_group == records


def test_the_producers_fast_path_comes_back_byte_for_byte() -> None:
    """`send_batch`'s encoding (encode_values: shared headers, one timestamp) too."""
    payload = encode_values(
        [b"a", b"bb", b"c"], timestamp_ms=5, keys=[b"k", None, b"k"], tags=["x", None, "x"],
        headers={"h": b"v"}, codec=Codec.ZSTD,
    )  # fmt: skip
    records = [_record(payload, 0)]
    f = encode_file(records, topic="t", queue=1, broker="b", row_group_bytes=1 << 20)
    assert table_to_records(pq.read_table(io.BytesIO(f.data)), 3, 1) == records


def test_the_columns_are_the_sources_and_the_timestamps_effective() -> None:
    messages = [MessageRecord(b"v", b"k", "paid", ("id",), (("h", b"1"),), 1_000)]
    appended = _record(encode_batch(messages), 0, flags=RecordFlags.LOG_APPEND_TIME)
    f = encode_file([appended], topic="t", queue=1, broker="b", row_group_bytes=1 << 20)
    row = pq.read_table(io.BytesIO(f.data)).to_pylist()[0]
    # LogAppendTime: `timestamp` is the store time, the producer's is kept beside it.
    assert row["timestampType"] == 1
    assert row["timestamp"].timestamp() * 1000 == 1_700_000_200_000
    assert row["create_time_ms"] == 1_000
    assert (row["key"], row["value"], row["tag"], row["keys"]) == (b"k", b"v", "paid", ["id"])
    assert row["headers"] == [{"key": "h", "value": b"1"}]


def _file(start: int, end: int) -> RemoteFile:
    return RemoteFile(
        path=f"p-{start}", start=start, end=end, messages=end - start, size=1, record_bytes=1,
        md5="", sha256="", min_store_time_ms=0, max_store_time_ms=0, row_groups=[start],
        uploaded_ms=0,
    )  # fmt: skip


def test_manifests_are_contiguous_and_find_files_by_offset() -> None:
    m = QueueManifest(
        broker="b", topic="t", queue=0, topic_created_ms=1, log_start=5,
        files=[_file(0, 10), _file(10, 25)],
    )  # fmt: skip
    assert decode_manifest(encode_manifest(m)) == m
    assert m.end == 25
    assert m.file_for(4) is None  # below the log start: expired
    assert m.file_for(9) == m.files[0]
    assert m.file_for(10) == m.files[1]
    assert m.file_for(25) is None
    assert m.following(m.files[0]) == m.files[1]
    gap = QueueManifest(
        broker="b", topic="t", queue=0, topic_created_ms=1, log_start=0,
        files=[_file(0, 10), _file(11, 25)],
    )  # fmt: skip
    with pytest.raises(CorruptRecordError, match="not contiguous"):
        encode_manifest(gap)
    with pytest.raises(CorruptRecordError, match="undecodable"):
        decode_manifest(b"{")
