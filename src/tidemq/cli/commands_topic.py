"""`tidemq topic create / list / describe / alter / remap / compact / delete`."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated

import typer

from tidemq.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    CliUsageError,
    Output,
    OutputOpt,
    check_bootstrap,
    client_config,
    command,
    emit_json,
    emit_table,
    is_internal,
    parse_pairs,
    say,
)
from tidemq.cli.static_view import show_chains, show_remap
from tidemq.cli.topic_file import read_topic_file
from tidemq.client.results import NewTopic, TopicInfo
from tidemq.client.sync import Admin

__all__ = ["app", "topic_name"]

app = typer.Typer(help="Create, list, describe, alter and delete topics.", no_args_is_help=True)


class TopicType(enum.StrEnum):
    MIXED = "mixed"
    NORMAL = "normal"
    FIFO = "fifo"
    DELAY = "delay"
    TRANSACTION = "transaction"


TopicArg = Annotated[
    str | None,
    typer.Argument(metavar="TOPIC", help="The topic (or give --topic).", show_default=False),
]
TopicOpt = Annotated[
    str | None,
    typer.Option(
        "--topic",
        "-t",
        metavar="TOPIC",
        help="The topic (instead of the argument).",
        show_default=False,
    ),
]
Configs = Annotated[
    list[str] | None,
    typer.Option(
        "--config",
        metavar="KEY=VALUE",
        help="Topic config by its Kafka name, e.g. retention.ms=3600000 (repeatable).",
        show_default=False,
    ),
]


def topic_name(argument: str | None, option: str | None) -> str:
    """TOPIC may be given as the argument or as --topic (Kafka's spelling), not both."""
    if argument and option and argument != option:
        raise CliUsageError(f"two topics given: {argument!r} and --topic {option!r}")
    name = argument or option
    if not name:
        raise CliUsageError("missing TOPIC (the argument or --topic)")
    return name


def _admin(bootstrap: str) -> Admin:
    return Admin(check_bootstrap(bootstrap), client_config=client_config())


def _config_text(config: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(config.items()))


def _show(topic: TopicInfo, output: Output) -> None:
    if output is Output.JSON:
        emit_json(topic)
        return
    compacted = any(q.compacted_end for q in topic.queue_info)
    emit_table(
        ["QUEUE", "MIN OFFSET", "MAX OFFSET", "MESSAGES", "BROKER"]
        + (["COMPACTED BELOW"] if compacted else []),
        (
            (q.queue, q.min_offset, q.max_offset, q.max_offset - q.min_offset, q.broker)
            + ((q.compacted_end,) if compacted else ())
            for q in topic.queue_info
        ),
        title=(
            f"Topic: {topic.name}  Queues: {topic.queues}  Type: {topic.message_type}  "
            f"Config: {_config_text(topic.config)}"
        ),
    )
    if topic.chains:
        show_chains(topic)


def _names(text: str | None, option: str) -> list[str] | None:
    if text is None:
        return None
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise CliUsageError(f"{option} needs at least one broker name")
    return names


@command(app)
def create(
    *,
    topic: TopicArg = None,
    topic_opt: TopicOpt = None,
    queues: Annotated[
        int, typer.Option("--queues", "--partitions", min=1, help="How many queues.")
    ] = 8,
    topic_type: Annotated[
        TopicType,
        typer.Option(
            "--type",
            case_sensitive=False,
            help="The message type; mixed takes every kind of message.",
        ),
    ] = TopicType.MIXED,
    config: Configs = None,
    if_not_exists: Annotated[
        bool,
        typer.Option(
            "--if-not-exists",
            help="No error if the topic exists (it is left as it is, even if it differs).",
        ),
    ] = False,
    static: Annotated[
        bool,
        typer.Option(
            "--static",
            help="A static topic: its queue count never changes and its queues move "
            "between brokers without moving data (tidemq topic remap).",
        ),
    ] = False,
    brokers: Annotated[
        str | None,
        typer.Option(
            "--brokers",
            metavar="B1,B2",
            help="With --static: the brokers (names) its queues start on; default all.",
            show_default=False,
        ),
    ] = None,
    from_file: Annotated[
        str | None,
        typer.Option(
            "--from-file",
            metavar="FILE",
            help="Create every topic FILE names, one 'NAME [QUEUES]' per line, in batches "
            "('-': standard input); --queues, --type and --config apply to each.",
            show_default=False,
        ),
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Create a topic, or many (--from-file)."""
    configs = parse_pairs(config or (), "--config")
    if from_file is not None:
        if topic or topic_opt or static:
            raise CliUsageError("--from-file names the topics; no TOPIC, --topic or --static")
        topics = read_topic_file(
            from_file, queues=queues, message_type=topic_type.value.upper(), config=configs
        )
        _create_many(topics, if_not_exists, bootstrap, output)
        return
    name = topic_name(topic, topic_opt)
    if brokers is not None and not static:
        raise CliUsageError("--brokers places a static topic's queues; add --static")
    with _admin(bootstrap) as admin:
        existed = False
        if if_not_exists:
            # Asked first only to say which happened; create_topic(exist_ok=True) is the
            # check that counts (the topic may be created in between).
            existed = name in {t.name for t in admin.list_topics()}
        created = admin.create_topic(
            name,
            queues,
            message_type=topic_type.value.upper(),
            config=configs,
            exist_ok=if_not_exists,
            static=static,
            brokers=_names(brokers, "--brokers"),
        )
    if output is Output.JSON:
        emit_json(created)
        return
    plural = "" if created.queues == 1 else "s"
    if existed:
        kind = created.message_type
        say(f"Topic {name!r} exists already ({created.queues} queue{plural}, {kind}).")
    else:
        kind = "static topic" if created.static else "topic"
        say(f"Created {kind} {name!r} with {created.queues} queue{plural}.")


def _create_many(topics: list[NewTopic], exist_ok: bool, bootstrap: str, output: Output) -> None:
    with _admin(bootstrap) as admin:
        created = admin.create_topics(topics, exist_ok=exist_ok)
    if output is Output.JSON:
        emit_json(created)
        return
    existed = len(topics) - len(created)
    note = f" ({existed} existed already)" if existed else ""
    say(f"Created {len(created)} topic(s){note}.")


@command(app, "list")
def list_(
    show_all: Annotated[
        bool,
        typer.Option("--all", "-a", help="Also list internal topics (%RETRY%..., %DLQ%..., ...)."),
    ] = False,
    prefix: Annotated[
        str, typer.Option("--prefix", help="Only topics whose names start with this.")
    ] = "",
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, help="At most this many topics (the first by name)."),
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """List topics by name; internal ones only with --all."""
    with _admin(bootstrap) as admin:
        keep = None if show_all else (lambda name: not is_internal(name))
        topics = admin.list_topics(prefix, limit=limit, keep=keep)
    if output is Output.JSON:
        emit_json(topics)
        return
    emit_table(
        ["TOPIC", "QUEUES", "TYPE", "CONFIG"],
        ((t.name, t.queues, t.message_type, _config_text(t.config)) for t in topics),
    )


@command(app)
def describe(
    *,
    topic: TopicArg = None,
    topic_opt: TopicOpt = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Show a topic's queues: offsets and the broker serving each."""
    name = topic_name(topic, topic_opt)
    with _admin(bootstrap) as admin:
        _show(admin.describe_topic(name), output)


@command(app)
def alter(
    *,
    topic: TopicArg = None,
    topic_opt: TopicOpt = None,
    queues: Annotated[
        int | None,
        typer.Option("--queues", "--partitions", min=1, help="New queue count (grow only)."),
    ] = None,
    config: Configs = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Change a topic's queue count or configs."""
    name = topic_name(topic, topic_opt)
    configs = parse_pairs(config or (), "--config")
    if queues is None and not configs:
        raise CliUsageError("nothing to alter: give --queues N and/or --config KEY=VALUE")
    with _admin(bootstrap) as admin:
        altered = admin.alter_topic(name, queues=queues, config=configs or None)
    if output is Output.JSON:
        emit_json(altered)
    else:
        say(f"Altered topic {name!r}: {altered.queues} queues, {_config_text(altered.config)}.")


@command(app)
def remap(
    *,
    topic: TopicArg = None,
    topic_opt: TopicOpt = None,
    brokers: Annotated[
        str | None,
        typer.Option(
            "--brokers",
            metavar="B1,B2",
            help="Spread the write ends over these brokers (as few queues move as possible).",
            show_default=False,
        ),
    ] = None,
    queue: Annotated[
        int | None,
        typer.Option(
            "--queue", min=0, help="Move one queue's write end (with --to).", show_default=False
        ),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option("--to", metavar="BROKER", help="Where --queue goes.", show_default=False),
    ] = None,
    repair: Annotated[
        bool,
        typer.Option("--repair", help="Finish the switches a failed remap left half-way."),
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Move a static topic's write ends to other brokers; no data moves."""
    name = topic_name(topic, topic_opt)
    given = sum(x for x in (brokers is not None, queue is not None, repair))
    if given != 1:
        raise CliUsageError("give one of --brokers B1,B2, --queue Q --to BROKER, or --repair")
    if (queue is None) != (to is None):
        raise CliUsageError("--queue and --to go together")
    with _admin(bootstrap) as admin:
        report = admin.remap_topic(
            name, brokers=_names(brokers, "--brokers"), queue=queue, to=to, repair=repair
        )
    if output is Output.JSON:
        emit_json(report)
    else:
        show_remap(report)


@command(app)
def compact(
    *,
    topic: TopicArg = None,
    topic_opt: TopicOpt = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Compact a compact topic's queues now (brokers also do it in the background)."""
    name = topic_name(topic, topic_opt)
    with _admin(bootstrap) as admin:
        reports = admin.compact(name)
    if output is Output.JSON:
        emit_json(reports)
        return
    emit_table(
        ["QUEUE", "MESSAGES IN", "MESSAGES KEPT", "BYTES IN", "BYTES KEPT", "COMPACTED BELOW"],
        [
            (r.queue, r.messages_in, r.messages_out, r.bytes_in, r.bytes_out, r.compacted_end)
            for r in reports
        ],
        title=f"Compacted topic {name!r}:",
    )


@command(app)
def delete(
    *,
    topic: TopicArg = None,
    topic_opt: TopicOpt = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Delete a topic and its messages."""
    name = topic_name(topic, topic_opt)
    with _admin(bootstrap) as admin:
        admin.delete_topic(name)
    if output is Output.JSON:
        emit_json({"deleted": name})
    else:
        say(f"Deleted topic {name!r}.")
