"""What a new user meets in the first hour (issue 15): `produce` batches and says what it
did, `topic create --if-not-exists`, lists without internal names, one `error:` line per
failure (the traceback only with `--debug`), and pipelines refusing a missing topic.
Against one real `tidemq server` process, as in test_cli.py."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from tests.integration.test_cli import (  # `server`, `servers`: test_cli.py's fixtures
    CLI,
    RUN_TIMEOUT_S,
    Result,
    Server,
    cli,
    ok,
    run,
    server,
    servers,
)

import tidemq

pytestmark = pytest.mark.timeout(90)
_ = (server, servers)

_SUMMARY = re.compile(
    r"^produced (\d+) message\(s\), (\d+) bytes in [\d.]+ s \(([\d,]+) msg/s\)$", re.MULTILINE
)


def _produced(result: Result) -> tuple[int, int]:
    found = _SUMMARY.search(result.stderr)
    assert found, result.stderr
    return int(found.group(1)), int(found.group(2))


def test_produce_batches_by_default_keeps_order_and_prints_a_summary(server: Server) -> None:
    b = server.address
    ok("topic", "create", "n-clicks", "--queues", "1", "-n", b)
    lines = [f"line-{i:05d}" for i in range(20_000)]
    started = time.monotonic()
    produced = run("produce", "n-clicks", "-n", b, input="\n".join(lines) + "\n")
    elapsed = time.monotonic() - started
    assert produced.code == 0, produced.stderr
    assert produced.stdout == ""
    # Not a terminal: the summary only, no progress bar.
    assert produced.stderr.count("\n") == 1
    assert _produced(produced) == (20_000, 20_000 * 10)
    assert elapsed < 20, f"20000 lines took {elapsed:.1f} s"
    consumed = ok(
        "consume", "n-clicks", "-n", b, "--from-beginning", "--max-messages", "20000", "-o", "json"
    )
    assert [line.split('"value": "')[1].split('"')[0] for line in consumed.lines()] == lines


def test_produce_spreads_batches_and_keeps_keys_on_their_queue(server: Server) -> None:
    b = server.address
    ok("topic", "create", "n-spread", "--queues", "4", "-n", b)
    many = "".join(f"{i}\n" for i in range(200_000))
    ok("produce", "n-spread", "-n", b, input=many)
    described = ok("topic", "describe", "n-spread", "-n", b, "-o", "json").json()
    counts = [q["max_offset"] for q in described["queue_info"]]
    assert sum(counts) == 200_000
    assert sum(1 for c in counts if c > 0) >= 2  # batch after batch, round robin

    keyed = ok(
        "produce", "n-spread", "-n", b, "--key-separator", ":", "--print-receipts",
        input="a:1\nb:2\na:3\na:4\n",
    )  # fmt: skip
    rows = [line.split("\t") for line in keyed.lines()]
    assert rows[0][0] == rows[2][0] == rows[3][0]
    assert [int(rows[i][1]) for i in (0, 2, 3)] == sorted(int(rows[i][1]) for i in (0, 2, 3))
    assert _produced(keyed) == (4, 8)


def test_a_failed_produce_is_one_error_line_with_the_count(server: Server) -> None:
    result = run("produce", "n-missing", "-n", server.address, input="a\nb\nc\n")
    assert result.code == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: topic 'n-missing' does not exist")
    assert result.stderr.rstrip().endswith("0 of 3 message(s) sent were acknowledged")


def test_topic_create_if_not_exists(server: Server) -> None:
    b = server.address
    first = ok("topic", "create", "n-once", "--queues", "2", "--if-not-exists", "-n", b)
    assert first.stdout == "Created topic 'n-once' with 2 queues.\n"
    again = ok("topic", "create", "n-once", "--queues", "5", "--if-not-exists", "-n", b)
    assert again.stdout == "Topic 'n-once' exists already (2 queues, MIXED).\n"
    as_json = ok("topic", "create", "n-once", "--if-not-exists", "-n", b, "-o", "json").json()
    assert (as_json["name"], as_json["queues"]) == ("n-once", 2)
    refused = cli("topic", "create", "n-once", "-n", b)
    assert (refused.code, refused.stderr) == (1, "error: topic 'n-once' already exists\n")

    with tidemq.Admin(b) as admin:
        existing = admin.create_topic("n-once", 7, message_type="FIFO", exist_ok=True)
        assert (existing.queues, existing.message_type) == (2, "MIXED")  # as it is
        made = admin.create_topic("n-made", 3, exist_ok=True)
        assert made.queues == 3
        with pytest.raises(tidemq.TidemqError, match="already exists"):
            admin.create_topic("n-made", 3)


def test_lists_hide_internal_names_unless_all(server: Server) -> None:
    b = server.address
    ok("topic", "create", "n-pop", "--queues", "1", "-n", b)
    ok("produce", "n-pop", "-n", b, input="x\ny\n")
    with tidemq.SimpleConsumer(b, "n-popper", subscriptions={"n-pop": "*"}) as consumer:
        received: list[tidemq.ReceivedMessage] = []
        deadline = time.monotonic() + 10
        while len(received) < 2 and time.monotonic() < deadline:
            received += consumer.receive(2, invisible_duration=30.0)
        received[0].ack()
        received[1].nack(delay=60.0)  # through %RETRY%n-popper
    topics = [t["name"] for t in ok("topic", "list", "-n", b, "-o", "json").json()]
    everything = [t["name"] for t in ok("topic", "list", "--all", "-n", b, "-o", "json").json()]
    assert "n-pop" in topics
    assert not [t for t in topics if "%" in t]
    assert [t for t in everything if t.startswith("%")]
    assert "%RETRY%n-popper" in everything or "%SYS%TIMER" in everything
    assert "%" not in ok("topic", "list", "-n", b).stdout

    groups = ok("group", "list", "-n", b, "-o", "json").json()
    assert "n-popper" in groups  # a pop group is a group too
    assert not [g for g in groups if "%" in g]
    assert "n-popper" in ok("group", "list", "-a", "-n", b, "-o", "json").json()


def test_failures_are_one_line_and_debug_adds_the_traceback(server: Server) -> None:
    b = server.address
    plain = run("topic", "describe", "n-nothing", "-n", b)
    assert (plain.code, plain.stderr) == (1, "error: topic 'n-nothing' does not exist\n")
    debug = run("--debug", "topic", "describe", "n-nothing", "-n", b)
    assert debug.code == 1
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.endswith("error: topic 'n-nothing' does not exist\n")
    done = subprocess.run(
        [*CLI, "topic", "describe", "n-nothing", "-n", b],
        env={**os.environ, "TIDEMQ_DEBUG": "1"},
        capture_output=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 1
    assert b"Traceback (most recent call last)" in done.stderr


def test_consume_of_a_missing_topic_is_an_error(server: Server) -> None:
    for args in (["--group", "n-g"], []):
        result = run("consume", "n-absent", "--timeout-ms", "100", "-n", server.address, *args)
        assert (result.code, result.stderr) == (1, "error: topic 'n-absent' does not exist\n")


@pytest.mark.skipif(importlib.util.find_spec("pyspark") is None, reason="needs the spark extra")
@pytest.mark.parametrize(
    "args",
    [
        ["archive", "--output", "out"],
        ["analytics", "--output", "out", "--results-topic", ""],
        ["db-sync", "--target", "sqlite:///x.db"],
    ],
    ids=lambda a: a[0],
)
def test_a_pipeline_over_a_missing_topic_is_an_error(
    server: Server, tmp_path: Path, args: list[str]
) -> None:
    result = run(
        "pipeline", *args, "--topic", "n-absent", "--checkpoint", f"{tmp_path}/cp",
        "-n", server.address,
    )  # fmt: skip
    assert (result.code, result.stdout) == (1, "")
    assert result.stderr == "error: topic 'n-absent' does not exist\n"
