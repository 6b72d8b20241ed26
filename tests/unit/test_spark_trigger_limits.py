"""When the Spark source plans a micro-batch: `minOffsetsPerTrigger` with
`maxTriggerDelay` under `maxOffsetsPerTrigger` (Kafka's rule), as a pure decision and as
`latestOffset`'s answer over time. Time is a ManualClock; no JVM, no sleep."""

from __future__ import annotations

import json

import pytest

from tidemq.spark.offsets import Bounds, TopicQueue, next_offset, to_json, trigger_time_ms
from tidemq.spark.trigger_limits import (
    Admission,
    TriggerLimits,
    admit,
    parse_duration_ms,
    trigger_limits,
)
from tidemq.testing.clock import ManualClock

PLAN, WAIT = Admission.PLAN, Admission.WAIT


@pytest.mark.parametrize(
    ("rows", "elapsed_ms", "min_offsets", "delay_ms", "decision"),
    [
        (1, 0, None, 2_000, PLAN),  # no minimum: as before
        (0, 0, None, 2_000, PLAN),  # (offsets that move without rows: new queues)
        (100, 0, 100, 2_000, PLAN),  # the minimum reached
        (250, 0, 100, 2_000, PLAN),
        (99, 0, 100, 2_000, WAIT),
        (99, 1_999, 100, 2_000, WAIT),
        (99, 2_000, 100, 2_000, PLAN),  # the delay over: fewer rows
        (1, 3_600_000, 100, 2_000, PLAN),
        (0, 2_000, 100, 2_000, PLAN),  # a new queue only: enters after the delay
        (0, 0, 100, 0, PLAN),  # maxTriggerDelay=0: never waits
        (99, -1, 100, 2_000, PLAN),  # the clock went back: no unbounded wait
    ],
)
def test_admit_is_a_table(
    rows: int, elapsed_ms: int, min_offsets: int | None, delay_ms: int, decision: Admission
) -> None:
    assert (
        admit(rows, elapsed_ms, min_offsets=min_offsets, max_trigger_delay_ms=delay_ms) is decision
    )


@pytest.mark.parametrize(
    ("text", "ms"),
    [("15m", 900_000), ("30s", 30_000), ("500ms", 500), ("2min", 120_000), ("1h", 3_600_000),
     ("2d", 172_800_000), ("1500us", 1), ("999us", 0), ("42", 42), (" 10S ", 10_000)],
)  # fmt: skip
def test_durations_as_spark_writes_them(text: str, ms: int) -> None:
    assert parse_duration_ms("maxTriggerDelay", text) == ms


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("", "must be a duration like '15m'"),
        ("1.5s", "must be a duration"),
        ("15 m", "must be a duration"),
        ("15 minutes", "must be a duration"),
        ("5y", "must be a duration"),
        ("m", "must be a duration"),
        ("-3s", "must not be negative"),
    ],
)
def test_bad_durations_are_named(text: str, named: str) -> None:
    with pytest.raises(ValueError, match="option 'maxTriggerDelay'") as info:
        parse_duration_ms("maxTriggerDelay", text)
    assert named in str(info.value)


def test_limits_are_checked_together() -> None:
    assert trigger_limits(None, None, None) == TriggerLimits()
    assert trigger_limits(10, None, "2s") == TriggerLimits(10, None, 2_000)
    assert trigger_limits(10, 10, None) == TriggerLimits(10, 10, 15 * 60_000)
    with pytest.raises(ValueError, match="'maxTriggerDelay' needs 'minOffsetsPerTrigger'"):
        trigger_limits(None, 10, "2s")
    with pytest.raises(ValueError, match=r"'minOffsetsPerTrigger' \(11\) must be at most"):
        trigger_limits(11, 10, None)


A: TopicQueue = ("a", 0)
B: TopicQueue = ("a", 1)
MIN_100 = TriggerLimits(min_offsets=100, max_trigger_delay_ms=2_000)


def ends(offset: dict[str, object]) -> dict[str, object]:
    topics = offset["topics"]
    assert isinstance(topics, dict)
    return topics


def test_waits_for_the_minimum_then_plans_and_stamps() -> None:
    clock = ManualClock()
    started = clock.now_ms()
    start = to_json({A: 0, B: 0})

    def latest(a_end: int, b_end: int, limits: TriggerLimits = MIN_100) -> dict[str, object]:
        bounds = {A: Bounds(0, a_end), B: Bounds(0, b_end)}
        return next_offset(start, bounds, limits=limits, now_ms=clock.now_ms(), started_ms=started)

    # 40 + 20 offsets, fewer than 100: Spark gets its start back, as the same JSON text.
    assert json.dumps(latest(40, 20)) == json.dumps(start)
    clock.advance(1_999)
    assert latest(40, 20) == start
    # 100 across the queues: planned at once, stamped with the time it was planned.
    end = latest(60, 40)
    assert ends(end) == {"a": {"0": 60, "1": 40}}
    assert trigger_time_ms(end) == clock.now_ms()
    # The upper bound still holds (split in proportion), and the minimum is met by it.
    bounded = latest(600, 200, TriggerLimits(100, 150, 2_000))
    assert ends(bounded) == {"a": {"0": 113, "1": 37}}
    # Without a minimum: the offsets of before, no stamp.
    assert latest(40, 20, TriggerLimits()) == to_json({A: 40, B: 20})


def test_the_delay_plans_fewer_than_the_minimum() -> None:
    clock = ManualClock()
    started = clock.now_ms()
    start = to_json({A: 0})
    bounds = {A: Bounds(0, 7)}
    assert (
        next_offset(start, bounds, limits=MIN_100, now_ms=clock.now_ms(), started_ms=started)
        == start
    )
    clock.advance(2_000)
    end = next_offset(start, bounds, limits=MIN_100, now_ms=clock.now_ms(), started_ms=started)
    assert ends(end) == {"a": {"0": 7}}
    assert trigger_time_ms(end) == clock.now_ms()
    # The next batch's delay counts from this plan, not from the reader's start.
    clock.advance(1_000)
    more = {A: Bounds(0, 9)}
    assert next_offset(end, more, limits=MIN_100, now_ms=clock.now_ms(), started_ms=started) == end
    clock.advance(1_000)
    again = next_offset(end, more, limits=MIN_100, now_ms=clock.now_ms(), started_ms=started)
    assert ends(again) == {"a": {"0": 9}}


def test_no_data_is_no_batch_whatever_the_delay() -> None:
    clock = ManualClock()
    start = to_json({A: 5}, trigger_ms=clock.now_ms())
    clock.advance(3_600_000)
    bounds = {A: Bounds(0, 5)}
    for limits in (MIN_100, TriggerLimits()):
        answer = next_offset(start, bounds, limits=limits, now_ms=clock.now_ms(), started_ms=0)
        assert json.dumps(answer) == json.dumps(start)  # the stamp stays as it was


def test_a_restarted_driver_counts_from_the_checkpointed_plan_time() -> None:
    """The offset Spark logged for the last batch carries its plan time: a driver
    restarted 500 ms after it still waits 1.5 s; one restarted after the delay plans at
    once. A start without a stamp (a checkpoint of a query that had no minimum) counts
    from the reader's start."""
    clock = ManualClock()
    logged = to_json({A: 10}, trigger_ms=clock.now_ms())
    bounds = {A: Bounds(0, 30)}
    clock.advance(500)
    restarted = clock.now_ms()
    answer = next_offset(logged, bounds, limits=MIN_100, now_ms=restarted, started_ms=restarted)
    assert answer == logged
    clock.advance(1_500)
    answer = next_offset(
        logged, bounds, limits=MIN_100, now_ms=clock.now_ms(), started_ms=restarted
    )
    assert ends(answer) == {"a": {"0": 30}}

    unstamped = to_json({A: 10})
    assert trigger_time_ms(unstamped) is None
    now = clock.now_ms()
    assert next_offset(unstamped, bounds, limits=MIN_100, now_ms=now, started_ms=now) == unstamped
    later = now + 2_000
    assert ends(next_offset(unstamped, bounds, limits=MIN_100, now_ms=later, started_ms=now)) == {
        "a": {"0": 30}
    }


def test_a_plan_time_ahead_of_the_clock_does_not_hold_data_back() -> None:
    clock = ManualClock()
    logged = to_json({A: 0}, trigger_ms=clock.now_ms() + 3_600_000)  # another machine's clock
    answer = next_offset(
        logged, {A: Bounds(0, 1)}, limits=MIN_100, now_ms=clock.now_ms(), started_ms=0
    )
    assert ends(answer) == {"a": {"0": 1}}


def test_a_new_queue_counts_once_it_is_in_the_offsets() -> None:
    """A queue new to the start enters at its earliest offset with no rows (it is read
    from the batch after): its messages do not count towards the minimum until then."""
    clock = ManualClock()
    started = clock.now_ms()
    start = to_json({A: 0})
    bounds = {A: Bounds(0, 10), B: Bounds(0, 500)}
    assert next_offset(start, bounds, limits=MIN_100, now_ms=started, started_ms=started) == start
    clock.advance(2_000)
    entered = next_offset(start, bounds, limits=MIN_100, now_ms=clock.now_ms(), started_ms=started)
    assert ends(entered) == {"a": {"0": 10, "1": 0}}
    read = next_offset(entered, bounds, limits=MIN_100, now_ms=clock.now_ms(), started_ms=started)
    assert ends(read) == {"a": {"0": 10, "1": 500}}


def test_a_bad_stamp_is_refused() -> None:
    with pytest.raises(ValueError, match="bad triggerMs"):
        trigger_time_ms({"v": 1, "topics": {}, "triggerMs": "soon"})


def test_the_default_read_limit_names_the_rule() -> None:
    """What the stream reader tells Spark (which hands it back to `latestOffset`, or asks
    for everything under Trigger.Once): the minimum when there is one, else the maximum."""
    pytest.importorskip("pyspark")
    from pyspark.sql.streaming.datasource import (  # noqa: PLC0415
        ReadAllAvailable,
        ReadMaxRows,
        ReadMinRows,
    )

    from tidemq.spark.source import TidemqStreamReader, spark_schema  # noqa: PLC0415

    def default(**given: str) -> object:
        options = {"bootstrap": "127.0.0.1:9876", "subscribe": "t", **given}
        return TidemqStreamReader(options, spark_schema()).getDefaultReadLimit()

    assert default() == ReadAllAvailable()
    assert default(maxOffsetsPerTrigger="9") == ReadMaxRows(9)
    assert default(minOffsetsPerTrigger="5") == ReadMinRows(5)
    assert default(minOffsetsPerTrigger="5", maxOffsetsPerTrigger="9") == ReadMinRows(5)
