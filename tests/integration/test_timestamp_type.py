"""`message.timestamp.type` (Kafka's topic config): CreateTime keeps the producer's
timestamp; LogAppendTime gives every message the broker's append time, whatever the
producer said, on every read path (messages and batches). It used to be accepted and
ignored."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

import tidemq

if TYPE_CHECKING:
    from tests.integration.conftest import ThreadedBroker

pytestmark = pytest.mark.timeout(60)

LONG_AGO_S = 1_000_000_000.0  # 2001-09-09


def _read(address: str, topic: str, count: int) -> tuple[list[int], list[int]]:
    """(timestamps from poll, timestamps from poll_batches) of the first `count`."""
    out = []
    for batches in (False, True):
        with tidemq.StreamConsumer(address, start="earliest") as consumer:
            consumer.assign([(topic, 0)])
            stamps: list[int] = []
            deadline = time.monotonic() + 20
            while len(stamps) < count and time.monotonic() < deadline:
                if batches:
                    for b in consumer.poll_batches(timeout_ms=500):
                        stamps += [int(t) for t in b.columns.timestamps_ms[b.indices]]
                else:
                    stamps += [m.timestamp_ms for m in consumer.poll(timeout_ms=500)]
            out.append(stamps)
    return out[0], out[1]


def test_log_append_time_replaces_the_producers_timestamp(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    with tidemq.Admin(address) as admin:
        admin.create_topic("stamp-append", 1, config={"message.timestamp.type": "LogAppendTime"})
        admin.create_topic("stamp-create", 1)
    before_ms = time.time() * 1000
    with tidemq.Producer(address) as producer:
        for topic in ("stamp-append", "stamp-create"):
            producer.send(topic, b"one", timestamp=LONG_AGO_S)
            producer.send_batch(topic, [b"two", b"three"], timestamp=LONG_AGO_S)
    after_ms = time.time() * 1000
    for stamps in _read(address, "stamp-append", 3):
        assert len(stamps) == 3
        assert all(before_ms - 1000 <= t <= after_ms + 1000 for t in stamps), stamps
    for stamps in _read(address, "stamp-create", 3):
        assert stamps == [int(LONG_AGO_S * 1000)] * 3
