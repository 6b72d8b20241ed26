"""What the analytics tests check a run against: generated events, the pure-Python
reference of every kind, and the rows a run left in Parquet and in its results topic.

Shared by the Spark tests of the pipeline (`tests/spark/test_pipeline_analytics*.py`,
the kill -9 and standalone-cluster tests)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from tidemq import Admin, Message
from tidemq.spark.pipelines.analytics import AnalyticsConfig, AnalyticsRun
from tidemq.spark.pipelines.events import (
    Event,
    generate_events,
    reference_sessions,
    reference_windows,
)

__all__ = [
    "CONFIG",
    "INVALID",
    "check",
    "parquet_rows",
    "reference",
    "sample_events",
    "topic_rows",
    "watermark_ms",
]

#: The windows the tests run with (and their reference uses).
CONFIG = AnalyticsConfig(
    tumbling_s=60, sliding_s=300, slide_s=60, session_gap_s=60, watermark_s=120
)
#: Values that are not events (they go to `rejected`).
INVALID = [b"not json", b'{"user_id": 1, "item_id": 2, "behavior": "steal", "ts": 5}', b"[1]"]
#: The test session's `consume` fixture: ranges [start, end) per (topic, queue) -> messages.
Consume = Callable[[dict[tuple[str, int], tuple[int, int]]], list[Message]]


def sample_events() -> list[Event]:
    # The watermark delay (120 s) covers the disorder (10 s) plus how far one queue gets
    # ahead of another in a micro-batch, so no event is late (checked in `check`).
    return generate_events(
        3000, users=200, items=40, seed=7, idle_s=120, session_pause_s=20, disorder_s=10
    )


def watermark_ms(run: AnalyticsRun) -> int:
    """The watermark the query's last micro-batch used: windows ending at or before it
    were emitted (one watermark for every kind: ADR 16)."""
    text = run.query.lastProgress["eventTime"]["watermark"]  # type: ignore[index]
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _ms(value: Any) -> int:
    return int(value.timestamp() * 1000)


def parquet_rows(root: Path, kind: str) -> list[tuple[Any, ...]]:
    """The rows of `kind` under `root`, as the reference gives them, sorted."""
    table = ds.dataset(root / kind, format="parquet", partitioning="hive").to_table()
    rows = table.drop_columns(["dt"]).to_pylist()
    if kind == "session":
        return sorted(
            (
                r["user_id"],
                _ms(r["session_start"]),
                _ms(r["session_end"]),
                r["events"],
                r["pv"],
                r["fav"],
                r["cart"],
                r["buy"],
            )
            for r in rows
        )
    return sorted(
        (_ms(r["window_start"]), _ms(r["window_end"]), r["behavior"], r["item_id"], r["count"])
        for r in rows
    )


def topic_rows(admin: Admin, consume: Consume, topic: str) -> Counter[tuple[Any, ...]]:
    """(kind, *row) of every message of the results topic, counted; checks tag and key."""
    info = admin.describe_topic(topic)
    ranges = {(topic, q.queue): (q.min_offset, q.max_offset) for q in info.queue_info}
    out: Counter[tuple[Any, ...]] = Counter()
    for m in consume(ranges):
        doc = json.loads(m.value or b"")
        assert m.tag == doc["kind"]
        if doc["kind"] == "session":
            assert m.key == str(doc["user_id"]).encode()
            fields = ["user_id", "session_start", "session_end", "events", "pv", "fav"]
            fields += ["cart", "buy"]
        else:
            assert m.key == str(doc["item_id"]).encode()
            fields = ["window_start", "window_end", "behavior", "item_id", "count"]
        out[(doc["kind"], *(doc[f] for f in fields))] += 1
    return out


def reference(events: list[Event], kind: str, watermark_ms: int) -> list[tuple[Any, ...]]:
    """The rows of `kind` (CONFIG's windows) that end at or before the watermark."""
    if kind == "session":
        return [
            (s.user_id, s.start_ms, s.end_ms, s.events, s.pv, s.fav, s.cart, s.buy)
            for s in reference_sessions(events, CONFIG.session_gap_s * 1000)
            if s.end_ms <= watermark_ms
        ]
    slide = CONFIG.tumbling_s if kind == "tumbling" else CONFIG.slide_s
    size = CONFIG.tumbling_s if kind == "tumbling" else CONFIG.sliding_s
    return [
        (r.start_ms, r.end_ms, r.behavior, r.item_id, r.count)
        for r in reference_windows(events, size * 1000, slide * 1000)
        if r.end_ms <= watermark_ms
    ]


def check(
    run: AnalyticsRun,
    events: list[Event],
    output: Path,
    *,
    admin: Admin,
    consume: Consume,
    topic: str,
) -> int:
    """Parquet equals the reference up to the query's watermark, and the topic holds the
    same rows once each; returns the number of result rows."""
    expected_topic: Counter[tuple[Any, ...]] = Counter()
    progress = run.query.recentProgress
    operators = [op for p in progress for op in p["stateOperators"]]
    assert len(operators) == 3 * len(progress)  # tumbling, sliding, session
    assert sum(op["numRowsDroppedByWatermark"] for op in operators) == 0
    for kind in ("tumbling", "sliding", "session"):
        ref = reference(events, kind, watermark_ms(run))
        assert ref, kind  # the watermark moved past some windows: the check is not empty
        assert parquet_rows(output, kind) == sorted(ref), kind
        expected_topic.update((kind, *r) for r in ref)
    assert topic_rows(admin, consume, topic) == expected_topic
    return sum(expected_topic.values())
