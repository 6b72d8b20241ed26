"""`tidemq pipeline generate-changes` against a real broker: the events arrive keyed by
order, each order's events in one queue and in order (no Spark needed)."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner

from tidemq import Admin, Message, StreamConsumer
from tidemq.cli.main import app
from tidemq.spark.pipelines.changes import generate_changes, parse_change

if TYPE_CHECKING:
    from tests.integration.conftest import ThreadedBroker

pytestmark = pytest.mark.timeout(60)

QUEUES = 4
READ_TIMEOUT_S = 20.0


def _read_all(address: str, topic: str, count: int) -> list[Message]:
    """`count` messages of the topic's queues, from the start."""
    out: list[Message] = []
    deadline = time.monotonic() + READ_TIMEOUT_S
    with StreamConsumer(address, start="earliest") as consumer:
        consumer.assign([(topic, q) for q in range(QUEUES)])
        while len(out) < count and time.monotonic() < deadline:
            out.extend(consumer.poll(500))
    return out


def test_generate_changes_cli_sends_every_order_to_one_queue_in_order(
    sync_broker: ThreadedBroker,
) -> None:
    address, topic = sync_broker.address, "changes"
    args = ["pipeline", "generate-changes", "--bootstrap", address, "--topic", topic]
    result = CliRunner().invoke(app, [*args, "--orders", "60", "--seed", "4", "--queues", "4"])
    assert result.exit_code == 0, result.output
    events = generate_changes(60, seed=4)
    assert f"sent {len(events)} change event(s) of 60 order(s) to {topic}" in result.stdout
    with Admin(address) as admin:
        assert admin.describe_topic(topic).queues == QUEUES

    # More orders into the existing topic (--queues is then only a note).
    more = ["--orders", "5", "--seed", "4", "--first-order-id", "61", "--queues", "2"]
    result = CliRunner().invoke(app, [*args, *more])
    assert result.exit_code == 0, result.output
    assert "exists with 4 queue(s)" in result.stderr
    events += generate_changes(5, seed=4, first_order_id=61)

    messages = _read_all(address, topic, len(events))
    assert len(messages) == len(events)
    queue_of: dict[int, int] = {}
    got: dict[int, list[bytes]] = defaultdict(list)
    for m in sorted(messages, key=lambda m: (m.queue, m.offset)):
        assert m.value is not None
        event = parse_change(m.value)
        assert m.key == str(event.order_id).encode()
        assert queue_of.setdefault(event.order_id, m.queue) == m.queue
        got[event.order_id].append(m.value)
    want: dict[int, list[bytes]] = defaultdict(list)
    for e in events:
        want[e.order_id].append(e.to_json())
    assert got == want  # each order's events, all of them, in their order
    assert len(set(queue_of.values())) > 1  # the orders are spread over the queues


def test_generate_changes_cli_errors(sync_broker: ThreadedBroker) -> None:
    args = ["pipeline", "generate-changes", "--bootstrap", sync_broker.address]
    result = CliRunner().invoke(app, [*args, "--topic", "nowhere", "--orders", "3"])
    assert result.exit_code == 1
    assert "nowhere" in result.stderr  # no --queues: a missing topic is an error
    result = CliRunner().invoke(app, [*args, "--topic", "t", "--orders", "-1"])
    assert result.exit_code == 2
    result = CliRunner().invoke(app, [*args, "--topic", "t", "--orders", "2000000"])
    assert result.exit_code == 2
    assert "orders must be 0..1000000" in result.stderr
