"""`tidemq dlq list|redrive` against a real broker (on its own thread), the commands run
in-process through typer's CliRunner like most of test_cli.py."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from tests.integration.test_cli import cli, ok

import tidemq

if TYPE_CHECKING:
    from tests.integration.conftest import ThreadedBroker

pytestmark = pytest.mark.timeout(60)


def _dead_letters(address: str, group: str, values: list[bytes]) -> None:
    """Send `values` to topic "orders" and fail each once with max_attempts 1: they end in
    the group's dead-letter topic."""
    with tidemq.Producer(address) as producer:
        for v in values:
            producer.send("orders", v, key=b"k", tag="paid", headers={"src": b"web"})
    with tidemq.SimpleConsumer(
        address, group, {"orders": "*"}, max_attempts=1, await_duration=0.2
    ) as consumer:
        failed = 0
        while failed < len(values):
            for m in consumer.receive(len(values) - failed):
                m.nack(reason=f"bad {m.value.decode() if m.value else ''}")
                failed += 1
        assert consumer.receive(10) == []  # this receive dead-letters them


def test_dlq_list_and_redrive(sync_broker: ThreadedBroker) -> None:
    b = sync_broker.address
    ok("topic", "create", "orders", "--queues", "1", "-n", b)
    empty = ok("dlq", "list", "billing", "-n", b, "-o", "json")
    assert empty.json() == []
    assert ok("dlq", "redrive", "billing", "-n", b, "-o", "json").json() == {
        "group": "billing",
        "redriven": 0,
        "position": 0,
    }

    _dead_letters(b, "billing", [b"one", b"two", b"three"])
    listed = ok("dlq", "list", "billing", "-n", b, "-o", "json").json()
    assert [r["value"] for r in listed] == ["one", "two", "three"]
    first = listed[0]
    assert first["origin_topic"] == "orders"
    assert (first["origin_queue"], first["origin_offset"]) == (0, 0)
    assert first["attempts"] == 1
    assert first["error"] == "bad one"
    assert first["redriven"] is False
    assert (first["key"], first["tag"], first["headers"]) == ("k", "paid", {"src": "web"})
    assert len(first["message_id"]) == len(first["origin_message_id"]) == 28
    limited = ok("dlq", "list", "billing", "--limit", "2", "-n", b, "-o", "json").json()
    assert [r["value"] for r in limited] == ["one", "two"]

    table = ok("dlq", "list", "billing", "-n", b)
    assert "%DLQ%billing: 3 dead letter(s) shown" in table.stdout
    assert "orders/0@1" in table.stdout
    assert "bad two" in table.stdout

    redrove = ok("dlq", "redrive", "billing", "--limit", "2", "-n", b)
    assert redrove.stdout.strip() == "redrove 2 dead letter(s) of group 'billing' (position 2)"
    rest = ok("dlq", "redrive", "billing", "-n", b, "-o", "json").json()
    assert rest == {"group": "billing", "redriven": 1, "position": 3}
    again = ok("dlq", "redrive", "billing", "-n", b, "-o", "json").json()
    assert again["redriven"] == 0  # a second redrive resends nothing
    listed = ok("dlq", "list", "billing", "-n", b, "-o", "json").json()
    assert [r["redriven"] for r in listed] == [True, True, True]

    # The redriven messages are back in "orders" (after the three originals).
    consumed = ok(
        "consume", "orders", "-n", b, "--from-beginning", "--max-messages", "6",
        "--timeout-ms", "5000", "-o", "json",
    )  # fmt: skip
    back = [r for r in map(json.loads, consumed.lines()) if r["offset"] >= 3]
    assert [r["value"] for r in back] == ["one", "two", "three"]
    assert all(set(r["headers"]) == {"src", "tidemq.redriven_from"} for r in back)


def test_dlq_usage_errors(sync_broker: ThreadedBroker) -> None:
    b = sync_broker.address
    assert cli("dlq", "list", "g", "--limit", "0", "-n", b).code == 2
    assert cli("dlq", "redrive", "g", "--limit", "-1", "-n", b).code == 2
    assert cli("dlq", "list", "-n", b).code == 2  # GROUP is required
    bad = cli("dlq", "list", "g", "-n", "nonsense")
    assert bad.code == 2
    assert "host:port" in bad.stderr
