"""DataFrame rows (Arrow batches) grouped into send_batch calls by the Spark sink. No JVM."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tidemq.cluster.route import queue_for_key
from tidemq.spark.write import (
    MAX_GROUP_BYTES,
    MAX_GROUP_MESSAGES,
    SendGroup,
    check_write_columns,
    group_rows,
)


class FakeRoutes:
    """Two topics: "a" with 4 queues, "b" with 2."""

    counts = {"a": 4, "b": 2}  # noqa: RUF012

    def queue_count(self, topic: str) -> int:
        return self.counts[topic]

    def select_queue(self, topic: str, key: bytes | None, round_robin_counter: int) -> int:
        if key is not None:
            return queue_for_key(key, self.counts[topic])
        return round_robin_counter % self.counts[topic]


ROUTES = FakeRoutes()


def rows_of(groups: list[SendGroup]) -> list[tuple[str, int, bytes | None]]:
    return [(g.topic, g.queue, v) for g in groups for v in g.values]


def test_unkeyed_rows_stay_together_in_one_batch() -> None:
    batch = pa.RecordBatch.from_pydict({"value": [b"x%d" % i for i in range(100)]})
    groups = group_rows(batch, topic="a", routes=ROUTES, counter=2)
    assert len(groups) == 1
    assert (groups[0].topic, groups[0].queue) == ("a", 2)
    assert groups[0].values == [b"x%d" % i for i in range(100)]
    assert groups[0].keys is None
    assert groups[0].tags is None
    assert groups[0].headers is None


def test_rows_go_to_their_partition_or_key_queue_in_order() -> None:
    keys = [b"k%d" % (i % 7) for i in range(50)]
    batch = pa.RecordBatch.from_pydict(
        {
            "value": [f"v{i}" for i in range(50)],  # strings are sent as UTF-8
            "key": keys,
            "partition": [1 if i % 5 == 0 else None for i in range(50)],
            "tag": ["t"] * 50,
        }
    )
    groups = group_rows(batch, topic="a", routes=ROUTES)
    expected: dict[int, list[bytes]] = {}
    for i in range(50):
        q = 1 if i % 5 == 0 else queue_for_key(keys[i], 4)
        expected.setdefault(q, []).append(f"v{i}".encode())
    got: dict[int, list[bytes | None]] = {}
    for g in groups:
        assert g.tags is not None
        assert set(g.tags) == {"t"}
        assert g.keys is not None
        assert len(g.keys) == len(g.values)
        got.setdefault(g.queue, []).extend(g.values)
    assert got == expected


def test_topic_column_and_headers_runs() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "value": [b"1", b"2", b"3", b"4"],
            "topic": ["a", "b", "a", "a"],
            "partition": [0, 1, 0, 0],
            "headers": [
                [{"key": "h", "value": b"x"}],
                [],
                [{"key": "h", "value": b"x"}],
                [{"key": "h", "value": b"y"}],
            ],
        }
    )
    groups = group_rows(batch, topic=None, routes=ROUTES)
    assert [(g.topic, g.queue, g.values, g.headers) for g in groups] == [
        ("a", 0, [b"1", b"3"], {"h": b"x"}),
        ("a", 0, [b"4"], {"h": b"y"}),
        ("b", 1, [b"2"], None),
    ]
    # The topic option overrides the column.
    assert {g.topic for g in group_rows(batch, topic="b", routes=ROUTES)} == {"b"}


def test_groups_are_cut_by_count_and_size() -> None:
    n = MAX_GROUP_MESSAGES + 10
    groups = group_rows(pa.RecordBatch.from_pydict({"value": [b"x"] * n}), topic="a", routes=ROUTES)
    assert [len(g.values) for g in groups] == [MAX_GROUP_MESSAGES, 10]
    big = b"y" * (MAX_GROUP_BYTES // 3)
    values = [big] * 7 + [b"z" * (MAX_GROUP_BYTES * 2)]
    groups = group_rows(pa.RecordBatch.from_pydict({"value": values}), topic="a", routes=ROUTES)
    assert [len(g.values) for g in groups] == [2, 2, 2, 1, 1]
    assert rows_of(groups) == [("a", 0, v) for v in values]


def test_bad_rows_are_refused_with_their_number() -> None:
    batch = pa.RecordBatch.from_pydict({"value": [b"1", b"2"], "partition": [0, 9]})
    with pytest.raises(ValueError, match="row 1: partition 9 does not exist in topic 'b'"):
        group_rows(batch, topic="b", routes=ROUTES)
    no_topic = pa.RecordBatch.from_pydict({"value": [b"1"], "topic": pa.array([None], pa.string())})
    with pytest.raises(ValueError, match="row 0 has a null topic"):
        group_rows(no_topic, topic=None, routes=ROUTES)
    with pytest.raises(ValueError, match="set the option 'topic'"):
        group_rows(pa.RecordBatch.from_pydict({"value": [b"1"]}), topic=None, routes=ROUTES)


def test_columns_are_checked() -> None:
    check_write_columns({"value": pa.binary(), "key": pa.string(), "other": pa.int8()})
    with pytest.raises(ValueError, match="needs a 'value' column"):
        check_write_columns({"key": pa.binary()})
    with pytest.raises(ValueError, match="column 'key' must be binary or string"):
        check_write_columns({"value": pa.binary(), "key": pa.int32()})
    with pytest.raises(ValueError, match="column 'partition' must be an int"):
        check_write_columns({"value": pa.binary(), "partition": pa.string()})
    with pytest.raises(ValueError, match="column 'headers' must be"):
        check_write_columns({"value": pa.binary(), "headers": pa.list_(pa.string())})
