"""`tidemq produce` (stdin lines to messages) and `tidemq consume` (messages to stdout)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any

import typer

from tidemq.cli.commands_topic import TopicArg, TopicOpt, topic_name
from tidemq.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    CliError,
    CliUsageError,
    Output,
    OutputOpt,
    check_bootstrap,
    client_config,
    command,
    info,
)
from tidemq.cli.produce_lines import LineFormatError, ProduceFailed, Stats, read_lines, send_lines
from tidemq.cli.value_formats import (
    DEFAULT_REGISTRY,
    Registry,
    ValueFormat,
    ValueFormatOpt,
    ValueSchemaOpt,
    decoder,
    encoder,
)
from tidemq.client.sync import Admin, GroupConsumer, Producer, StreamConsumer
from tidemq.cluster.route import queue_for_key
from tidemq.core.errors import TopicNotFound
from tidemq.core.message import Message, Receipt

__all__ = ["consume", "produce", "register"]

#: Longest single poll, so --timeout-ms and Ctrl+C are noticed promptly.
_POLL_MS = 1_000


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


def _shown(data: bytes | None) -> str:
    """Text output: `null` for no key or value, as Kafka's console consumer prints."""
    return "null" if data is None else data.decode("utf-8", errors="replace")


# ------------------------------------------------------------------ produce


def produce(
    *,
    topic: TopicArg = None,
    topic_opt: TopicOpt = None,
    key_separator: Annotated[
        str | None,
        typer.Option(
            "--key-separator",
            metavar="SEP",
            help="Split each line at the first SEP into key and value.",
            show_default=False,
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key", "-k", metavar="KEY", help="One key for every message.", show_default=False
        ),
    ] = None,
    tag: Annotated[
        str | None,
        typer.Option("--tag", metavar="TAG", help="Tag every message.", show_default=False),
    ] = None,
    queue: Annotated[
        int | None,
        typer.Option(
            "--queue", "--partition", min=0, help="Send to this queue.", show_default=False
        ),
    ] = None,
    batch: Annotated[
        bool,
        typer.Option(
            "--batch/--no-batch",
            help="Keep many sends on their way (the default); --no-batch waits for each "
            "receipt before the next send.",
        ),
    ] = True,
    print_receipts: Annotated[
        bool,
        typer.Option("--print-receipts", help="Print each message's queue, offset and id."),
    ] = False,
    value_format: ValueFormatOpt = ValueFormat.RAW,
    value_schema: ValueSchemaOpt = None,
    registry: Registry = DEFAULT_REGISTRY,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Send each line of stdin as a message; print a summary on stderr. With
    --value-format avro or json, each value is a JSON document, sent in Confluent's wire
    format with its schema registered (docs/guide/schema-registry.md)."""
    name = topic_name(topic, topic_opt)
    if key_separator == "":
        raise CliUsageError("--key-separator must not be empty")
    if key is not None and key_separator is not None:
        raise CliUsageError("give --key or --key-separator, not both")

    def receipts(done: Sequence[Receipt]) -> None:
        _emit_receipts(done, output)

    address = check_bootstrap(bootstrap)
    encode = encoder(value_format, name, value_schema, registry)
    queue_of = _key_hashing(address, name) if key_separator and batch and queue is None else None
    with (
        Producer(address, client_config=client_config(), linger_ms=5 if batch else 0) as producer,
        _progress() as progress,
    ):
        try:
            stats = send_lines(
                producer,
                name,
                read_lines(sys.stdin.buffer),
                key=key.encode() if key is not None else None,
                separator=key_separator.encode() if key_separator is not None else None,
                tag=tag,
                queue=queue,
                queue_of=queue_of,
                encode=encode,
                one_by_one=not batch,
                window=None if batch else 0,
                on_receipts=receipts if print_receipts else None,
                on_progress=progress,
            )
        except LineFormatError as exc:
            raise CliUsageError(str(exc)) from None
        except ProduceFailed as exc:
            s = exc.stats
            raise CliError(
                f"{exc}; {s.acknowledged} of {s.sent} message(s) sent were acknowledged"
            ) from None
    info(stats.summary())


def _key_hashing(address: str, topic: str) -> Callable[[bytes], int] | None:
    """The queue each key maps to, as the producer maps it (`queue_for_key` over the
    topic's queue count), so that keyed lines can go as one batch per queue; None when
    the topic is not found (the sends then fail, and say how many were acknowledged)."""
    with Admin(address, client_config=client_config()) as admin:
        try:
            count = admin.describe_topic(topic).queues
        except TopicNotFound:
            return None
    # Keys repeat: a cache saves hashing each again (the producer's hot path, per line).
    return functools.lru_cache(maxsize=1 << 16)(functools.partial(_queue_for_key, count))


def _queue_for_key(count: int, key: bytes) -> int:
    return queue_for_key(key, count)


def _emit_receipts(receipts: Sequence[Receipt], output: Output) -> None:
    if output is Output.JSON:
        lines = [
            json.dumps(
                {"topic": r.topic, "queue": r.queue, "offset": r.offset, "message_id": r.message_id}
            )
            for r in receipts
        ]
    else:
        lines = [f"{r.queue}\t{r.offset}\t{r.message_id}" for r in receipts]
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()


@contextlib.contextmanager
def _progress() -> Iterator[Callable[[Stats], None] | None]:
    """A live count on stderr when it is a terminal; None (no progress) otherwise."""
    if not sys.stderr.isatty():
        yield None
        return
    # Only on a terminal: not worth its import time for every other command.
    from rich.console import Console  # noqa: PLC0415
    from rich.progress import (  # noqa: PLC0415
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    )
    task = bar.add_task("sending", total=None)

    def update(stats: Stats) -> None:
        bar.update(
            task,
            completed=stats.acknowledged,
            description=f"{stats.acknowledged:,} acknowledged of {stats.sent:,} sent "
            f"({stats.rate:,.0f} msg/s)",
        )

    with bar:
        yield update


# ------------------------------------------------------------------ consume


def _line(message: Message, *, print_key: bool, print_offset: bool, output: Output) -> str:
    if output is Output.JSON:
        record: dict[str, Any] = {
            "topic": message.topic,
            "queue": message.queue,
            "offset": message.offset,
            "timestamp_ms": message.timestamp_ms,
            "key": _text(message.key),
            "value": _text(message.value),
        }
        if message.tag is not None:
            record["tag"] = message.tag
        if message.keys:
            record["keys"] = list(message.keys)
        if message.headers:
            record["headers"] = {k: _text(v) for k, v in message.headers.items()}
        return json.dumps(record, ensure_ascii=False)
    fields = []
    if print_offset:
        fields += [f"Queue:{message.queue}", f"Offset:{message.offset}"]
    if print_key:
        fields.append(_shown(message.key))
    fields.append(_shown(message.value))
    return "\t".join(fields)


def _drain(
    consumer: GroupConsumer | StreamConsumer,
    *,
    max_messages: int | None,
    timeout_ms: int | None,
    render: Callable[[Message], str],
) -> int:
    """Print messages until `max_messages`, `timeout_ms` idle, or Ctrl+C; return how many.
    A group consumer commits exactly what was printed."""
    count = 0
    idle_since = time.monotonic()
    try:
        while max_messages is None or count < max_messages:
            wait_ms = _POLL_MS
            if timeout_ms is not None:
                left_ms = timeout_ms - (time.monotonic() - idle_since) * 1000
                if left_ms <= 0:
                    break
                wait_ms = max(1, min(_POLL_MS, int(left_ms)))
            messages = consumer.poll(wait_ms)
            if not messages:
                continue
            if max_messages is not None:
                messages = messages[: max_messages - count]
            sys.stdout.write("".join(render(m) + "\n" for m in messages))
            sys.stdout.flush()
            count += len(messages)
            if isinstance(consumer, GroupConsumer):
                # Only what was printed: a message cut off by --max-messages stays unread.
                consumer.commit({(m.topic, m.queue): m.offset + 1 for m in messages})
            idle_since = time.monotonic()
    except KeyboardInterrupt:
        pass
    return count


def consume(
    *,
    topic: TopicArg = None,
    topic_opt: TopicOpt = None,
    from_beginning: Annotated[
        bool,
        typer.Option(
            "--from-beginning",
            help="Start at the earliest message (with --group: for queues never committed).",
        ),
    ] = False,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            "-g",
            help="Consume as a member of this group; commits offsets.",
            show_default=False,
        ),
    ] = None,
    max_messages: Annotated[
        int | None,
        typer.Option("--max-messages", min=1, help="Exit after this many.", show_default=False),
    ] = None,
    timeout_ms: Annotated[
        int | None,
        typer.Option(
            "--timeout-ms",
            min=1,
            help="Exit after this long without a message.",
            show_default="run until interrupted",
        ),
    ] = None,
    print_key: Annotated[
        bool, typer.Option("--print-key", help="Print the key before the value.")
    ] = False,
    print_offset: Annotated[
        bool, typer.Option("--print-offset", help="Print the queue and offset first.")
    ] = False,
    queue: Annotated[
        int | None,
        typer.Option(
            "--queue",
            "--partition",
            min=0,
            help="Read only this queue (not with --group).",
            show_default=False,
        ),
    ] = None,
    value_format: ValueFormatOpt = ValueFormat.RAW,
    registry: Registry = DEFAULT_REGISTRY,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Print messages, one per line (values as UTF-8; with --value-format avro or json,
    decoded to JSON through the schema registry)."""
    name = topic_name(topic, topic_opt)
    if group is not None and queue is not None:
        raise CliUsageError("--queue reads one queue directly; it cannot be used with --group")
    address = check_bootstrap(bootstrap)
    with Admin(address, client_config=client_config()) as admin:
        described = admin.describe_topic(name)
    queues = [q.queue for q in described.queue_info] or list(range(described.queues))
    if queue is not None:
        if queue not in queues:
            raise CliUsageError(f"topic {name!r} has queues 0..{described.queues - 1}, not {queue}")
        queues = [queue]
    start = "earliest" if from_beginning else "latest"
    decode = decoder(value_format, registry)
    consumer: GroupConsumer | StreamConsumer
    if group is not None:
        consumer = GroupConsumer(
            address, group, [name], start=start, auto_commit=False, client_config=client_config()
        )
    else:
        consumer = StreamConsumer(address, start=start, client_config=client_config())
        consumer.assign((name, q) for q in queues)
    count = 0
    try:
        count = _drain(
            consumer,
            max_messages=max_messages,
            timeout_ms=timeout_ms,
            render=lambda m: _line(
                dataclasses.replace(m, value=decode(m.value)),
                print_key=print_key,
                print_offset=print_offset,
                output=output,
            ),
        )
    finally:
        consumer.close()
    info(f"Processed a total of {count} messages")


def register(app: typer.Typer) -> None:
    command(app)(produce)
    command(app)(consume)
