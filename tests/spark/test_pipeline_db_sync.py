"""The db-sync pipeline end to end: generated change events -> SQLite shards by seller,
resumed from its checkpoint, then replayed whole from a new checkpoint (a no-op)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from tidemq import Admin, Producer
from tidemq.cli.main import app
from tidemq.spark.pipelines.changes import (
    TABLES,
    State,
    expected_state,
    generate_changes,
    produce_changes,
)
from tidemq.spark.pipelines.db_sync import run_db_sync

if TYPE_CHECKING:
    from tests.spark.conftest import ThreadedBroker

pytestmark = pytest.mark.spark

QUEUES = 4
SHARDS = 3


def _read_shard(path: Path) -> dict[str, dict[tuple[Any, ...], dict[str, Any]]]:
    """A shard's tables, read with the standard library, keyed like expected_state."""
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        out = {}
        for name, spec in TABLES.items():
            rows = [dict(r) for r in conn.execute(f"SELECT * FROM {name}")]
            out[name] = {tuple(r[c] for c in spec.pk): r for r in rows}
        return out
    finally:
        conn.close()


def _applied(path: Path) -> dict[tuple[str, int], int]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT topic, queue, next_offset FROM tidemq_applied").fetchall()
        return {(t, q): n for t, q, n in rows}
    finally:
        conn.close()


def _state(root: Path, shards: int) -> State:
    return {s: _read_shard(root / f"shard_{s}.db") for s in range(shards)}


def test_db_sync_resume_and_full_replay(
    spark: SparkSession, broker: ThreadedBroker, admin: Admin, topic_name: str, tmp_path: Path
) -> None:
    events = generate_changes(200, seed=21)
    first, rest = events[: len(events) * 3 // 5], events[len(events) * 3 // 5 :]
    admin.create_topic(topic_name, QUEUES)
    assert produce_changes(broker.address, topic_name, first) == len(first)
    target = f"sqlite:///{tmp_path}/shard_{{shard}}.db"

    def run(checkpoint: str, limit: int | None) -> int:
        query = run_db_sync(
            spark,
            bootstrap=broker.address,
            topics=[topic_name],
            target=target,
            shards=SHARDS,
            checkpoint=tmp_path / checkpoint,
            max_offsets_per_trigger=limit,
        )
        assert query.exception() is None
        batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
        assert sum(p["numInputRows"] for p in batches) > 0
        return len(batches)

    # Several micro-batches: every shard holds exactly the reference state.
    assert run("checkpoint", 500) >= 2
    assert _state(tmp_path, SHARDS) == expected_state(first, SHARDS)

    # More events (later changes of the same orders too), resumed from the checkpoint.
    produce_changes(broker.address, topic_name, rest)
    run("checkpoint", None)
    want = expected_state(events, SHARDS)
    assert _state(tmp_path, SHARDS) == want
    positions = {s: _applied(tmp_path / f"shard_{s}.db") for s in range(SHARDS)}
    per_queue = {q: n for (_, q), n in positions[0].items()}
    assert sum(per_queue.values()) == len(events)
    assert all(p == positions[0] for p in positions.values())

    # A new checkpoint reads everything again from offset 0: tidemq_applied makes every
    # event a no-op, down to the bytes of the database files.
    before = {p.name: p.read_bytes() for p in tmp_path.glob("shard_*.db")}
    run("new-checkpoint", None)
    assert _state(tmp_path, SHARDS) == want
    assert {p.name: p.read_bytes() for p in tmp_path.glob("shard_*.db")} == before


def test_db_sync_cli_and_a_bad_event(
    spark: SparkSession,
    broker: ThreadedBroker,
    admin: Admin,
    producer: Producer,
    topic_name: str,
    tmp_path: Path,
) -> None:
    events = generate_changes(20, seed=5)
    admin.create_topic(topic_name, 1)
    produce_changes(broker.address, topic_name, events)
    args = ["pipeline", "db-sync", "--bootstrap", broker.address, "--topic", topic_name]
    args += ["--target", f"sqlite:///{tmp_path}/shard_{{shard}}.db", "--shards", "2"]
    args += ["--checkpoint", str(tmp_path / "checkpoint")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"synced {len(events)} change event(s) in 1 micro-batch(es) to 2 shard(s)" in (
        result.stdout
    )
    assert _state(tmp_path, 2) == expected_state(events, 2)
    assert spark.sparkContext._jsc is not None  # the CLI kept the session it did not create

    # A value that is not an event fails the query, naming where it is.
    producer.send(topic_name, b'{"op": "insert"}', key=b"1")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "the db-sync query failed" in result.stderr
    assert f"topic {topic_name!r} queue 0 offset {len(events)}: not a change event" in (
        result.stderr
    )
    assert _state(tmp_path, 2) == expected_state(events, 2)

    # A template without {shard} for several shards: refused before Spark runs.
    bad = [*args[:6], "--target", f"sqlite:///{tmp_path}/one.db", "--shards", "2"]
    result = CliRunner().invoke(app, [*bad, "--checkpoint", str(tmp_path / "c2")])
    assert result.exit_code == 2
    assert "no {shard} placeholder" in result.stderr


def test_run_db_sync_refuses_bad_arguments(spark: SparkSession, tmp_path: Path) -> None:
    common: dict[str, Any] = {"bootstrap": "127.0.0.1:1", "checkpoint": tmp_path / "c"}
    with pytest.raises(ValueError, match="at least one topic"):
        run_db_sync(spark, topics=[], target="sqlite://", shards=1, **common)
    with pytest.raises(ValueError, match="cannot shard by 'sku'"):
        run_db_sync(spark, topics=["t"], target="sqlite://", shards=1, shard_column="sku", **common)
    with pytest.raises(ValueError, match="trigger must be"):
        run_db_sync(spark, topics=["t"], target="sqlite://", shards=1, trigger="once", **common)  # type: ignore[arg-type]
