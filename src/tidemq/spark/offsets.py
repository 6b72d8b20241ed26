"""Source offsets and the arithmetic of micro-batches. Pure Python: no pyspark, no I/O.

A stream's offset is, per (topic, queue), the next offset to read. Spark stores it in the
checkpoint as the JSON `to_json` returns and compares offsets *as JSON text*, so the text
must be deterministic: topics sorted by name, queues by number, nothing else varying::

    {"v": 1, "topics": {"orders": {"0": 1234, "1": 977}}}

With `minOffsetsPerTrigger`, the offset ending a micro-batch also records when that batch
was planned (ms since the epoch, `triggerMs`, last), so that the wait for the next one
counts from it across driver restarts (`next_offset`)::

    {"v": 1, "topics": {"orders": {"0": 1234, "1": 977}}, "triggerMs": 1700000000000}

Micro-batch planning (`next_end`) is a function of the start offset, the queues' bounds
and the read limit only, so a replayed batch (same start, same end from the offset log)
reads exactly the same ranges. Queues seen for the first time enter the end offset at
their earliest offset and are read from the next batch on: every range read is then
(start, end) of two logged offsets, never "earliest at the time of reading".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final, Literal, NamedTuple

from tidemq.core.errors import OffsetOutOfRange
from tidemq.spark.options import EARLIEST, LATEST, OffsetSpec, OptionError
from tidemq.spark.trigger_limits import Admission, TriggerLimits, admit

__all__ = [
    "VERSION",
    "Bounds",
    "Positions",
    "TopicQueue",
    "dumps",
    "from_json",
    "next_end",
    "next_offset",
    "proportional_share",
    "resolve_positions",
    "to_json",
    "trigger_time_ms",
]

VERSION: Final = 1
TopicQueue = tuple[str, int]
Positions = dict[TopicQueue, int]


class Bounds(NamedTuple):
    """A queue's readable range: [min_offset, max_offset)."""

    min_offset: int
    max_offset: int


_TRIGGER_KEY: Final = "triggerMs"


def to_json(
    positions: Mapping[TopicQueue, int], *, trigger_ms: int | None = None
) -> dict[str, object]:
    """The offset as Spark stores it: a dict whose insertion order is sorted, so that
    `json.dumps` of it (what Spark writes and compares) is always the same text;
    `trigger_ms`: when the micro-batch ending here was planned (`minOffsetsPerTrigger`)."""
    topics: dict[str, dict[str, int]] = {}
    for topic, queue in sorted(positions):
        topics.setdefault(topic, {})[str(queue)] = int(positions[(topic, queue)])
    out: dict[str, object] = {"v": VERSION, "topics": topics}
    if trigger_ms is not None:
        out[_TRIGGER_KEY] = int(trigger_ms)
    return out


def trigger_time_ms(offset: Mapping[str, object]) -> int | None:
    """When the micro-batch ending at `offset` was planned, if the offset says (offsets
    of queries without `minOffsetsPerTrigger`, and initial offsets, do not)."""
    value = offset.get(_TRIGGER_KEY)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"tidemq source offset: bad {_TRIGGER_KEY} {value!r}")
    return value


def dumps(positions: Mapping[TopicQueue, int]) -> str:
    return json.dumps(to_json(positions))


def from_json(offset: object) -> Positions:
    """Parse an offset Spark hands back (from `to_json`, possibly via the checkpoint)."""
    if isinstance(offset, str):
        try:
            offset = json.loads(offset)
        except ValueError as exc:
            raise ValueError(f"tidemq source offset is not JSON: {exc}") from None
    if not isinstance(offset, dict) or offset.get("v") != VERSION:
        raise ValueError(
            f'tidemq source offset must look like {{"v": {VERSION}, "topics": {{...}}}}, got '
            f"{offset!r} (a checkpoint written by another source or version?)"
        )
    topics = offset.get("topics")
    if not isinstance(topics, dict):
        raise ValueError(f"tidemq source offset has no 'topics' object: {offset!r}")
    out: Positions = {}
    for topic, queues in topics.items():
        if not isinstance(queues, dict):
            raise ValueError(f"tidemq source offset: topic {topic!r} is not an object")
        for queue, position in queues.items():
            if not (isinstance(queue, str) and queue.isdigit()):
                raise ValueError(f"tidemq source offset: bad queue id {queue!r} of {topic!r}")
            if not isinstance(position, int) or isinstance(position, bool) or position < 0:
                raise ValueError(
                    f"tidemq source offset: bad offset {position!r} at {topic}/{queue}"
                )
            out[(topic, int(queue))] = position
    return out


def resolve_positions(
    spec: OffsetSpec,
    bounds: Mapping[TopicQueue, Bounds],
    *,
    option: str,
    default: Literal["earliest", "latest"],
    times: Mapping[TopicQueue, int] | None = None,
) -> Positions:
    """Positions of `bounds`' queues per `spec`: queues the JSON form leaves out get
    `default`; a timestamp spec takes each queue's offset from `times`. An offset past the
    queue's end is refused (an offset below its start is left for the read to report)."""
    given = spec.as_dict()
    out: Positions = {}
    for tq, (lo, hi) in bounds.items():
        if spec.kind == "timestamp" or (spec.kind == "timestamps" and tq in given):
            if times is None or tq not in times:
                raise ValueError(f"no offset for the timestamp of {tq[0]}/{tq[1]}")
            out[tq] = min(max(times[tq], lo), hi)
            continue
        if spec.kind == "timestamps":
            value = EARLIEST if default == "earliest" else LATEST
        elif spec.kind == "offsets":
            value = given.get(tq, EARLIEST if default == "earliest" else LATEST)
        else:
            value = EARLIEST if spec.kind == "earliest" else LATEST
        if value == EARLIEST:
            out[tq] = lo
        elif value == LATEST:
            out[tq] = hi
        elif value > hi:
            held = f"holds offsets {lo} to {hi - 1}" if hi > lo else f"is empty (at {hi})"
            raise OptionError(
                f"option {option!r}: offset {value} of {tq[0]}/{tq[1]} is past the queue's end "
                f"({hi}): the queue {held}. Give an offset of at most {hi}, or -1 for the "
                "queue's end (latest)"
            )
        else:
            out[tq] = value
    return out


def proportional_share(available: Mapping[TopicQueue, int], limit: int) -> dict[TopicQueue, int]:
    """Split `limit` rows over queues with `available` rows each, in proportion to what
    each has (as Kafka's source splits `maxOffsetsPerTrigger`): every queue gets the whole
    part of its share, and the rows those parts leave go one each to the largest
    remainders (ties: sorted order), so the result depends on the arguments only, no
    queue gets more than it has, and the total is `min(limit, sum(available))`.

    Why not max-min fairness (a queue with little to read takes all of it, the others
    share the rest): queues then move through a backlog at different paces, and in an
    event-time pipeline the queue that finishes first moves the watermark past the older
    events of the others, which Spark drops as late. In proportion, every queue is the
    same share of the way through its backlog after each batch."""
    counts = {tq: max(0, n) for tq, n in available.items()}
    total = sum(counts.values())
    if total <= limit:
        return counts
    limit = max(0, limit)
    out: dict[TopicQueue, int] = {}
    remainders: list[tuple[int, TopicQueue]] = []
    for tq, n in counts.items():
        whole, remainder = divmod(limit * n, total)
        out[tq] = whole
        remainders.append((-remainder, tq))
    left = limit - sum(out.values())
    # Each remainder is below `total` and they add up to `left * total`: at least `left`
    # of them are positive, so a queue with nothing available never gets a row.
    for _, tq in sorted(remainders)[:left]:
        out[tq] += 1
    return out


def next_end(
    start: Mapping[TopicQueue, int],
    bounds: Mapping[TopicQueue, Bounds],
    *,
    max_rows: int | None = None,
    targets: Mapping[TopicQueue, int] | None = None,
    fail_on_data_loss: bool = True,
) -> Positions:
    """The end offset of the next micro-batch starting at `start`.

    `bounds`: the queues that exist now (a queue of `start` missing from it, its broker
    away or its topic unsubscribed, keeps its position). `max_rows`: at most this many rows
    in all, split in proportion to what each queue has to read (`proportional_share`).
    `targets` (Trigger.AvailableNow): read no queue past its target, and no queue that has
    none. A queue new to `start` enters at its earliest offset (no
    rows this batch). A queue whose end fell below its position (deleted and re-created)
    is data loss: raised, or with `fail_on_data_loss=False` read again from its start.
    """
    end: Positions = {}
    available: dict[TopicQueue, int] = {}
    for tq, position in start.items():
        b = bounds.get(tq)
        if b is None:
            end[tq] = position
            continue
        if position > b.max_offset:
            if fail_on_data_loss:
                raise OffsetOutOfRange(
                    f"tidemq: queue {tq[0]}/{tq[1]} now ends at offset {b.max_offset}, before "
                    f"the position {position} already read (the topic was deleted and "
                    "re-created?). Set failOnDataLoss=false to read it again from its start."
                )
            end[tq] = b.min_offset
            continue
        limit = b.max_offset
        if targets is not None:
            limit = min(limit, targets.get(tq, position))
        end[tq] = position
        available[tq] = max(0, limit - position)
    taken = available if max_rows is None else proportional_share(available, max_rows)
    for tq, n in taken.items():
        end[tq] += n
    for tq, b in bounds.items():
        if tq not in start and (targets is None or tq in targets):
            end[tq] = b.min_offset
    return end


def next_offset(
    start: Mapping[str, object],
    bounds: Mapping[TopicQueue, Bounds],
    *,
    limits: TriggerLimits,
    now_ms: int,
    started_ms: int,
    targets: Mapping[TopicQueue, int] | None = None,
    fail_on_data_loss: bool = True,
) -> dict[str, object]:
    """The offset `latestOffset` answers for the micro-batch after `start` (Spark's JSON
    of it): `start` itself, unchanged, when there is nothing to plan or the batch must
    wait for `limits.min_offsets` (`trigger_limits.admit`); else the end `next_end` plans
    under `limits.max_offsets`, stamped with `now_ms` when a minimum applies.

    The delay counts from the stamp of `start`, the time its batch was planned, which
    Spark's checkpoint keeps across driver restarts; a start without one (the query's
    first batch, a checkpoint written without the option) counts from `started_ms`, when
    this reader was created. The rows counted are those the planned batch would read: a
    queue new to `start` enters the offsets with none (it is read from the batch after),
    so it counts from then on."""
    positions = from_json(start)
    end = next_end(
        positions,
        bounds,
        max_rows=limits.max_offsets,
        targets=targets,
        fail_on_data_loss=fail_on_data_loss,
    )
    if end == positions:
        return dict(start)  # the same JSON text: Spark sees no new data
    if limits.min_offsets is None:
        return to_json(end)
    rows = sum(max(0, end[tq] - p) for tq, p in positions.items())
    last_ms = trigger_time_ms(start)
    elapsed_ms = now_ms - (started_ms if last_ms is None else last_ms)
    decision = admit(
        rows,
        elapsed_ms,
        min_offsets=limits.min_offsets,
        max_trigger_delay_ms=limits.max_trigger_delay_ms,
    )
    if decision is Admission.WAIT:
        return dict(start)
    return to_json(end, trigger_ms=now_ms)
