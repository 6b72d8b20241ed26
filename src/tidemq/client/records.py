"""Messages as the producer's callers give them, checked and turned into records.

Everything here runs at the call (in the caller's thread for the sync API), so a wrong
argument raises in the caller's frame and nothing is sent (`tidemq.client.checks`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

from tidemq.client import checks
from tidemq.core import limits
from tidemq.core.batch import MessageRecord

__all__ = [
    "Delay",
    "DeliverAt",
    "batch_columns",
    "build_record",
    "build_records",
    "check_send",
    "deliver_at_ms",
    "due_ms_of",
]

#: A delay or delivery time, as `send` takes it.
Delay = float | timedelta | None
DeliverAt = datetime | float | None

#: The longest delay a client asks for. The broker has its own maximum (timer.max_delay),
#: which answers with a clear error when lower; this bound only keeps the arithmetic sane.
_MAX_DELAY_S = 10 * 365 * 86_400.0

T = TypeVar("T")


def build_record(  # noqa: PLR0917 - mirrors send()'s arguments one to one
    value: object,
    key: object,
    tag: object,
    keys: object,
    headers: object,
    timestamp: object,
) -> MessageRecord:
    """One checked message: each wrong argument raises TypeError or ValueError naming it."""
    return MessageRecord(
        checks.check_value(value),
        checks.check_key(key),
        checks.check_tag(tag),
        checks.check_keys(keys),
        checks.check_headers(headers),
        checks.timestamp_ms(timestamp),
    )


def batch_columns(
    values: object,
    keys: object,
    tags: object,
    headers: object,
) -> tuple[
    list[bytes | None],
    list[bytes | None] | None,
    list[str | None] | None,
    dict[str, bytes] | None,
]:
    """`send_batch`'s columns, checked: values, keys (one per value or None), tags (one
    per value or None), headers (shared by every message)."""
    if isinstance(values, str | bytes | bytearray | memoryview) or not isinstance(values, Sequence):
        raise TypeError(
            f"values must be a list of bytes (one per message), got {type(values).__name__}"
        )
    n = len(values)
    if not 1 <= n <= limits.MAX_BATCH_MESSAGES:
        raise ValueError(f"values must hold 1 to {limits.MAX_BATCH_MESSAGES} messages, got {n}")
    out_values = [checks.check_value(v, f"values[{i}]") for i, v in enumerate(values)]
    out_keys = _column(keys, "keys", n, checks.check_key)
    out_tags = _column(tags, "tags", n, checks.check_tag)
    hdr = checks.check_headers(headers)
    return out_values, out_keys, out_tags, dict(hdr) if hdr else None


def _column(column: object, arg: str, n: int, check: Callable[[object, str], T]) -> list[T] | None:
    if column is None:
        return None
    if isinstance(column, str | bytes | bytearray | memoryview) or not isinstance(column, Sequence):
        raise TypeError(
            f"{arg} must be a list with one entry per value, got {type(column).__name__}"
        )
    if len(column) != n:
        raise ValueError(f"{arg} must have one entry per value: {len(column)} for {n} values")
    return [check(item, f"{arg}[{i}]") for i, item in enumerate(column)]


def build_records(
    values: object,
    keys: object,
    tags: object,
    headers: object,
    timestamp: object,
) -> list[MessageRecord]:
    """`send_batch`'s messages as records (for the special sends, which encode records)."""
    out_values, out_keys, out_tags, hdr = batch_columns(values, keys, tags, headers)
    ts = checks.timestamp_ms(timestamp)
    header_items = tuple((hdr or {}).items())
    return [
        MessageRecord(
            v,
            out_keys[i] if out_keys is not None else None,
            out_tags[i] if out_tags is not None else None,
            (),
            header_items,
            ts,
        )
        for i, v in enumerate(out_values)
    ]


def deliver_at_ms(delay: object, deliver_at: object) -> int:
    """The delivery time in epoch milliseconds from a `delay` (seconds or a timedelta) or
    a `deliver_at` (an aware datetime or epoch seconds)."""
    if delay is not None and deliver_at is not None:
        raise ValueError("pass delay or deliver_at, not both")
    if delay is not None:
        seconds = checks.check_seconds(delay, "delay", maximum=_MAX_DELAY_S)
        return time.time_ns() // 1_000_000 + max(1, round(seconds * 1000))
    return max(1, checks.timestamp_ms(deliver_at, "deliver_at"))


def check_send(  # noqa: PLR0917 - mirrors send()'s arguments one to one
    topic: object,
    value: object,
    key: object,
    tag: object,
    keys: object,
    headers: object,
    queue: object,
    timestamp: object,
) -> tuple[str, MessageRecord, bytes | None, int | None]:
    """`send`'s arguments checked: (topic, record, key, queue)."""
    checked_topic = checks.check_readable_topic(topic)
    record = build_record(value, key, tag, keys, headers, timestamp)
    return checked_topic, record, record.key, checks.check_queue(queue)


def due_ms_of(delay: object, deliver_at: object) -> int:
    """Epoch ms of a delayed send's delivery; 0 for a plain send."""
    if delay is None and deliver_at is None:
        return 0
    return deliver_at_ms(delay, deliver_at)
