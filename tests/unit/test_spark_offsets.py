"""Stream offsets and micro-batch planning of the Spark source. No JVM."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.core.errors import OffsetOutOfRange
from tidemq.spark.offsets import (
    Bounds,
    TopicQueue,
    dumps,
    from_json,
    next_end,
    proportional_share,
    resolve_positions,
    to_json,
)
from tidemq.spark.options import OffsetSpec, OptionError

queues = st.tuples(st.sampled_from(["a", "b", "orders", "z.1"]), st.integers(0, 20))
position_maps = st.dictionaries(queues, st.integers(0, 2**53), max_size=12)


def test_offset_json_is_versioned_sorted_and_deterministic() -> None:
    positions = {("orders", 10): 5, ("orders", 2): 7, ("clicks", 0): 1}
    assert dumps(positions) == (
        '{"v": 1, "topics": {"clicks": {"0": 1}, "orders": {"2": 7, "10": 5}}}'
    )
    # The same text whatever order the dict was built in (Spark compares the text).
    assert dumps(dict(reversed(list(positions.items())))) == dumps(positions)
    assert json.dumps(to_json(positions)) == dumps(positions)


@given(position_maps)
def test_offset_json_round_trips(positions: dict[TopicQueue, int]) -> None:
    text = dumps(positions)
    assert from_json(json.loads(text)) == positions
    assert from_json(text) == positions
    assert dumps(from_json(json.loads(text))) == text


@pytest.mark.parametrize(
    "bad",
    [
        {"topics": {}},
        {"v": 2, "topics": {}},
        {"v": 1},
        {"v": 1, "topics": {"t": [1]}},
        {"v": 1, "topics": {"t": {"x": 1}}},
        {"v": 1, "topics": {"t": {"0": -1}}},
        {"v": 1, "topics": {"t": {"0": True}}},
        [1, 2],
        "not json",
    ],
)
def test_bad_offsets_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="tidemq source offset"):
        from_json(bad)


@given(st.dictionaries(queues, st.integers(0, 1000), max_size=10), st.integers(0, 5000))
def test_the_limit_is_split_in_proportion(available: dict[TopicQueue, int], limit: int) -> None:
    share = proportional_share(available, limit)
    total = sum(available.values())
    assert set(share) == set(available)
    assert sum(share.values()) == min(limit, total)
    for tq, n in share.items():
        assert 0 <= n <= available[tq]
        if total > limit:
            # Within one row of the exact proportion.
            assert abs(n * total - limit * available[tq]) < total
    assert proportional_share(dict(reversed(list(available.items()))), limit) == share


def test_proportional_share_examples() -> None:
    available = {("t", 0): 10, ("t", 1): 1000, ("t", 2): 1000}
    assert proportional_share(available, 310) == {("t", 0): 2, ("t", 1): 154, ("t", 2): 154}
    assert proportional_share(available, 5) == {("t", 0): 0, ("t", 1): 3, ("t", 2): 2}
    assert proportional_share(available, 0) == {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}
    assert proportional_share(available, 5000) == available


def test_queues_go_through_a_skewed_backlog_together() -> None:
    """The event-time case: with a max-min split the small queue was read whole in the
    first batch; in proportion each batch takes the same share of every queue."""
    start = {("t", 0): 0, ("t", 1): 0}
    bounds = {("t", 0): Bounds(0, 10_000), ("t", 1): Bounds(0, 100)}
    seen = []
    while start != {tq: bq.max_offset for tq, bq in bounds.items()}:
        end = next_end(start, bounds, max_rows=1_000)
        seen.append((end[("t", 0)] / 10_000, end[("t", 1)] / 100))
        start = end
    assert len(seen) == 11
    for done_big, done_small in seen:
        assert abs(done_big - done_small) <= 0.011


def b(lo: int, hi: int) -> Bounds:
    return Bounds(lo, hi)


def test_next_end_reads_everything_without_limit() -> None:
    start = {("t", 0): 5, ("t", 1): 0}
    end = next_end(start, {("t", 0): b(0, 50), ("t", 1): b(0, 7)})
    assert end == {("t", 0): 50, ("t", 1): 7}


def test_next_end_honours_max_rows_in_proportion() -> None:
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 95}
    bounds = {("t", 0): b(0, 1000), ("t", 1): b(0, 1000), ("t", 2): b(0, 100)}
    end = next_end(start, bounds, max_rows=105)
    assert end == {("t", 0): 53, ("t", 1): 52, ("t", 2): 95}
    assert sum(end[tq] - start[tq] for tq in start) == 105


def test_new_queues_enter_at_their_earliest_and_are_read_next() -> None:
    start = {("t", 0): 10}
    bounds = {("t", 0): b(0, 10), ("t", 1): b(3, 9), ("u", 0): b(0, 4)}
    end = next_end(start, bounds, max_rows=100)
    assert end == {("t", 0): 10, ("t", 1): 3, ("u", 0): 0}
    # The next batch reads them, from the logged entry offsets.
    assert next_end(end, bounds) == {("t", 0): 10, ("t", 1): 9, ("u", 0): 4}


def test_unavailable_queues_keep_their_position() -> None:
    start = {("t", 0): 10, ("t", 1): 4}
    assert next_end(start, {("t", 0): b(0, 12)}) == {("t", 0): 12, ("t", 1): 4}


def test_available_now_targets_freeze_the_end() -> None:
    start = {("t", 0): 0, ("t", 1): 0}
    bounds = {("t", 0): b(0, 100), ("t", 1): b(0, 100), ("t", 2): b(0, 100)}
    targets = {("t", 0): 30, ("t", 1): 100}  # t/2 appeared after the targets were set
    first = next_end(start, bounds, targets=targets, max_rows=40)
    assert first == {("t", 0): 9, ("t", 1): 31}  # 30 and 100 to read: 40 in proportion
    second = next_end(first, bounds, targets=targets, max_rows=40)
    assert second == {("t", 0): 18, ("t", 1): 62}
    end = second
    while True:
        following = next_end(end, bounds, targets=targets, max_rows=40)
        if following == end:
            break
        end = following
    assert end == {("t", 0): 30, ("t", 1): 100}


def test_replay_plans_the_same_end() -> None:
    start = {("t", 0): 3, ("t", 1): 9}
    bounds = {("t", 0): b(0, 500), ("t", 1): b(0, 20), ("t", 2): b(1, 5)}
    assert next_end(start, bounds, max_rows=77) == next_end(dict(start), bounds, max_rows=77)
    assert dumps(next_end(start, bounds, max_rows=77)) == dumps(
        next_end(dict(reversed(list(start.items()))), bounds, max_rows=77)
    )


def test_queue_that_shrank_is_data_loss() -> None:
    start = {("t", 0): 50}
    with pytest.raises(OffsetOutOfRange, match="t/0 now ends at offset 10, before the position 50"):
        next_end(start, {("t", 0): b(0, 10)})
    assert next_end(start, {("t", 0): b(2, 10)}, fail_on_data_loss=False) == {("t", 0): 2}


def test_resolve_positions() -> None:
    bounds = {("t", 0): b(5, 50), ("t", 1): b(0, 10)}
    assert resolve_positions(
        OffsetSpec("earliest"), bounds, option="startingOffsets", default="latest"
    ) == {("t", 0): 5, ("t", 1): 0}
    assert resolve_positions(
        OffsetSpec("latest"), bounds, option="startingOffsets", default="latest"
    ) == {("t", 0): 50, ("t", 1): 10}
    spec = OffsetSpec("offsets", (("t", ((0, 7),)),))
    assert resolve_positions(spec, bounds, option="startingOffsets", default="earliest") == {
        ("t", 0): 7,
        ("t", 1): 0,
    }
    assert resolve_positions(spec, bounds, option="startingOffsets", default="latest") == {
        ("t", 0): 7,
        ("t", 1): 10,
    }
    minus = OffsetSpec("offsets", (("t", ((0, -1), (1, -2))),))
    assert resolve_positions(minus, bounds, option="x", default="earliest") == {
        ("t", 0): 50,
        ("t", 1): 0,
    }
    ts = OffsetSpec("timestamp", timestamp_ms=1)
    times = {("t", 0): 30, ("t", 1): 10}
    assert resolve_positions(ts, bounds, option="x", default="latest", times=times) == times
    per_queue = OffsetSpec("timestamps", (("t", ((0, 123),)),))  # queue 1 left out
    assert resolve_positions(
        per_queue, bounds, option="x", default="latest", times={("t", 0): 30}
    ) == {("t", 0): 30, ("t", 1): 10}
    past = OffsetSpec("offsets", (("t", ((1, 11),)),))
    with pytest.raises(
        OptionError,
        match=r"'endingOffsets': offset 11 of t/1 is past the queue's end \(10\): the queue "
        r"holds offsets 0 to 9\. Give an offset of at most 10, or -1 for the queue's end",
    ):
        resolve_positions(past, bounds, option="endingOffsets", default="latest")
