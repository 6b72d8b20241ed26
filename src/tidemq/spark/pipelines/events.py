"""User-behaviour events for the `analytics` pipeline: the format, a parser, a seeded
generator, and the pure-Python reference aggregations the tests compare Spark against.

Pure Python and the tidemq client: no pyspark, so `tidemq pipeline generate-events`
works without the `spark` extra.

Event format (the message value, UTF-8 JSON; the message key is the user id as text, so a
user's events stay in one queue, in order)::

    {"user_id": 42, "item_id": 1007, "behavior": "pv", "ts": 1763820000123}

* ``user_id``, ``item_id``: integers (64-bit);
* ``behavior``: one of ``pv`` (page view), ``fav``, ``cart``, ``buy`` (the behaviours of
  the public Taobao user-behaviour data set);
* ``ts``: the event time, milliseconds since the Unix epoch (UTC).

Extra fields are allowed and ignored.

With a schema (`--value-format avro`), the value is the same event in Avro, written by
`tidemq.AvroSerializer` from the `Event` dataclass (its schema, record `Event`, is
registered under `<topic>-value`), in Confluent's wire format; the pipeline reads it as a
struct with the same fields.

The generator simulates users who come back in sessions: a user's events inside a
session are at most `session_pause_s` apart, and sessions are separated by a pause longer
than the pipeline's default session gap. Event times are not in order: each event is
delayed by up to `disorder_s` before it is produced, as a real collector would, and the
generator keeps that below the pipeline's default watermark delay so no event is late.
"""

from __future__ import annotations

import heapq
import json
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tidemq.client.cluster import ClientConfig
from tidemq.client.sync import Admin, Producer
from tidemq.core.errors import TopicNotFound

__all__ = [
    "BEHAVIORS",
    "MAX_EVENTS",
    "Event",
    "SessionRow",
    "WindowRow",
    "generate_events",
    "parse_event",
    "produce_events",
    "reference_sessions",
    "reference_windows",
]

BEHAVIORS: Final = ("pv", "fav", "cart", "buy")
#: Relative frequencies of the behaviours in generated data (views dominate, as in the
#: Taobao set: about 89% pv, 3% fav, 6% cart, 2% buy).
_WEIGHTS: Final = (89, 3, 6, 2)
#: Most events one `generate_events` call makes (they are held in memory).
MAX_EVENTS: Final = 10_000_000
#: Messages in flight when producing (the producer batches them per queue).
PRODUCE_WINDOW: Final = 5000


@dataclass(frozen=True, slots=True)
class Event:
    """One user-behaviour event (see the module docstring)."""

    user_id: int
    item_id: int
    behavior: str
    ts: int

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "user_id": self.user_id,
                "item_id": self.item_id,
                "behavior": self.behavior,
                "ts": self.ts,
            },
            separators=(",", ":"),
        ).encode()


def _int_field(obj: Mapping[str, Any], name: str) -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"field {name!r} must be an integer, got {value!r}")
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"field {name!r} is out of the 64-bit range: {value}")
    return value


def parse_event(value: bytes | str | None) -> Event:
    """An event from a message value; `ValueError` naming what is wrong otherwise. The
    Spark pipeline applies the same rules in SQL (`analytics.parsed_events`)."""
    if value is None:
        raise ValueError("the message has no value (a tombstone)")
    try:
        obj = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"an event must be a JSON object, got {type(obj).__name__}")
    behavior = obj.get("behavior")
    if behavior not in BEHAVIORS:
        raise ValueError(
            f"field 'behavior' must be one of {', '.join(BEHAVIORS)}; got {behavior!r}"
        )
    return Event(
        _int_field(obj, "user_id"), _int_field(obj, "item_id"), behavior, _int_field(obj, "ts")
    )


def generate_events(
    count: int,
    *,
    users: int = 1000,
    items: int = 5000,
    seed: int = 0,
    start_ms: int = 1_763_769_600_000,  # 2025-11-22 00:00 UTC
    session_pause_s: float = 60.0,
    idle_s: float = 900.0,
    disorder_s: float = 30.0,
) -> list[Event]:
    """`count` events in the order a collector would deliver them (see the module
    docstring), deterministic for a given seed.

    A user's session has 5 events on average, each at most `session_pause_s` after the
    previous one; the user's next session starts between `idle_s` and twice that later.
    So there are about `users * 5 / (1.5 * idle_s)` events per second of event time.
    Each event is delivered up to `disorder_s` after its time, and the output is in
    delivery order, not event-time order."""
    if not 0 <= count <= MAX_EVENTS:
        raise ValueError(f"count must be between 0 and {MAX_EVENTS}, got {count}")
    if users < 1 or items < 1:
        raise ValueError(f"users and items must be at least 1, got {users} and {items}")
    if session_pause_s <= 0 or idle_s <= session_pause_s or disorder_s < 0:
        raise ValueError(
            "session_pause_s must be > 0, idle_s > session_pause_s and disorder_s >= 0; got "
            f"{session_pause_s}, {idle_s} and {disorder_s}"
        )
    rng = random.Random(seed)
    # When each user's next event happens: a heap of (time_ms, user, events left in
    # the session).
    # Users start spread over the first idle period.
    spread_ms = int(idle_s * 1000)
    heap = [(start_ms + rng.randrange(spread_ms), user, 0) for user in range(1, users + 1)]
    heapq.heapify(heap)
    mean_session = 5.0
    events: list[tuple[int, int, Event]] = []  # (delivery time, sequence, event)
    for seq in range(count):
        ts, user, left = heapq.heappop(heap)
        behavior = rng.choices(BEHAVIORS, _WEIGHTS)[0]
        item = 1 + min(int(rng.paretovariate(1.2)) - 1, items - 1) * 7919 % items
        event = Event(user, item, behavior, ts)
        events.append((ts + rng.randrange(int(disorder_s * 1000) + 1), seq, event))
        if left == 0:  # a new session: how many more events it has
            left = 1 + int(rng.expovariate(1 / mean_session))
        left -= 1
        if left > 0:
            gap_ms = 1 + rng.randrange(int(session_pause_s * 1000))
        else:
            gap_ms = int(idle_s * (1 + rng.random()) * 1000) + 1
        heapq.heappush(heap, (ts + gap_ms, user, left))
    events.sort(key=lambda e: (e[0], e[1]))
    return [e for _, _, e in events]


def produce_events(
    bootstrap: str,
    topic: str,
    events: Iterable[Event],
    *,
    queues: int | None = None,
    value_serializer: Callable[[str, Any], bytes] | None = None,
    client_config: ClientConfig | None = None,
) -> int:
    """Send `events` to `topic` in their order, keyed by user id (the producer batches
    them per queue, so each queue holds its events in the order given). With `queues`,
    the topic is created with that many queues when missing. `value_serializer(topic,
    event)`: the value's bytes (default: the event's JSON), e.g.
    `tidemq.AvroSerializer(registry, Event)`; `client_config`: login and TLS. Returns how
    many were sent."""
    if queues is not None:
        with Admin(bootstrap, client_config=client_config) as admin:
            try:
                admin.describe_topic(topic)
            except TopicNotFound:
                admin.create_topic(topic, queues)
    sent = 0
    encode = value_serializer or (lambda _topic, e: e.to_json())
    if value_serializer is not None and hasattr(value_serializer, "prepare"):
        value_serializer.prepare(topic)  # the registry call, once, before the sends
    with Producer(bootstrap, client_config=client_config) as producer:
        for chunk in _chunks(events, PRODUCE_WINDOW):
            futures = [
                producer.send_async(topic, encode(topic, e), key=str(e.user_id).encode())
                for e in chunk
            ]
            for f in futures:
                f.result()
            sent += len(chunk)
    return sent


def _chunks(events: Iterable[Event], size: int) -> Iterator[list[Event]]:
    chunk: list[Event] = []
    for event in events:
        chunk.append(event)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# --------------------------------------------------------------------- reference results


@dataclass(frozen=True, slots=True, order=True)
class WindowRow:
    """Events of one behaviour on one item in the window [start_ms, end_ms)."""

    start_ms: int
    end_ms: int
    behavior: str
    item_id: int
    count: int


@dataclass(frozen=True, slots=True, order=True)
class SessionRow:
    """A user's session [start_ms, end_ms): end is the last event's time plus the gap."""

    user_id: int
    start_ms: int
    end_ms: int
    events: int
    pv: int
    fav: int
    cart: int
    buy: int


def reference_windows(
    events: Iterable[Event], size_ms: int, slide_ms: int | None = None
) -> list[WindowRow]:
    """Counts per (window, behavior, item) as Spark's `window(ts, size, slide)` makes
    them: windows start at multiples of `slide_ms` from the epoch (tumbling when
    `slide_ms` is None or equal to `size_ms`)."""
    slide = size_ms if slide_ms is None else slide_ms
    if size_ms <= 0 or slide <= 0 or size_ms % slide:
        raise ValueError("the window size must be a positive multiple of the slide")
    counts: Counter[tuple[int, str, int]] = Counter()
    for e in events:
        last = e.ts - e.ts % slide  # the latest window start <= ts
        start = last
        while start > e.ts - size_ms:
            counts[(start, e.behavior, e.item_id)] += 1
            start -= slide
    return sorted(WindowRow(s, s + size_ms, b, i, n) for (s, b, i), n in counts.items())


def reference_sessions(events: Iterable[Event], gap_ms: int) -> list[SessionRow]:
    """Sessions per user as Spark's `session_window(ts, gap)` makes them: each event
    spans [ts, ts + gap); spans that overlap or touch merge."""
    per_user: dict[int, list[Event]] = {}
    for e in events:
        per_user.setdefault(e.user_id, []).append(e)
    out: list[SessionRow] = []
    for user, evs in per_user.items():
        evs.sort(key=lambda e: e.ts)
        session: list[Event] = []
        end = 0
        for e in evs:
            if session and e.ts > end:  # Spark merges a span that starts at the end
                out.append(_session(user, session, end))
                session = []
            session.append(e)
            end = max(end, e.ts + gap_ms) if len(session) > 1 else e.ts + gap_ms
        if session:
            out.append(_session(user, session, end))
    return sorted(out)


def _session(user: int, events: Sequence[Event], end: int) -> SessionRow:
    by = Counter(e.behavior for e in events)
    return SessionRow(
        user, events[0].ts, end, len(events), by["pv"], by["fav"], by["cart"], by["buy"]
    )
