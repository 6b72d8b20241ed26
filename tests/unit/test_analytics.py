"""The analytics pipeline's pure parts (no JVM): the event format, the generator, the
reference aggregations, and the outputs of one micro-batch."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tidemq.spark.pipelines.analytics import AnalyticsConfig, result_messages, write_results
from tidemq.spark.pipelines.analytics_outputs import (
    message_batch,
    publish_results,
    split_kinds,
    stage_results,
)
from tidemq.spark.pipelines.analytics_publish import BatchDescriptors
from tidemq.spark.pipelines.analytics_tasks import (
    DESCRIPTOR_ARROW,
    DESCRIPTOR_SCHEMA,
    descriptor_rows,
)
from tidemq.spark.pipelines.archive import STALE_TMP_S, stage_table
from tidemq.spark.pipelines.events import (
    BEHAVIORS,
    Event,
    SessionRow,
    WindowRow,
    generate_events,
    parse_event,
    reference_sessions,
    reference_windows,
)


def test_event_round_trip_and_extra_fields() -> None:
    e = Event(7, 1007, "cart", 1_763_820_000_123)
    assert parse_event(e.to_json()) == e
    assert parse_event('{"user_id":1,"item_id":2,"behavior":"pv","ts":3,"x":[1]}') == Event(
        1, 2, "pv", 3
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "tombstone"),
        (b"\xff", "not JSON"),
        (b"{", "not JSON"),
        (b"[1, 2]", "JSON object, got list"),
        (b'{"user_id":1,"item_id":2,"behavior":"steal","ts":3}', "'behavior' must be one of"),
        (b'{"user_id":1,"item_id":2,"ts":3}', "'behavior' must be one of"),
        (b'{"user_id":"1","item_id":2,"behavior":"pv","ts":3}', "'user_id' must be an integer"),
        (b'{"user_id":1,"item_id":true,"behavior":"pv","ts":3}', "'item_id' must be an integer"),
        (b'{"user_id":1,"item_id":2,"behavior":"pv","ts":1.5}', "'ts' must be an integer"),
        (b'{"user_id":1,"item_id":2,"behavior":"pv"}', "'ts' must be an integer"),
        (b'{"user_id":1,"item_id":2,"behavior":"pv","ts":%d}' % 2**63, "64-bit range"),
    ],
)
def test_parse_event_names_the_problem(value: bytes | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_event(value)


def test_generator_is_deterministic_and_bounded_in_disorder() -> None:
    a = generate_events(2000, users=50, items=30, seed=3, disorder_s=5)
    assert a == generate_events(2000, users=50, items=30, seed=3, disorder_s=5)
    assert a != generate_events(2000, users=50, items=30, seed=4, disorder_s=5)
    assert len(a) == 2000
    assert {e.behavior for e in a} == set(BEHAVIORS)
    assert all(1 <= e.user_id <= 50 and 1 <= e.item_id <= 30 for e in a)
    # delivery order: an event is never more than the disorder older than one before it
    latest = 0
    for e in a:
        assert e.ts > latest - 5_000
        latest = max(latest, e.ts)
    views = Counter(e.behavior for e in a)["pv"]
    assert views > 0.7 * len(a)  # views dominate, as in the Taobao data set


def test_generator_sessions_follow_the_pauses() -> None:
    events = generate_events(3000, users=40, seed=1, session_pause_s=20, idle_s=120)
    # with a gap between the in-session pause and the idle time, sessions are exactly
    # the generator's: 5 events on average
    sessions = reference_sessions(events, 60_000)
    assert sum(s.events for s in sessions) == 3000
    assert 3 < 3000 / len(sessions) < 7


@pytest.mark.parametrize(
    "kwargs",
    [{"users": 0}, {"items": 0}, {"session_pause_s": 0}, {"idle_s": 1, "session_pause_s": 2}],
)
def test_generator_refuses_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must"):
        generate_events(1, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count"):
        generate_events(-1)


def test_reference_windows_tumbling_and_sliding() -> None:
    events = [Event(1, 5, "pv", 0), Event(2, 5, "pv", 59_999), Event(1, 5, "buy", 60_000)]
    assert reference_windows(events, 60_000) == [
        WindowRow(0, 60_000, "pv", 5, 2),
        WindowRow(60_000, 120_000, "buy", 5, 1),
    ]
    sliding = reference_windows([Event(1, 5, "pv", 65_000)], 180_000, 60_000)
    assert [(w.start_ms, w.end_ms) for w in sliding] == [
        (-60_000, 120_000),
        (0, 180_000),
        (60_000, 240_000),
    ]
    with pytest.raises(ValueError, match="multiple"):
        reference_windows(events, 90_000, 60_000)


def test_reference_sessions_merge_overlapping_spans() -> None:
    events = [
        Event(1, 1, "pv", 0),
        Event(1, 2, "cart", 9_999),  # within the gap of the first: same session
        Event(1, 3, "buy", 19_999),  # exactly at the end: Spark still merges
        Event(1, 4, "pv", 30_000),  # after the end: a new session
        Event(2, 1, "fav", 5),
    ]
    assert reference_sessions(events, 10_000) == [
        SessionRow(1, 0, 29_999, 3, 1, 0, 1, 1),
        SessionRow(1, 30_000, 40_000, 1, 1, 0, 0, 0),
        SessionRow(2, 5, 10_005, 1, 0, 1, 0, 0),
    ]


@pytest.mark.parametrize(
    "kwargs",
    [{"tumbling_s": 0}, {"watermark_s": 10**9}, {"sliding_s": 90, "slide_s": 60}, {"slide_s": 1.5}],
)
def test_config_refuses_bad_durations(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must"):
        AnalyticsConfig(**kwargs)  # type: ignore[arg-type]


def _windows_table() -> pa.Table:
    t = pa.timestamp("us", tz="UTC")
    day1 = datetime(2026, 11, 21, 23, 59, tzinfo=UTC)
    day2 = datetime(2026, 11, 22, 0, 0, tzinfo=UTC)
    nxt = datetime(2026, 11, 22, 0, 1, tzinfo=UTC)
    return pa.table(
        {
            "window_start": pa.array([day2, day1, day2], t),
            "window_end": pa.array([nxt, day2, nxt], t),
            "behavior": ["pv", "buy", "cart"],
            "item_id": pa.array([9, 3, 9], pa.int64()),
            "count": pa.array([4, 1, 2], pa.int64()),
        }
    )


def test_write_results_one_file_per_day_and_identical_on_replay(tmp_path: Path) -> None:
    table = _windows_table()
    files = write_results(table, tmp_path, "tumbling", 7, task=3)
    assert [p.relative_to(tmp_path).as_posix() for p in files] == [
        "tumbling/dt=2026-11-21/part-00000007-00003.parquet",
        "tumbling/dt=2026-11-22/part-00000007-00003.parquet",
    ]
    first = {p: p.read_bytes() for p in files}
    assert pq.read_table(files[1])["behavior"].to_pylist() == ["cart", "pv"]  # sorted
    # a replay of the batch, rows in another order, writes the same bytes
    assert write_results(table.take([2, 0, 1]), tmp_path, "tumbling", 7, task=3) == files
    assert {p: p.read_bytes() for p in files} == first
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        ["tumbling", "dt=2026-11-21", "dt=2026-11-22", *[p.name for p in files]]
    )
    assert write_results(table.slice(0, 0), tmp_path, "tumbling", 8) == []


def _published(root: Path) -> dict[str, list[int]]:
    """Published files under `root` (relative names) -> their `count` column."""
    return {
        p.relative_to(root).as_posix(): pq.read_table(p)["count"].to_pylist()
        for p in sorted(root.rglob("part-*.parquet"))
    }


def test_a_replay_split_otherwise_replaces_the_batch_files_of_the_earlier_attempt(
    tmp_path: Path,
) -> None:
    """Batch 7 published by two tasks, then replayed by one task holding all its rows:
    only the replay's file of each day is left (an earlier attempt's file that the
    replay does not replace would be read twice), and so is a file of batch 7 in the
    layout before tasks wrote them (one per day); files of other batches stay."""
    table = _windows_table()  # rows 0 and 2 on 2026-11-22, row 1 on 2026-11-21
    day2 = tmp_path / "tumbling" / "dt=2026-11-22"
    write_results(table.take([1]), tmp_path, "tumbling", 6, task=0)  # another batch
    tasks = [(table.take([0]), 0), (table.take([2, 1]), 1)]
    publish_results([s for t, n in tasks for s in stage_results(t, tmp_path, "tumbling", 7, n)], 7)
    earlier_layout = day2 / "part-00000007.parquet"  # written on the driver, before
    pq.write_table(table.take([0]), earlier_layout)
    assert len(_published(tmp_path)) == 5
    stale = day2 / ".part-00000007-00001.parquet.tmp-0123"  # left by a crashed attempt
    stale.write_bytes(b"x")
    os.utime(stale, (time.time() - STALE_TMP_S - 60,) * 2)
    young = day2 / ".part-00000009-00000.parquet.tmp-4567"  # an attempt in flight
    young.write_bytes(b"x")

    staged = stage_results(table, tmp_path, "tumbling", 7, 0)
    assert all(s.tmp.name.startswith(".") and s.tmp.exists() for s in staged)
    publish_results(staged, 7)
    assert _published(tmp_path) == {
        "tumbling/dt=2026-11-21/part-00000006-00000.parquet": [1],
        "tumbling/dt=2026-11-21/part-00000007-00000.parquet": [1],
        "tumbling/dt=2026-11-22/part-00000007-00000.parquet": [2, 4],
    }
    assert not stale.exists()
    assert young.exists()


def test_a_failed_publish_removes_the_temporaries_it_did_not_publish(tmp_path: Path) -> None:
    table = _windows_table()
    staged = stage_results(table, tmp_path, "sliding", 3, 1)
    staged[1].path.mkdir(parents=True)  # a directory where the second file goes
    with pytest.raises(OSError, match="directory"):
        publish_results(staged, 3)
    assert staged[0].path.exists()  # published before the failure: the replay replaces it
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()]


def test_result_messages_are_json_with_millisecond_times() -> None:
    messages = result_messages(_windows_table(), "sliding")
    docs = [json.loads(v) for _, v in messages]
    assert [k for k, _ in messages] == [b"3", b"9", b"9"]
    assert docs[0] == {
        "kind": "sliding",
        "window_start": 1_795_305_540_000,
        "window_end": 1_795_305_600_000,
        "behavior": "buy",
        "item_id": 3,
        "count": 1,
    }
    with pytest.raises(ValueError, match="rejected"):
        result_messages(_windows_table(), "rejected")


def _sessions_table() -> pa.Table:
    t = pa.timestamp("us", tz="UTC")
    start = datetime(2026, 11, 22, 10, 0, 0, 123_000, tzinfo=UTC)
    return pa.table(
        {
            "user_id": pa.array([7, -3, None, 2**62], pa.int64()),
            "session_start": pa.array([start, start, start, None], t),
            "session_end": pa.array([start] * 4, pa.timestamp("us")),  # naive: UTC
            "events": pa.array([2, 1, 1, 5], pa.int64()),
            "note": pa.array(['a"b', "caf\u00e9", None, "\n"], pa.string()),
        }
    )


@pytest.mark.parametrize(
    ("kind", "table"), [("tumbling", _windows_table), ("session", _sessions_table)]
)
def test_message_batch_holds_the_bytes_of_result_messages(kind: str, table: Any) -> None:
    """The column-wise encoding (what the tasks send) gives the same keys and JSON values
    as the row-wise one, nulls, negative and large ids, escapes and sub-second times
    included; the tag is the kind."""
    rows = table()
    batch = message_batch(rows, kind)  # type: ignore[arg-type]
    expected = result_messages(rows, kind)  # type: ignore[arg-type]
    assert batch.column("key").to_pylist() == [k for k, _ in expected]
    assert batch.column("value").to_pylist() == [v for _, v in expected]
    assert batch.column("tag").to_pylist() == [kind] * rows.num_rows
    assert json.loads(expected[0][1])["kind"] == kind
    assert message_batch(rows.slice(0, 0), kind).num_rows == 0  # type: ignore[arg-type]


def test_a_collected_batch_splits_into_one_table_per_kind() -> None:
    """The single query's rows (`kind` and one struct column per kind, the others null)
    become the tables the outputs write, each with its kind's columns only."""
    start = datetime(2025, 11, 22, tzinfo=UTC)
    window = pa.struct([("window_start", pa.timestamp("us", tz="UTC")), ("count", pa.int64())])
    session = pa.struct([("user_id", pa.int64()), ("events", pa.int64())])
    rejected = pa.struct([("offset", pa.int64()), ("value", pa.binary())])
    w = {"window_start": start, "count": 3}
    table = pa.table(
        {
            "kind": ["tumbling", "session", "rejected", "tumbling", "sliding"],
            "tumbling": pa.array([w, None, None, {**w, "count": 4}, None], window),
            "sliding": pa.array([None, None, None, None, w], window),
            "session": pa.array([None, {"user_id": 7, "events": 2}, None, None, None], session),
            "rejected": pa.array([None, None, {"offset": 5, "value": b"x"}, None, None], rejected),
        }
    )
    tables = split_kinds(table)
    assert tables["tumbling"].to_pylist() == [w, {**w, "count": 4}]
    assert tables["sliding"].to_pylist() == [w]
    assert tables["session"].to_pylist() == [{"user_id": 7, "events": 2}]
    assert tables["rejected"].to_pylist() == [{"offset": 5, "value": b"x"}]
    empty = split_kinds(table.slice(0, 0))
    assert empty["session"].num_rows == 0
    assert empty["session"].column_names == ["user_id", "events"]


def test_what_a_task_answers_reads_back_on_the_driver(tmp_path: Path) -> None:
    """A task's descriptors (staged files, transaction refs, counts) travel as one Arrow
    batch of DESCRIPTOR_SCHEMA, whose DDL and Arrow forms agree, and read back whole."""
    results = stage_results(_windows_table(), tmp_path, "sliding", 4, 2)
    rejected = stage_table(
        pa.table(
            {
                "topic": ["t", "t"],
                "partition": pa.array([1, 1], pa.int32()),
                "offset": pa.array([5, 9], pa.int64()),
                "timestamp": pa.array([datetime(2026, 11, 22, 3, tzinfo=UTC)] * 2),
                "value": [b"x", b"y"],
            }
        ),
        tmp_path / "rejected",
    )
    refs = [("127.0.0.1:1", "txn-a"), ("127.0.0.1:2", "txn-b")]
    rows = descriptor_rows(results, rejected, refs, {"sliding": 3, "rejected": 2}, 3)
    batch = pa.RecordBatch.from_pylist(rows, DESCRIPTOR_ARROW)
    ddl = [field.split(" ") for field in DESCRIPTOR_SCHEMA.split(", ")]
    spark_types = {"string": pa.string(), "bigint": pa.int64()}
    assert [(n, spark_types[t]) for n, t in ddl] == [(f.name, f.type) for f in batch.schema]

    done = BatchDescriptors.of(batch.to_pylist())
    assert done.results == results
    assert done.rejected == rejected
    assert done.refs == refs
    assert done.rows == {"sliding": 3, "rejected": 2}
    assert done.sent == 3
    done.remove_temporaries()
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
