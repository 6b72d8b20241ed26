"""The analytics pipeline end to end on generated events: every finished window and
session equals a pure-Python reference, in Parquet and in the results topic, exactly once
across a resumed run; invalid events land in `rejected`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.dataset as ds
import pytest
from pyspark.sql import SparkSession
from tests.support.analytics_results import CONFIG, INVALID, check, sample_events, topic_rows
from typer.testing import CliRunner

import tidemq
from tidemq import Admin, Producer
from tidemq.cli.main import app
from tidemq.spark.pipelines.analytics import AnalyticsConfig, AnalyticsRun, run_analytics
from tidemq.spark.pipelines.events import Event, generate_events, produce_events

if TYPE_CHECKING:
    from tests.spark.conftest import Consume, Options

pytestmark = pytest.mark.spark


def test_analytics_end_to_end_and_resume(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    options: Options,
    consume: Consume,
    topic_name: str,
    tmp_path: Path,
) -> None:
    bootstrap = options()["bootstrap"]
    events = sample_events()
    first, second = events[:2000], events[2000:]
    produce_events(bootstrap, topic_name, first, queues=3)
    bad = [producer.send(topic_name, value, queue=1) for value in INVALID]
    output, checkpoint, results = tmp_path / "out", tmp_path / "checkpoint", topic_name + "-out"

    def run() -> AnalyticsRun:
        return run_analytics(
            spark,
            bootstrap=bootstrap,
            topics=[topic_name],
            output=output,
            checkpoint=checkpoint,
            results_topic=results,
            name=topic_name,
            config=CONFIG,
            # 4 batches, then 2. Each reads the same share of every queue (in proportion),
            # so the watermark after batch N trails N quarters of the events' time span:
            # the last batch's is past the first windows.
            max_offsets_per_trigger=501,
        )

    done = run()
    # Spark counts the rows of every scan of the source: read once per micro-batch, they
    # are the topic's (four reads counted 4 x 2003).
    assert done.rows() == 2003
    assert done.rejected_rows() == len(INVALID)
    rows_first = check(done, first, output, admin=admin, consume=consume, topic=results)

    # Rejected: exactly the invalid messages, with their offsets.
    rejected = ds.dataset(output / "rejected", format="parquet", partitioning="hive").to_table()
    assert sorted(
        zip(rejected["partition"].to_pylist(), rejected["offset"].to_pylist(), strict=True)
    ) == [(r.queue, r.offset) for r in bad]

    # Resume with more events: the results grow, nothing is written twice.
    produce_events(bootstrap, topic_name, second)
    again = run()
    assert again.rows() == len(second)
    assert check(again, events, output, admin=admin, consume=consume, topic=results) > rows_first
    assert not [p for p in output.rglob(".*") if p.is_file()]  # no temporary file left


def test_generate_events_and_analytics_cli(
    spark: SparkSession, options: Options, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = options()["bootstrap"]
    runner = CliRunner()
    gen = ["pipeline", "generate-events", "--bootstrap", bootstrap, "--topic", topic_name]
    result = runner.invoke(app, [*gen, "--count", "300", "--users", "20", "--queues", "2"])
    assert result.exit_code == 0, result.output
    assert "sent 300 event(s)" in result.output
    args = ["pipeline", "analytics", "--bootstrap", bootstrap, "--topic", topic_name]
    args += ["--output", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "cp")]
    args += ["--results-topic", topic_name + "-out", "--tumbling", "60", "--watermark", "30"]
    args += ["--max-offsets-per-trigger", "150"]  # two batches: the first moves the watermark
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "processed 300 event(s)" in result.output
    assert list((tmp_path / "out" / "tumbling").rglob("*.parquet"))


def test_runs_with_other_checkpoints_do_not_share_sink_markers(
    spark: SparkSession,
    admin: Admin,
    options: Options,
    consume: Consume,
    topic_name: str,
    tmp_path: Path,
) -> None:
    """Issue 21: a second run with another input, checkpoint and results topic but the
    default name wrote nothing to its results topic (the first run's markers for the
    shared sink ids made it skip its batches) and exited 0. Sink ids now carry the
    checkpoint's token: both runs publish all their results."""
    bootstrap = options()["bootstrap"]
    events = generate_events(400, users=30, items=10, seed=11, idle_s=120, session_pause_s=20)
    counts = []
    for run_no in (1, 2):
        topic = f"{topic_name}-{run_no}"
        produce_events(bootstrap, topic, events, queues=3)
        run_analytics(
            spark,
            bootstrap=bootstrap,
            topics=[topic],
            output=tmp_path / f"out{run_no}",
            checkpoint=tmp_path / f"cp{run_no}",
            results_topic=topic + "-out",
            config=CONFIG,
            max_offsets_per_trigger=200,  # two batches: the first moves the watermark
        )  # the default name, "analytics", both times
        counts.append(sum(topic_rows(admin, consume, topic + "-out").values()))
    assert counts[0] > 0
    assert counts[1] == counts[0]
    # Shuffle partitions: one per input queue (3), kept in the checkpoint, whatever the
    # session's (2 in these tests; Spark's default is 200), which is left as it was.
    offsets = (tmp_path / "cp1" / "query" / "offsets" / "0").read_text()
    assert '"spark.sql.shuffle.partitions":"3"' in offsets
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"


def test_avro_events_give_the_same_results_as_json(
    spark: SparkSession,
    admin: Admin,
    options: Options,
    consume: Consume,
    topic_name: str,
    registry_url: str,
    tmp_path: Path,
) -> None:
    """The seed's log-analytics case with a schema: events produced typed (Avro from the
    Event dataclass, registered under <topic>-value), read typed by Spark, and the results
    equal the reference, as on the JSON path."""
    bootstrap = options()["bootstrap"]
    events = sample_events()[:1500]
    serializer = tidemq.AvroSerializer(tidemq.SchemaRegistry(registry_url), Event)
    produce_events(bootstrap, topic_name, events, queues=2, value_serializer=serializer)
    output, results = tmp_path / "out", topic_name + "-out"
    run = run_analytics(
        spark,
        bootstrap=bootstrap,
        topics=[topic_name],
        output=output,
        checkpoint=tmp_path / "checkpoint",
        results_topic=results,
        name=topic_name,
        config=CONFIG,
        max_offsets_per_trigger=600,  # 3 batches: the watermark moves past windows
        value_format="avro",
        schema_registry=registry_url,
    )
    assert run.rows() == 1500
    check(run, events, output, admin=admin, consume=consume, topic=results)
    with pytest.raises(ValueError, match="needs the schema registry"):
        run_analytics(
            spark, bootstrap=bootstrap, topics=[topic_name], output=output,
            checkpoint=tmp_path / "other", value_format="avro",
        )  # fmt: skip


def test_a_checkpoint_of_the_four_query_analytics_is_refused(
    spark: SparkSession, options: Options, topic_name: str, tmp_path: Path
) -> None:
    """A checkpoint of the analytics that ran one query per kind (before ADR 16) holds
    state the single query cannot take over: the run fails with what to do instead of
    starting from scratch behind the old outputs."""
    bootstrap = options()["bootstrap"]
    produce_events(bootstrap, topic_name, sample_events()[:10], queues=1)
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "tumbling" / "offsets").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"older analytics .*tumbling.* new checkpoint"):
        run_analytics(
            spark, bootstrap=bootstrap, topics=[topic_name], output=tmp_path / "out",
            checkpoint=checkpoint, results_topic=None,
        )  # fmt: skip
    assert not (checkpoint / "query").exists()


def test_a_skewed_backlog_loses_no_event_to_the_watermark(
    spark: SparkSession, options: Options, topic_name: str, tmp_path: Path
) -> None:
    """Queues of very different sizes over the same event time: the batch limit is split
    in proportion, so every queue moves through its backlog at the same pace. With an
    even split the small queue was read whole first, its newest events moved the
    watermark past the big queue's older ones, and Spark dropped those as late."""
    bootstrap = options()["bootstrap"]
    events = generate_events(
        2000, users=100, items=20, seed=3, idle_s=120, session_pause_s=20, disorder_s=5
    )
    # User 1's events alone on queue 1, everyone else's on queue 0 (keys pick queues, so
    # send by queue here).
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, 2)
    with Producer(bootstrap) as producer:
        for e in events:
            producer.send(topic_name, e.to_json(), queue=1 if e.user_id == 1 else 0)
    run = run_analytics(
        spark,
        bootstrap=bootstrap,
        topics=[topic_name],
        output=tmp_path / "out",
        checkpoint=tmp_path / "cp",
        results_topic=None,
        name=topic_name,
        config=AnalyticsConfig(
            tumbling_s=60, sliding_s=120, slide_s=60, session_gap_s=60, watermark_s=120
        ),
        max_offsets_per_trigger=400,
    )
    progress = run.query.recentProgress
    assert run.rows() == len(events)
    dropped = sum(op["numRowsDroppedByWatermark"] for p in progress for op in p["stateOperators"])
    assert dropped == 0
