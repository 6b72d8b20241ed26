"""`tidemq pop status|resume` against a real broker (on its own thread), in-process
through typer's CliRunner like test_cli.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from tests.integration.test_cli import cli, ok

import tidemq

if TYPE_CHECKING:
    from tests.integration.conftest import ThreadedBroker

pytestmark = pytest.mark.timeout(60)


def test_pop_status_and_resume(sync_broker: ThreadedBroker) -> None:
    b = sync_broker.address
    ok("topic", "create", "jobs", "--queues", "1", "-n", b)
    with tidemq.Producer(b) as producer:
        producer.send("jobs", b"poison", queue=0)
        producer.send("jobs", b"fine", queue=0)
    with tidemq.SimpleConsumer(
        b, "crunch", {"jobs": "*"}, max_attempts=1, on_exhausted="suspend", await_duration=0.2
    ) as consumer:
        for m in consumer.receive(2):
            if m.value == b"poison":
                m.nack(reason="cannot parse")
            else:
                m.ack()
        assert consumer.receive(2) == []  # this receive suspends it
        (row,) = ok("pop", "status", "crunch", "-n", b, "-o", "json").json()
        assert (row["topic"], row["acked_below"], row["next_offset"]) == ("jobs", 0, 2)
        (suspended,) = row["suspended"]
        assert (suspended["offset"], suspended["error"]) == (0, "cannot parse")
        table = ok("pop", "status", "crunch", "-n", b).stdout
        assert "1 suspended message(s)" in table
        assert suspended["message_id"] in table

        bad = cli("pop", "resume", "crunch", "0" * 28, "-n", b)
        assert bad.code == 1
        assert "no suspended message" in bad.stderr
        said = ok("pop", "resume", "crunch", suspended["message_id"], "-n", b).stdout
        assert "will be delivered again" in said
        (again,) = consumer.receive(2)
        assert again.value == b"poison"
        again.nack(reason="still")
        assert consumer.receive(2) == []
        gone = ok("pop", "resume", "crunch", suspended["message_id"], "--dead-letter", "-n", b)
        assert "dead-letter" in gone.stdout
    (row,) = ok("pop", "status", "crunch", "-n", b, "-o", "json").json()
    assert (row["acked_below"], row["dead_lettered"], row["suspended"]) == (2, 1, [])
    assert row["retried"] == 0  # its only nack was its last attempt: suspended, not retried
    assert [r["value"] for r in ok("dlq", "list", "crunch", "-n", b, "-o", "json").json()] == [
        "poison"
    ]
