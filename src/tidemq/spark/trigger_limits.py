"""When a streaming micro-batch may be planned: Kafka's `minOffsetsPerTrigger` with
`maxTriggerDelay`, under the upper bound `maxOffsetsPerTrigger`. Pure Python: no pyspark,
no I/O, no clock (the time is an argument).

The rule, as Kafka's source words it: a micro-batch waits while fewer than
`minOffsetsPerTrigger` new offsets are available and less than `maxTriggerDelay` has
passed since the last micro-batch was planned; once either holds, the batch reads what
is there, at most `maxOffsetsPerTrigger` (so `min <= max`). `admit` is that decision,
a table of (rows, elapsed, limits) -> PLAN or WAIT; `offsets.next_offset` applies it
and keeps the time of the last plan in the offset itself (Spark's checkpoint), so a
restarted driver counts the delay from the last batch it planned.

Durations are written as Spark writes them (`JavaUtils.timeStringAs`): an integer and a
unit, `us`, `ms`, `s`, `m` or `min`, `h`, `d` ("15m", "30s", "500ms"); a bare integer is
milliseconds.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_MAX_TRIGGER_DELAY_MS",
    "Admission",
    "TriggerLimits",
    "admit",
    "parse_duration_ms",
    "trigger_limits",
]

#: Kafka's default `maxTriggerDelay` (15m).
DEFAULT_MAX_TRIGGER_DELAY_MS: Final = 15 * 60_000

_MICROS_PER_UNIT: Final = {
    "us": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60_000_000,
    "min": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
}
_DURATION: Final = re.compile(r"(-?[0-9]+)([a-z]+)?")


def parse_duration_ms(option: str, text: str) -> int:
    """`text` ("15m", "30s", "500ms", "2000") in milliseconds (microseconds round down,
    as Spark's `timeStringAsMs` does). A ValueError names `option` and what is wrong."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None or (match.group(2) is not None and match.group(2) not in _MICROS_PER_UNIT):
        raise ValueError(
            f"option {option!r} must be a duration like '15m', '30s' or '500ms' (an integer "
            f"and one of the units {', '.join(_MICROS_PER_UNIT)}; no unit: milliseconds), "
            f"got {text!r}"
        )
    value = int(match.group(1))
    if value < 0:
        raise ValueError(f"option {option!r} must not be negative, got {text!r}")
    return value * _MICROS_PER_UNIT[match.group(2) or "ms"] // 1_000


@dataclass(frozen=True, slots=True)
class TriggerLimits:
    """The read limits of one `latestOffset` call: none, an upper bound, a lower bound
    with its delay, or both (`trigger_limits` checks them; Spark's engine may also ask for
    everything, `TriggerLimits()`)."""

    min_offsets: int | None = None
    max_offsets: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS


def trigger_limits(
    min_offsets: int | None, max_offsets: int | None, delay_text: str | None
) -> TriggerLimits:
    """The limits of the options `minOffsetsPerTrigger` (>= 1, parsed), `maxOffsetsPerTrigger`
    (>= 1, parsed) and `maxTriggerDelay` (text). Like Kafka's source, a delay without a
    minimum is refused (it would do nothing); unlike it, a minimum above the maximum is too
    (no micro-batch could satisfy both)."""
    if delay_text is not None and min_offsets is None:
        raise ValueError(
            "option 'maxTriggerDelay' needs 'minOffsetsPerTrigger': it bounds how long a "
            "micro-batch waits for that many offsets"
        )
    if min_offsets is not None and max_offsets is not None and min_offsets > max_offsets:
        raise ValueError(
            f"option 'minOffsetsPerTrigger' ({min_offsets}) must be at most "
            f"'maxOffsetsPerTrigger' ({max_offsets}): a micro-batch reads at most the maximum"
        )
    delay_ms = (
        DEFAULT_MAX_TRIGGER_DELAY_MS
        if delay_text is None
        else parse_duration_ms("maxTriggerDelay", delay_text)
    )
    return TriggerLimits(min_offsets, max_offsets, delay_ms)


class Admission(enum.Enum):
    PLAN = "plan"  # plan the micro-batch now
    WAIT = "wait"  # no micro-batch yet: answer Spark with the start offset


def admit(
    rows: int, elapsed_ms: int, *, min_offsets: int | None, max_trigger_delay_ms: int
) -> Admission:
    """Whether a micro-batch that would read `rows` offsets is planned now, `elapsed_ms`
    after the last one was (the caller knows the batch would change the offsets).

    ==========================  =========================  ========
    min_offsets                 elapsed_ms                 decision
    ==========================  =========================  ========
    None                        any                        PLAN
    <= rows                     any                        PLAN
    > rows                      < 0 (clock stepped back)   PLAN
    > rows                      >= max_trigger_delay_ms    PLAN
    > rows                      0 .. delay - 1             WAIT
    ==========================  =========================  ========

    A negative elapsed time (the wall clock went back, or the checkpoint moved to a
    machine whose clock is behind) plans at once: waiting for the clock to catch up could
    hold data back far longer than the delay, while planning early costs one small batch.
    """
    if min_offsets is None or rows >= min_offsets:
        return Admission.PLAN
    if elapsed_ms < 0 or elapsed_ms >= max_trigger_delay_ms:
        return Admission.PLAN
    return Admission.WAIT
