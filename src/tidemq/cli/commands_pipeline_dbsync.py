"""`tidemq pipeline generate-changes` (change events of an order store, no Spark needed)
and `tidemq pipeline db-sync` (those events -> a sharded database, on Spark local mode by
default, `--master local[*]`, or on a cluster with `--master`)."""

from __future__ import annotations

from typing import Annotated

import typer

from tidemq.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    CliError,
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
    run_query,
    session,
    spark_failures,
)
from tidemq.client.sync import Admin
from tidemq.core.errors import TopicNotFound
from tidemq.core.limits import MAX_QUEUES_PER_TOPIC
from tidemq.spark.pipelines.streams import DEFAULT_MAX_OFFSETS_PER_TRIGGER

__all__ = ["db_sync", "generate_changes"]


def _ensure_topic(address: str, topic: str, queues: int) -> None:
    """Create `topic` with `queues` queues unless it exists (then it is used as it is)."""
    with Admin(address, client_config=client_config()) as admin:
        try:
            found = admin.describe_topic(topic)
        except TopicNotFound:
            admin.create_topic(topic, queues)
            info(f"created topic {topic!r} with {queues} queue(s)")
            return
    if found.queues != queues:
        info(f"topic {topic!r} exists with {found.queues} queue(s); using it as it is")


@command(app, "generate-changes")
def generate_changes(
    *,
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic to send the events to.")],
    orders: Annotated[int, typer.Option("--orders", min=0, help="Orders whose life to generate.")],
    seed: Annotated[int, typer.Option("--seed", help="Same seed, same events.")] = 0,
    first_order_id: Annotated[
        int,
        typer.Option("--first-order-id", min=0, help="First order id (to add new orders)."),
    ] = 1,
    queues: Annotated[
        int | None,
        typer.Option(
            "--queues",
            min=1,
            max=MAX_QUEUES_PER_TOPIC,
            help="Create the topic with this many queues when it does not exist.",
        ),
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Send generated change events of orders (insert/update/delete), keyed by order_id."""
    address = check_bootstrap(bootstrap)
    changes = load("tidemq.spark.pipelines.changes")
    try:
        events = changes.generate_changes(orders, seed=seed, first_order_id=first_order_id)
    except ValueError as exc:
        raise CliUsageError(str(exc)) from None
    if queues is not None:
        _ensure_topic(address, topic, queues)
    sent = changes.produce_changes(address, topic, events, client_config=client_config())
    say(f"sent {sent} change event(s) of {orders} order(s) to {topic}")


@command(app, "db-sync")
def db_sync(
    *,
    topic: Annotated[
        list[str],
        typer.Option("--topic", "-t", metavar="TOPIC", help="Topic of change events (repeatable)."),
    ],
    target: Annotated[
        str,
        typer.Option(
            "--target",
            help="SQLAlchemy URL of the target; {shard} is replaced by the shard number, "
            "e.g. sqlite:////data/shard_{shard}.db.",
        ),
    ],
    checkpoint: Checkpoint,
    shards: Annotated[
        int, typer.Option("--shards", min=1, help="Target shards: seller_id % shards.")
    ] = 1,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    master: Master = "local[*]",
    once: Once = True,
    max_offsets_per_trigger: MaxOffsets = DEFAULT_MAX_OFFSETS_PER_TRIGGER,
) -> None:
    """Replay change events into a database sharded by seller, idempotently."""
    address = check_bootstrap(bootstrap)
    if not topic:
        raise CliUsageError("give at least one --topic")
    pipeline = load("tidemq.spark.pipelines.db_sync")
    shown = pipeline.describe_target(target)
    try:
        pipeline.shard_urls(target, shards)  # a bad template fails before Spark starts
    except ValueError as exc:
        raise CliUsageError(str(exc)) from None
    require_topics(address, topic)
    with spark_failures("the db-sync query"):
        spark, created = session(master, "tidemq-db-sync")
        progress = load("tidemq.spark.pipelines.progress").ProgressTotals(spark)
        try:
            query = pipeline.run_db_sync(
                spark,
                bootstrap=address,
                topics=topic,
                target=target,
                shards=shards,
                checkpoint=checkpoint,
                trigger="available_now" if once else "continuous",
                max_offsets_per_trigger=max_offsets_per_trigger,
                client=pipeline_client(),
            )
            rows, batches = run_query(
                query, progress, once=once, running=f"syncing {', '.join(topic)} to {shown}"
            )
            say(
                f"synced {rows} change event(s) in {batches} micro-batch(es) "
                f"to {shards} shard(s) of {shown}"
            )
        except ValueError as exc:  # the source's OptionError, a bad argument
            raise CliUsageError(str(exc)) from None
        except pipeline.TargetError as exc:
            raise CliError(f"the target cannot be used: {exc}") from None
        finally:
            progress.close()
            if created:
                spark.stop()
