"""The `tidemq` command against real servers on 127.0.0.1.

Servers run as subprocesses (`python -m tidemq.cli.main server --port 0`); the test reads
the `serving on HOST:PORT` line from their stderr. Client commands mostly run in-process
through typer's CliRunner (fast); the ones whose exit status, stderr and stdin handling
matter end to end run as subprocesses too. Every process started here is killed at the
end, whatever happens.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import tidemq
from tidemq import Producer
from tidemq.cli.main import app

pytestmark = pytest.mark.timeout(60)

CLI = [sys.executable, "-m", "tidemq.cli.main"]
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0
RUN_TIMEOUT_S = 30.0
_SERVING = re.compile(r"^serving on (\S+:\d+)$", re.MULTILINE)


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    address: str
    log: Path

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=STOP_TIMEOUT_S)

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


class Servers:
    """Starts server processes; kills whatever is still running at teardown."""

    def __init__(self, base: Path) -> None:
        self._base = base
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, name: str = "server") -> Server:
        log = self._base / f"{name}-{len(self._procs)}.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [*CLI, *args, "--port", "0", "--log-level", "warning"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=self._base,
            )
        self._procs.append(proc)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            found = _SERVING.search(log.read_text(errors="replace"))
            if found:
                return Server(proc, found.group(1), log)
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode}: {log.read_text()}")
            time.sleep(0.05)
        pytest.fail(f"{name} did not print 'serving on' in {START_TIMEOUT_S} s: {log.read_text()}")

    def kill_all(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    started = Servers(tmp_path_factory.mktemp("servers"))
    try:
        yield started
    finally:
        started.kill_all()


@pytest.fixture(scope="module")
def server(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Server:
    """One shared `tidemq server`; tests use topics and groups of their own."""
    data = tmp_path_factory.mktemp("shared-data")
    return servers.start("server", "--data-dir", str(data), "--flush", "async")


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    def lines(self) -> list[str]:
        return self.stdout.splitlines()


def cli(*args: str, input: str | None = None) -> Result:
    """Run one client command in this process."""
    result = CliRunner().invoke(app, list(args), input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Result(result.exit_code, result.stdout, result.stderr)


def run(*args: str, input: str | None = None, cwd: Path | None = None) -> Result:
    """Run one command as its own process, like a user would."""
    done = subprocess.run(
        [*CLI, *args],
        input=(input or "").encode(),
        capture_output=True,
        timeout=RUN_TIMEOUT_S,
        cwd=cwd,
        check=False,
    )
    return Result(
        done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode("utf-8")
    )


def ok(*args: str, input: str | None = None) -> Result:
    result = cli(*args, input=input)
    assert result.code == 0, result.stderr
    return result


# ------------------------------------------------------------------ server lifecycle


def test_server_stops_on_sigterm_and_keeps_data_across_restart(
    servers: Servers, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    first = servers.start("server", "--data-dir", str(data), name="restart")
    b = first.address
    ok("topic", "create", "durable", "--queues", "1", "-n", b)
    lines = ["one", "two", "three"]
    produced = run("produce", "durable", "--bootstrap", b, input="\n".join(lines) + "\n")
    assert (produced.code, produced.stdout) == (0, "")
    assert produced.stderr.startswith("produced 3 message(s), 11 bytes in ")

    assert first.stop(signal.SIGTERM) == 0
    assert "Traceback" not in first.stderr()
    assert (data / "meta.sqlite").exists()

    second = servers.start("server", "--data-dir", str(data), name="restart")
    consumed = run(
        "consume", "durable", "--from-beginning", "--max-messages", "3", "--bootstrap-server",
        second.address,
    )  # fmt: skip
    assert consumed.code == 0, consumed.stderr
    assert consumed.lines() == lines
    described = ok("topic", "describe", "durable", "-n", second.address, "-o", "json").json()
    assert [(q["min_offset"], q["max_offset"]) for q in described["queue_info"]] == [(0, 3)]
    assert second.stop(signal.SIGINT) == 0
    assert "Traceback" not in second.stderr()


def test_port_in_use_is_an_error(server: Server, tmp_path: Path) -> None:
    port = server.address.rpartition(":")[2]
    result = run("server", "--port", port, "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    assert result.code == 1
    assert "error: " in result.stderr
    assert "address already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_http_port_in_use_is_an_error_naming_the_flag(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = run(
            "server", "--port", "0", "--http-port", port, "--data-dir", str(tmp_path / "d"),
            cwd=tmp_path,
        )  # fmt: skip
    assert result.code == 1
    assert "HTTP listener cannot bind" in result.stderr
    assert "--http-port" in result.stderr
    assert "Traceback" not in result.stderr


def test_namesrv_and_broker_in_separate_processes(servers: Servers, tmp_path: Path) -> None:
    ns = servers.start("namesrv", name="namesrv")
    broker = servers.start(
        "broker", "--namesrv", ns.address, "--broker-name", "b1", "--data-dir",
        str(tmp_path / "b1"), name="broker",
    )  # fmt: skip
    brokers = ok("cluster", "list", "-n", ns.address, "-o", "json").json()
    assert [(b["name"], b["address"]) for b in brokers] == [("b1", broker.address)]
    ok("topic", "create", "apart", "--queues", "2", "-n", ns.address)
    ok("produce", "apart", "-n", ns.address, "--queue", "1", input="x\ny\n")
    consumed = ok(
        "consume", "apart", "-n", ns.address, "--from-beginning", "--max-messages", "2",
        "--timeout-ms", "5000",
    )  # fmt: skip
    assert consumed.lines() == ["x", "y"]
    assert broker.stop() == 0
    assert ns.stop() == 0


# ------------------------------------------------------------------ topics


def test_topic_create_list_describe_alter_delete(server: Server) -> None:
    b = server.address
    created = ok("topic", "create", "t-admin", "--queues", "2", "--config", "retention.ms=60000",
                 "-n", b, "-o", "json").json()  # fmt: skip
    assert (created["name"], created["queues"], created["message_type"]) == ("t-admin", 2, "MIXED")
    assert created["config"]["retention.ms"] == "60000"
    ok("topic", "create", "--topic", "t-admin-fifo", "--type", "fifo", "-n", b)

    listed = {t["name"]: t for t in ok("topic", "list", "-n", b, "-o", "json").json()}
    assert listed["t-admin"]["queues"] == 2
    assert listed["t-admin-fifo"]["message_type"] == "FIFO"
    table = ok("topic", "list", "-n", b).stdout
    assert re.search(r"^t-admin\s+2\s+MIXED\s", table, re.MULTILINE)

    described = ok("topic", "describe", "t-admin", "-n", b, "-o", "json").json()
    assert [(q["queue"], q["min_offset"], q["max_offset"], q["broker"])
            for q in described["queue_info"]] == [(0, 0, 0, b), (1, 0, 0, b)]  # fmt: skip
    table = ok("topic", "describe", "t-admin", "-n", b).stdout
    assert "Topic: t-admin" in table
    assert re.search(rf"^1\s+0\s+0\s+0\s+{re.escape(b)}$", table, re.MULTILINE)

    altered = ok("topic", "alter", "t-admin", "--queues", "4", "--config", "retention.ms=1000",
                 "-n", b, "-o", "json").json()  # fmt: skip
    assert altered["queues"] == 4
    assert altered["config"]["retention.ms"] == "1000"
    assert len(ok("topic", "describe", "t-admin", "-n", b, "-o", "json").json()["queue_info"]) == 4

    deleted = ok("topic", "delete", "t-admin", "-n", b)
    assert "Deleted topic 't-admin'" in deleted.stdout
    names = [t["name"] for t in ok("topic", "list", "-n", b, "-o", "json").json()]
    assert "t-admin" not in names
    assert "t-admin-fifo" in names


def test_compact_topic_kv_get_and_compact(server: Server) -> None:
    b = server.address
    ok("topic", "create", "t-kv", "--queues", "2", "--config", "cleanup.policy=compact", "-n", b)
    lines = "AAPL:101\nMSFT:300\nAAPL:102\nMSFT:\u00e9t\u00e9\n"
    ok("produce", "t-kv", "--key-separator", ":", "-n", b, input=lines)
    assert ok("kv", "get", "t-kv", "AAPL", "-n", b).stdout == "102\n"
    found = ok("kv", "get", "t-kv", "MSFT", "-n", b, "-o", "json").json()
    assert found["value"] == "\u00e9t\u00e9"
    assert found["offset"] == 1
    missing = cli("kv", "get", "t-kv", "IBM", "-n", b)
    assert missing.code == 1
    assert "has no value" in missing.stderr
    runs = ok("topic", "compact", "t-kv", "-n", b, "-o", "json").json()
    assert sum(r["messages_in"] for r in runs) == 4
    assert sum(r["messages_out"] for r in runs) == 2
    assert ok("kv", "get", "t-kv", "AAPL", "-n", b).stdout == "102\n"
    described = ok("topic", "describe", "t-kv", "-n", b, "-o", "json").json()
    assert sorted(q["compacted_end"] for q in described["queue_info"]) == sorted(
        q["max_offset"] for q in described["queue_info"]
    )
    assert "COMPACTED BELOW" in ok("topic", "describe", "t-kv", "-n", b).stdout
    ok("topic", "create", "t-kv-plain", "-n", b)
    plain = cli("topic", "compact", "t-kv-plain", "-n", b)
    assert plain.code == 1
    assert "only compact topics" in plain.stderr


def test_topic_errors(server: Server) -> None:
    b = server.address
    ok("topic", "create", "t-dup", "-n", b)
    again = cli("topic", "create", "t-dup", "-n", b)
    assert again.code == 1
    assert again.stderr == "error: topic 't-dup' already exists\n"
    bad = cli("topic", "create", "t-bad", "--config", "no.such.key=1", "-n", b)
    assert bad.code == 1
    assert "no.such.key" in bad.stderr
    assert cli("topic", "create", "t-bad", "--config", "novalue", "-n", b).code == 2
    assert cli("topic", "alter", "t-dup", "-n", b).code == 2  # nothing to alter
    assert cli("topic", "create", "-n", b).code == 2  # no topic


def test_unknown_topic_exits_1_with_a_clear_message(server: Server) -> None:
    # As a process: the real exit status and stderr, no traceback.
    result = run("consume", "no-such-topic", "--timeout-ms", "100", "-n", server.address)
    assert (result.code, result.stdout) == (1, "")
    assert result.stderr == "error: topic 'no-such-topic' does not exist\n"
    for args in (["topic", "describe", "no-such-topic"], ["topic", "delete", "no-such-topic"]):
        result = cli(*args, "-n", server.address)
        assert (result.code, result.stdout) == (1, ""), args
        assert result.stderr == "error: topic 'no-such-topic' does not exist\n", args
    produced = run("produce", "no-such-topic", "-n", server.address, input="x\n")
    assert produced.code == 1
    assert produced.stderr.startswith("error: ")
    assert "no-such-topic" in produced.stderr
    assert "Traceback" not in produced.stderr


# ------------------------------------------------------------------ produce / consume


def test_produce_lines_then_consume_them_back_in_order(server: Server) -> None:
    b = server.address
    ok("topic", "create", "t-order", "--queues", "1", "-n", b)
    lines = [f"message {i}" for i in range(20)] + ["", "ünïcødé ✓", "tab\there"]
    ok("produce", "t-order", "-n", b, input="\n".join(lines) + "\n")
    consumed = ok("consume", "t-order", "-n", b, "--from-beginning", "--max-messages",
                  str(len(lines)))  # fmt: skip
    assert consumed.lines() == lines
    assert consumed.stderr == f"Processed a total of {len(lines)} messages\n"

    # Without --from-beginning, a consumer starts at the end: nothing to read.
    idle = ok("consume", "t-order", "-n", b, "--timeout-ms", "300")
    assert idle.stdout == ""


def test_produce_keys_tags_receipts_and_batches(server: Server) -> None:
    b = server.address
    ok("topic", "create", "t-keys", "--queues", "3", "-n", b)
    receipts = ok("produce", "t-keys", "-n", b, "--key-separator", ":", "--tag", "paid",
                  "--print-receipts", input="k1:v1\nk1:v2\nk2:a:b\n")  # fmt: skip
    rows = [line.split("\t") for line in receipts.lines()]
    assert len(rows) == 3
    assert rows[0][0] == rows[1][0]  # one key, one queue
    assert [int(r[1]) for r in rows[:2]] == [int(rows[0][1]), int(rows[0][1]) + 1]

    batch = ok("produce", "t-keys", "-n", b, "--batch", "--queue", "2", "--print-receipts",
               "-o", "json", input="".join(f"b{i}\n" for i in range(50)))  # fmt: skip
    stamped = [json.loads(line) for line in batch.lines()]
    assert [r["queue"] for r in stamped] == [2] * 50
    offsets = [r["offset"] for r in stamped]
    assert offsets == list(range(offsets[0], offsets[0] + 50))

    shown = ok("consume", "t-keys", "-n", b, "--from-beginning", "--queue", "2",
               "--max-messages", "50", "-o", "json").lines()  # fmt: skip
    assert [json.loads(line)["value"] for line in shown][-50:] == [f"b{i}" for i in range(50)]

    keyed = ok("consume", "t-keys", "-n", b, "--from-beginning", "--queue", rows[0][0],
               "--print-key", "--print-offset", "--max-messages", "2").lines()  # fmt: skip
    assert keyed[:2] == [
        f"Queue:{rows[0][0]}\tOffset:{rows[0][1]}\tk1\tv1",
        f"Queue:{rows[0][0]}\tOffset:{int(rows[0][1]) + 1}\tk1\tv2",
    ]
    as_json = ok("consume", "t-keys", "-n", b, "--from-beginning", "--queue", rows[2][0],
                 "-o", "json", "--timeout-ms", "500").lines()  # fmt: skip
    record = next(json.loads(line) for line in as_json if json.loads(line)["key"] == "k2")
    assert (record["value"], record["tag"]) == ("a:b", "paid")

    missing = cli("produce", "t-keys", "-n", b, "--key-separator", "=", input="no separator\n")
    assert missing.code == 2
    assert "line 1 has no key separator" in missing.stderr


def test_consume_with_a_group_continues_where_it_left(server: Server) -> None:
    b = server.address
    ok("topic", "create", "t-group", "--queues", "1", "-n", b)
    ok("produce", "t-group", "-n", b, input="".join(f"m{i}\n" for i in range(5)))
    args = ["consume", "t-group", "-n", b, "--group", "g-continue", "--from-beginning"]
    assert ok(*args, "--max-messages", "2").lines() == ["m0", "m1"]
    assert ok(*args, "--max-messages", "3").lines() == ["m2", "m3", "m4"]
    assert ok(*args, "--timeout-ms", "1000").lines() == []
    ok("produce", "t-group", "-n", b, input="m5\n")
    assert ok(*args, "--max-messages", "1").lines() == ["m5"]


# ------------------------------------------------------------------ groups


def _committed(b: str, group: str) -> list[int]:
    described = ok("group", "describe", group, "-n", b, "-o", "json").json()
    return [o["committed"] for o in described["offsets"]]


def test_group_list_describe_and_reset_offsets(server: Server) -> None:
    b = server.address
    ok("topic", "create", "t-reset", "--queues", "1", "-n", b)
    ok("produce", "t-reset", "-n", b, input="".join(f"r{i}\n" for i in range(6)))
    ok("consume", "t-reset", "-n", b, "--group", "g-reset", "--from-beginning",
       "--max-messages", "6")  # fmt: skip

    assert "g-reset" in ok("group", "list", "-n", b, "-o", "json").json()
    assert re.search(r"^g-reset\s*$", ok("group", "list", "-n", b).stdout, re.MULTILINE)
    described = ok("group", "describe", "g-reset", "-n", b, "-o", "json").json()
    assert described["offsets"] == [
        {"topic": "t-reset", "queue": 0, "committed": 6, "max_offset": 6, "lag": 0}
    ]
    table = ok("group", "describe", "g-reset", "-n", b).stdout
    assert re.search(r"^t-reset\s+0\s+6\s+6\s+0\s*$", table, re.MULTILINE)

    reset = ["group", "reset-offsets", "g-reset", "--topic", "t-reset", "-n", b]
    dry = ok(*reset, "--to-earliest")
    assert re.search(r"^t-reset\s+0\s+6\s+0\s*$", dry.stdout, re.MULTILINE)
    assert "Dry run" in dry.stdout
    assert _committed(b, "g-reset") == [6]  # nothing changed

    plan = ok(*reset, "--to-earliest", "--execute", "-o", "json").json()
    assert plan == {
        "group": "g-reset",
        "executed": True,
        "offsets": [{"topic": "t-reset", "queue": 0, "current": 6, "new": 0}],
    }
    assert _committed(b, "g-reset") == [0]
    ok(*reset, "--shift-by", "2", "--execute")
    assert _committed(b, "g-reset") == [2]
    ok(*reset, "--shift-by", "-1", "--execute")
    assert _committed(b, "g-reset") == [1]
    ok(*reset, "--to-offset", "4", "--execute")
    assert _committed(b, "g-reset") == [4]
    ok(*reset, "--to-datetime", "2000-01-01T00:00:00+00:00", "--execute")
    assert _committed(b, "g-reset") == [0]
    ok(*reset, "--to-latest", "--execute")
    assert _committed(b, "g-reset") == [6]
    # The group picks up from the reset position.
    ok(*reset, "--to-offset", "5", "--execute")
    assert ok(
        "consume", "t-reset", "-n", b, "--group", "g-reset", "--max-messages", "1"
    ).lines() == ["r5"]

    assert cli(*reset).code == 2  # no target
    assert cli(*reset, "--to-earliest", "--to-latest").code == 2
    assert cli(*reset, "--to-datetime", "yesterday").code == 2
    missing = cli("group", "describe", "g-never", "-n", b)
    assert (missing.code, missing.stderr) == (1, "error: consumer group 'g-never' does not exist\n")


# ------------------------------------------------------------------ output, errors


def test_json_output_parses(server: Server) -> None:
    b = server.address
    ok("topic", "create", "t-json", "--queues", "1", "-n", b)
    for args in (
        ["topic", "list"],
        ["topic", "describe", "t-json"],
        ["group", "list"],
        ["cluster", "list"],
        ["cluster", "status"],
    ):
        result = ok(*args, "-n", b, "--output", "json")
        assert isinstance(result.json(), (list, dict)), args
    status = ok("cluster", "status", "-n", b, "-o", "json").json()
    assert status[0]["address"] == b
    assert status[0]["status"]["flush_mode"] == "async"
    assert "broker-0" in ok("cluster", "status", "-n", b).stdout


def test_usage_and_connection_errors(tmp_path: Path) -> None:
    refused = cli("topic", "list", "-n", "127.0.0.1:1")
    assert refused.code == 1
    assert refused.stderr.startswith("error: cannot connect to 127.0.0.1:1")
    bad_address = cli("topic", "list", "-n", "nonsense")
    assert (bad_address.code, bad_address.stderr) == (
        2,
        "error: --bootstrap must be host:port, got 'nonsense'\n",
    )
    assert cli("topic", "list", "--no-such-option").code == 2
    assert cli("topic", "list", "-o", "yaml").code == 2
    assert cli("consume", "t", "--group", "g", "--queue", "0").code == 2


def test_bad_config_key_exits_2_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "tidemq.toml"
    config.write_text("[broker]\nprot = 9876\n")
    result = run("server", "--config", str(config), "--data-dir", str(tmp_path / "d"))
    assert result.code == 2
    assert "broker.prot" in result.stderr
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr

    env = {**os.environ, "TIDEMQ_STORE__FLUSH_MODE": "sometimes"}
    done = subprocess.run(
        [*CLI, "server", "--data-dir", str(tmp_path / "d")],
        env=env,
        capture_output=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 2
    assert b"TIDEMQ_STORE__FLUSH_MODE" in done.stderr
    assert b"store.flush_mode" in done.stderr


# ------------------------------------------------------------------ timers, transactions


def test_timer_and_txn_status_and_cancel(server: Server) -> None:
    b = server.address
    ok("topic", "create", "t-timer", "--queues", "1", "-n", b)
    with Producer(b) as producer:
        receipt = producer.send("t-timer", b"later", delay=600.0)
        producer.send("t-timer", b"later-too", delay=900.0)
    status = ok("timer", "status", "--topic", "t-timer", "-n", b, "-o", "json").json()
    assert [(t["topic"], t["pending_messages"]) for t in status["topics"]] == [("t-timer", 2)]
    table = ok("timer", "status", "-n", b).stdout
    assert re.search(r"^t-timer\s+2\s+2\s", table, re.MULTILINE)
    out = ok("timer", "cancel", receipt.message_id, "-n", b).stdout
    assert out.startswith("cancelled 1 message(s) for t-timer")
    again = cli("timer", "cancel", receipt.message_id, "-n", b)
    assert again.code == 1
    assert "already delivered or cancelled" in again.stderr
    txns = ok("txn", "status", "-n", b, "-o", "json").json()
    assert txns["open"] == []
    assert txns["max_checks"] == 15
    assert "committed" in ok("txn", "status", "-n", b).stdout


def test_txn_rollback(server: Server) -> None:
    b = server.address
    ok("topic", "create", "t-rollback", "--queues", "1", "-n", b)
    with tidemq.TransactionProducer(b, "g-rollback") as txns:
        txn = txns.begin()
        txn.send("t-rollback", b"half")
        (open_txn,) = ok("txn", "status", "-n", b, "-o", "json").json()["open"]
        out = ok("txn", "rollback", open_txn["txn_id"], "-n", b).stdout
        assert out.strip() == f"rolled back {open_txn['txn_id']}"
        assert ok("txn", "status", "-n", b, "-o", "json").json()["open"] == []
        with pytest.raises(tidemq.TidemqError, match="rolled back"):
            txn.commit()  # the producer learns its transaction is gone
    unknown = cli("txn", "rollback", "nope", "-n", b)
    assert unknown.code == 1
    assert "no broker holds transaction 'nope'" in unknown.stderr
    with tidemq.StreamConsumer(b, start="earliest") as consumer:  # nothing was published
        consumer.assign([("t-rollback", 0)])
        assert consumer.poll(300) == []


def test_message_query_by_key_and_time(server: Server) -> None:
    b = server.address
    ok("topic", "create", "t-keyq", "--queues", "2", "-n", b)
    with Producer(b) as producer:
        old = producer.send("t-keyq", b"old", key=b"order-1", timestamp=1_700_000_000.0)
        new = producer.send("t-keyq", b"new", keys=["order-1", "cust-9"], queue=1)
        producer.send("t-keyq", b"other", key=b"order-2")
    found = ok("message", "query", "t-keyq", "--key", "order-1", "-n", b, "-o", "json")
    rows = [json.loads(line) for line in found.lines()]
    assert [r["id"] for r in rows] == [new.message_id, old.message_id]  # newest first
    assert rows[0]["keys"] == ["order-1", "cust-9"]
    one = ok("message", "query", "t-keyq", "-k", "order-1", "--limit", "1", "-n", b, "-o", "json")
    assert [json.loads(line)["value"] for line in one.lines()] == ["new"]
    later = ok("message", "query", "t-keyq", "--key", "order-1",
               "--from", "2999-01-01T00:00:00+00:00", "-n", b, "-o", "json")  # fmt: skip
    assert later.stdout == ""
    table = ok("message", "query", "t-keyq", "--key", "cust-9", "-n", b)
    assert new.message_id in table.stdout
    bad = cli("message", "query", "t-keyq", "--key", "k", "--from", "yesterday", "-n", b)
    assert bad.code == 2
    assert "--from" in bad.stderr


def test_message_get_by_id_offset_and_time(server: Server) -> None:
    b = server.address
    ok("topic", "create", "t-lookup", "--queues", "1", "-n", b)
    with Producer(b) as producer:
        receipt = producer.send("t-lookup", b"hello", key=b"k1", timestamp=1_700_000_000.0)
    by_id = ok("message", "get", receipt.message_id, "-n", b, "-o", "json").json()
    assert (by_id["value"], by_id["key"], by_id["offset"]) == ("hello", "k1", receipt.offset)
    by_offset = ok("message", "get", "-t", "t-lookup", "--queue", "0", "--offset", "0", "-n", b)
    assert "hello" in by_offset.stdout
    by_time = ok("message", "get", "-t", "t-lookup", "--queue", "0",
                 "--at", "2023-11-14T00:00:00+00:00", "-n", b, "-o", "json").json()  # fmt: skip
    assert by_time["id"] == receipt.message_id
    missing = cli("message", "get", "-t", "t-lookup", "--queue", "0", "--offset", "9", "-n", b)
    assert missing.code == 1
    assert "no message is stored there" in missing.stderr
    both = cli("message", "get", receipt.message_id, "--offset", "0", "-n", b)
    assert both.code == 2
