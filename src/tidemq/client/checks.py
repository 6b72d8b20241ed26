"""Checks of what callers pass to the client, made at the call, before anything is sent.

Each function takes the value and the name of the argument it came in, and returns the
value in the form the client works with, or raises TypeError (wrong kind of value) or
ValueError (right kind, wrong value) whose message names the argument. So a mistake fails
in the caller's own frame, never later inside the event loop or as a decoder's error, and
the client is unchanged by it. Topic names raise InvalidTopicName, which is a ValueError.

The conventions they enforce, used by the whole client:

* values and keys are bytes (bytearray and memoryview are copied to bytes), or None;
* tags, business keys and header names are str; header values are bytes;
* times are seconds: a float (or int) of seconds since the epoch, or an aware
  `datetime`; durations are float seconds (or a `timedelta`);
* queue ids and offsets are ints (not bools): 0 <= queue <= MAX_QUEUE_ID,
  0 <= offset <= MAX_OFFSET;
* topic and group names follow `tidemq.core.names` (one rule, also checked by the broker);
* where a list of names is expected, a lone str is an error, not a list of its letters.
"""

from __future__ import annotations

import math
import numbers
import operator
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Final

import numpy as np

from tidemq.core import limits, names
from tidemq.core.errors import InvalidTopicName
from tidemq.core.filters import Sql92, subscription

__all__ = [
    "check_filter",
    "check_group_name",
    "check_headers",
    "check_int",
    "check_key",
    "check_keys",
    "check_names",
    "check_offset",
    "check_queue",
    "check_readable_topic",
    "check_seconds",
    "check_tag",
    "check_timeout_ms",
    "check_topic_name",
    "check_topic_queue",
    "check_topic_queues",
    "check_value",
    "timestamp_ms",
]

_BINARY: Final = (bytes, bytearray, memoryview)
#: Seconds since the epoch of 9999-12-31T23:59:59Z, the last second a timestamp may name.
_MAX_SECONDS: Final = 253_402_300_799
#: Longest text of a bad value quoted in an error message.
_QUOTE_CHARS: Final = 60


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 3] + "..."


def _kind(value: object) -> str:
    return type(value).__name__


def _binary(value: object, arg: str, *, none_ok: bool = True) -> bytes | None:
    if value is None and none_ok:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    hint = f"; encode it first, e.g. {arg}.encode()" if isinstance(value, str) else ""
    expected = "bytes or None" if none_ok else "bytes"
    raise TypeError(f"{arg} must be {expected}, got {_kind(value)} {_show(value)}{hint}")


def check_value(value: object, arg: str = "value") -> bytes | None:
    """A message value: bytes (bytearray, memoryview copied) or None (a tombstone)."""
    return _binary(value, arg)


def check_key(key: object, arg: str = "key") -> bytes | None:
    """A message key: bytes (bytearray, memoryview copied) or None."""
    return _binary(key, arg)


def check_tag(tag: object, arg: str = "tag") -> str | None:
    """A tag: None, or a str a subscription can match (`names.tag_problem`)."""
    if tag is None:
        return None
    if not isinstance(tag, str):
        hint = "; decode it first" if isinstance(tag, _BINARY) else ""
        raise TypeError(f"{arg} must be a str or None, got {_kind(tag)} {_show(tag)}{hint}")
    problem = names.tag_problem(tag)
    if problem is not None:
        raise ValueError(f"{arg} {_show(tag)} {problem}")
    return tag


def _sequence(value: object, arg: str, of: str) -> list[object]:
    if isinstance(value, str | bytes | bytearray | memoryview):
        raise TypeError(f"{arg} must be a list of {of}, not a {_kind(value)}: wrap one in a list")
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise TypeError(f"{arg} must be a list of {of}, got {_kind(value)} {_show(value)}")
    return list(value)


def check_keys(keys: object, arg: str = "keys") -> tuple[str, ...]:
    """Business keys (query by key): None or a list of str without whitespace or
    control characters, at most MAX_KEYS_PER_MESSAGE."""
    if keys is None:
        return ()
    items = _sequence(keys, arg, "str")
    if len(items) > limits.MAX_KEYS_PER_MESSAGE:
        raise ValueError(f"{arg} has {len(items)} keys, more than {limits.MAX_KEYS_PER_MESSAGE}")
    out: list[str] = []
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise TypeError(f"{arg}[{i}] must be a str, got {_kind(item)} {_show(item)}")
        if not item or any(c.isspace() for c in item) or not item.isprintable():
            raise ValueError(
                f"{arg}[{i}] {_show(item)} must be non-empty, without whitespace or "
                "control characters"
            )
        out.append(item)
    return tuple(out)


def check_headers(headers: object, arg: str = "headers") -> tuple[tuple[str, bytes], ...]:
    """Headers: None, or a mapping of str names to bytes values (bytearray, memoryview
    copied), within the limits of `tidemq.core.limits`."""
    if headers is None:
        return ()
    if not isinstance(headers, Mapping):
        raise TypeError(
            f"{arg} must be a dict of str to bytes, got {_kind(headers)} {_show(headers)}"
        )
    if len(headers) > limits.MAX_HEADERS_PER_MESSAGE:
        raise ValueError(
            f"{arg} has {len(headers)} entries, more than {limits.MAX_HEADERS_PER_MESSAGE}"
        )
    out: list[tuple[str, bytes]] = []
    for name, value in headers.items():
        if not isinstance(name, str):
            raise TypeError(f"{arg} names must be str, got {_kind(name)} {_show(name)}")
        if not name or not name.isprintable():
            raise ValueError(f"{arg} name {_show(name)} must be non-empty printable text")
        if len(name.encode(errors="surrogatepass")) > limits.MAX_HEADER_KEY_BYTES:
            raise ValueError(
                f"{arg} name {_show(name)} is longer than {limits.MAX_HEADER_KEY_BYTES} bytes"
            )
        raw = _binary(value, f"{arg}[{name!r}]", none_ok=False)
        assert raw is not None
        if len(raw) > limits.MAX_HEADER_VALUE_BYTES:
            raise ValueError(
                f"{arg}[{name!r}] is {len(raw)} bytes, more than {limits.MAX_HEADER_VALUE_BYTES}"
            )
        out.append((name, raw))
    return tuple(out)


def _number(value: object, arg: str, what: str) -> float:
    """A real number (int, float, numpy scalars; not a bool) as a finite float."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise TypeError(f"{arg} must be {what}, got {_kind(value)} {_show(value)}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{arg} is out of range, got {_show(value)}") from None
    if not math.isfinite(number):
        raise ValueError(f"{arg} must be a finite number of seconds, got {value!r}")
    return number


def timestamp_ms(timestamp: object, arg: str = "timestamp", *, now_ms: int | None = None) -> int:
    """Milliseconds since the epoch of a timestamp given as seconds since the epoch (a
    float or int) or as an aware `datetime`; None is now (`now_ms`, else the clock).
    It must lie in the years 1970 to 9999. A number that is only in range as milliseconds
    is refused as such ("looks like milliseconds"), not stored thousands of years ahead."""
    if timestamp is None:
        return round(time.time() * 1000) if now_ms is None else now_ms
    if isinstance(timestamp, datetime):
        if timestamp.tzinfo is None or timestamp.utcoffset() is None:
            raise ValueError(
                f"{arg} {_show(timestamp)} is a naive datetime: give it a timezone, e.g. "
                "datetime.now(timezone.utc)"
            )
        seconds = timestamp.timestamp()
    else:
        seconds = _number(timestamp, arg, "seconds since the epoch (a float) or a datetime")
    if seconds < 0:
        raise ValueError(f"{arg} {seconds!r} is before 1970")
    if seconds > _MAX_SECONDS:
        if seconds <= _MAX_SECONDS * 1000 + 999:
            raise ValueError(
                f"{arg} {_show(timestamp)} looks like milliseconds; pass seconds "
                f"({arg}={seconds / 1000!r})"
            )
        raise ValueError(f"{arg} {_show(timestamp)} is after the year 9999")
    return round(seconds * 1000)


def check_int(value: object, arg: str, *, minimum: int, maximum: int) -> int:
    """An int (not a bool; numpy integers are accepted) in [minimum, maximum]."""
    if isinstance(value, bool | float | str | bytes):
        raise TypeError(f"{arg} must be an int, got {_kind(value)} {_show(value)}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{arg} must be an int, got {_kind(value)} {_show(value)}") from None
    if not minimum <= number <= maximum:
        raise ValueError(f"{arg} must be {minimum} to {maximum}, got {number}")
    return number


def check_queue(queue: object, arg: str = "queue") -> int | None:
    """A queue id (0 to MAX_QUEUE_ID), or None (let the client choose)."""
    if queue is None:
        return None
    return check_int(queue, arg, minimum=0, maximum=limits.MAX_QUEUE_ID)


def check_offset(offset: object, arg: str = "offset") -> int:
    """A queue offset: an int from 0 to MAX_OFFSET."""
    return check_int(offset, arg, minimum=0, maximum=limits.MAX_OFFSET)


def check_topic_name(name: object, arg: str = "topic") -> str:
    """A user topic name (`tidemq.core.names`); InvalidTopicName (a ValueError) if not."""
    if not isinstance(name, str):
        raise TypeError(f"{arg} must be a str, got {_kind(name)} {_show(name)}")
    problem = names.user_name_problem(name)
    if problem is not None:
        raise InvalidTopicName(f"{arg} {_show(name)} {problem}; use {names.NAME_RULE}")
    return name


def check_readable_topic(name: object, arg: str = "topic") -> str:
    """A topic a client may read: a user name or an internal one (%RETRY%g, %DLQ%g)."""
    if isinstance(name, str) and (names.is_user_name(name) or names.is_internal_topic(name)):
        return name
    return check_topic_name(name, arg)


def check_group_name(name: object, arg: str = "group") -> str:
    """A user group name (`tidemq.core.names`); ValueError if not."""
    if not isinstance(name, str):
        raise TypeError(f"{arg} must be a str, got {_kind(name)} {_show(name)}")
    problem = names.user_name_problem(name, group=True)
    if problem is not None:
        raise ValueError(f"{arg} {_show(name)} {problem}; use {names.NAME_RULE}")
    return name


def check_names(names_: object, arg: str) -> list[str]:
    """A non-empty list of topic names, in order, without repeats. A lone str is a
    TypeError: `["orders"]`, not `"orders"` (which would be six one-letter topics)."""
    if isinstance(names_, str):
        raise TypeError(f"{arg} must be a list of topic names, not a str: write [{names_!r}]")
    items = _sequence(names_, arg, "topic names")
    if not items:
        raise ValueError(f"{arg} must name at least one topic")
    out: list[str] = []
    for i, item in enumerate(items):
        name = check_readable_topic(item, f"{arg}[{i}]")
        if name not in out:
            out.append(name)
    return out


def check_seconds(
    value: object, arg: str, *, minimum: float = 0.0, maximum: float | None = None
) -> float:
    """A duration in seconds (an int, a float or a `timedelta`): finite, from `minimum`
    to `maximum`."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    else:
        seconds = _number(value, arg, "a number of seconds or a timedelta")
    if seconds < minimum or (maximum is not None and seconds > maximum):
        upper = f" to {maximum:g}" if maximum is not None else " or more"
        raise ValueError(f"{arg} must be {minimum:g}{upper} seconds, got {_show(value)}")
    return seconds


def check_filter(value: object, arg: str = "filter") -> tuple[str, str]:
    """A subscription filter: a tag expression (str) or `Sql92(...)`; returns (kind,
    expression) after checking it compiles (FilterSyntaxError names the column)."""
    if not isinstance(value, str | Sql92):
        raise TypeError(
            f"{arg} must be a tag expression (str) or Sql92(...), got {_kind(value)} {_show(value)}"
        )
    return subscription(value)


def check_timeout_ms(value: object, arg: str = "timeout_ms") -> int:
    """A wait in milliseconds: an int from 0 to MAX_TIMEOUT_MS."""
    return check_int(value, arg, minimum=0, maximum=limits.MAX_TIMEOUT_MS)


def check_topic_queue(value: object, arg: str = "queues") -> tuple[str, int]:
    """One queue named as a (topic, queue) pair."""
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise TypeError(
            f"{arg} must hold (topic, queue) pairs such as ('orders', 0), got "
            f"{_kind(value)} {_show(value)}"
        )
    topic, queue = value
    checked = check_queue(queue, f"{arg}: queue of {_show(value)}")
    assert checked is not None
    return check_readable_topic(topic, f"{arg}: topic of {_show(value)}"), checked


def check_topic_queues(value: object, arg: str = "queues") -> list[tuple[str, int]]:
    """Queues named as (topic, queue) pairs; a lone pair or str is a TypeError."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
        raise TypeError(f"{arg} must be a list of (topic, queue) pairs: write [{value!r}]")
    # A dict keyed by queue (positions, ranges) names its keys, as iterating it does.
    items = (
        list(value) if isinstance(value, Mapping) else _sequence(value, arg, "(topic, queue) pairs")
    )
    return [check_topic_queue(item, f"{arg}[{i}]") for i, item in enumerate(items)]
