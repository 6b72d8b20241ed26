"""`tidemq pipeline generate-events` and `tidemq pipeline analytics`: user-behaviour
events -> windowed counts and sessions, in a results topic and in Parquet."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer

from tidemq.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    CliUsageError,
    check_bootstrap,
    client_config,
    command,
    info,
    say,
)
from tidemq.cli.pipeline_common import (
    Checkpoint,
    Master,
    MaxOffsets,
    Once,
    app,
    load,
    pipeline_client,
    require_topics,
    session,
    spark_failures,
)
from tidemq.cli.value_formats import DEFAULT_REGISTRY, Registry
from tidemq.spark.pipelines.streams import DEFAULT_MAX_OFFSETS_PER_TRIGGER

__all__ = ["analytics", "generate_events"]

_Seconds = typer.Option(min=1)


class EventFormat(enum.StrEnum):
    JSON = "json"
    AVRO = "avro"


EventFormatOpt = Annotated[
    EventFormat,
    typer.Option(
        "--value-format",
        case_sensitive=False,
        help="json (default), or avro: the events' schema in the schema registry "
        "(<topic>-value), Confluent's wire format.",
    ),
]


@command(app, "generate-events")
def generate_events(
    *,
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic to send the events to.")],
    count: Annotated[int, typer.Option("--count", "-n", min=0, help="How many events.")] = 10_000,
    users: Annotated[int, typer.Option("--users", min=1, help="Distinct users.")] = 1000,
    items: Annotated[int, typer.Option("--items", min=1, help="Distinct items.")] = 5000,
    seed: Annotated[int, typer.Option("--seed", help="Random seed (same seed, same events).")] = 0,
    start_ms: Annotated[
        int | None,
        typer.Option("--start-ms", help="Event time of the first session (default: now - 1 h)."),
    ] = None,
    queues: Annotated[
        int, typer.Option("--queues", min=1, help="Queues of the topic when it is created.")
    ] = 4,
    value_format: EventFormatOpt = EventFormat.JSON,
    registry: Registry = DEFAULT_REGISTRY,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Send generated user-behaviour events (user_id, item_id, behavior, ts) as JSON, or
    as Avro with --value-format avro."""
    import time  # noqa: PLC0415 - only here

    from tidemq.spark.pipelines import events  # noqa: PLC0415 - no pyspark needed

    address = check_bootstrap(bootstrap)
    start = int(time.time() * 1000) - 3_600_000 if start_ms is None else start_ms
    try:
        generated = events.generate_events(
            count, users=users, items=items, seed=seed, start_ms=start
        )
    except ValueError as exc:
        raise CliUsageError(str(exc)) from None
    serializer = None
    if value_format is EventFormat.AVRO:
        from tidemq.client.serde import AvroSerializer, SchemaRegistry  # noqa: PLC0415

        serializer = AvroSerializer(SchemaRegistry(registry), events.Event)
    sent = events.produce_events(
        address,
        topic,
        generated,
        queues=queues,
        value_serializer=serializer,
        client_config=client_config(),
    )
    say(f"sent {sent} event(s) to {topic}")


@command(app, "analytics")
def analytics(
    *,
    topic: Annotated[
        list[str],
        typer.Option("--topic", "-t", metavar="TOPIC", help="Topic of events (repeat for more)."),
    ],
    output: Annotated[
        Path,
        typer.Option("--output", metavar="DIR", help="Root directory of the Parquet files."),
    ],
    checkpoint: Checkpoint,
    results_topic: Annotated[
        str, typer.Option("--results-topic", help="Topic for the results ('' for none).")
    ] = "analytics-results",
    name: Annotated[
        str,
        typer.Option(
            "--name", help="Pipeline name: sink ids are <name>-<kind>-<checkpoint token>."
        ),
    ] = "analytics",
    tumbling: Annotated[int, typer.Option("--tumbling", min=1, help="Tumbling window, s.")] = 60,
    sliding: Annotated[int, typer.Option("--sliding", min=1, help="Sliding window, s.")] = 600,
    slide: Annotated[
        int, typer.Option("--slide", min=1, help="Slide of the sliding window, s.")
    ] = 60,
    session_gap: Annotated[int, typer.Option("--session-gap", min=1, help="Session gap, s.")] = 300,
    watermark: Annotated[
        int, typer.Option("--watermark", min=1, help="Watermark delay behind the latest event, s.")
    ] = 120,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    master: Master = "local[*]",
    once: Once = True,
    max_offsets_per_trigger: MaxOffsets = DEFAULT_MAX_OFFSETS_PER_TRIGGER,
    value_format: EventFormatOpt = EventFormat.JSON,
    registry: Registry = DEFAULT_REGISTRY,
) -> None:
    """Windowed counts per behavior and item, and sessions per user, exactly once."""
    address = check_bootstrap(bootstrap)
    if not topic:
        raise CliUsageError("give at least one --topic")
    pipeline = load("tidemq.spark.pipelines.analytics")
    try:
        config = pipeline.AnalyticsConfig(tumbling, sliding, slide, session_gap, watermark)
    except ValueError as exc:
        raise CliUsageError(str(exc)) from None
    require_topics(address, topic)
    with spark_failures("the analytics queries"):
        spark, created = session(master, "tidemq-analytics")
        try:
            run = pipeline.run_analytics(
                spark,
                bootstrap=address,
                topics=topic,
                output=output,
                checkpoint=checkpoint,
                results_topic=results_topic or None,
                name=name,
                config=config,
                trigger="available_now" if once else "continuous",
                max_offsets_per_trigger=max_offsets_per_trigger,
                value_format=value_format.value,
                schema_registry=registry if value_format is EventFormat.AVRO else None,
                client=pipeline_client(),
            )
            if not once:
                info(f"analytics over {', '.join(topic)} to {output}; Ctrl-C to stop")
                try:
                    run.await_termination()
                except KeyboardInterrupt:
                    run.stop()
            say(
                f"processed {run.rows()} event(s) ({run.rejected_rows()} rejected); "
                f"results in {output}" + (f" and topic {results_topic}" if results_topic else "")
            )
        except ValueError as exc:
            raise CliUsageError(str(exc)) from None
        finally:
            if created:
                spark.stop()
