"""`tidemq message get`: one message by id, or by topic, queue and offset or time;
`tidemq message query`: a topic's messages by key."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

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
    emit_table,
)
from tidemq.client.key_query import DEFAULT_QUERY_LIMIT
from tidemq.client.sync import Admin
from tidemq.core import limits
from tidemq.core.errors import UnknownMessage
from tidemq.core.message import Message

__all__ = ["app"]

app = typer.Typer(help="Find messages: by id, offset, time or key.", no_args_is_help=True)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


def _record(m: Message) -> dict[str, Any]:
    return {
        "id": m.message_id,
        "topic": m.topic,
        "queue": m.queue,
        "offset": m.offset,
        "timestamp_ms": m.timestamp_ms,
        "key": _text(m.key),
        "tag": m.tag,
        "keys": list(m.keys),
        "headers": {k: _text(v) for k, v in m.headers.items()},
        "value": _text(m.value),
    }


def _when(text: str, option: str = "--at") -> float:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise CliUsageError(
            f"{option} {text!r} is not an ISO time (e.g. 2026-11-25T10:00:00+00:00)"
        ) from None
    if moment.tzinfo is None:
        raise CliUsageError(f"{option} {text!r} needs a time zone (e.g. +00:00 or Z)")
    return moment.timestamp()


@command(app)
def get(
    message_id: Annotated[
        str | None,
        typer.Argument(metavar="[ID]", help="A message id (28 hex digits).", show_default=False),
    ] = None,
    *,
    topic: Annotated[
        str | None, typer.Option("--topic", "-t", help="With --queue and --offset or --at.")
    ] = None,
    queue: Annotated[
        int | None, typer.Option("--queue", min=0, help="The queue (with --topic).")
    ] = None,
    offset: Annotated[
        int | None, typer.Option("--offset", min=0, help="The message's offset in the queue.")
    ] = None,
    at: Annotated[
        str | None,
        typer.Option("--at", metavar="TIME", help="First message at or after this ISO time."),
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Show one message: `get ID`, or `get --topic T --queue Q --offset O` (or `--at`)."""
    by_place = topic is not None or queue is not None or offset is not None or at is not None
    if (message_id is None) == (not by_place):
        raise CliUsageError("give an ID, or --topic, --queue and --offset (or --at)")
    with Admin(check_bootstrap(bootstrap), client_config=client_config()) as admin:
        if message_id is not None:
            found = admin.get_message(message_id)
            what = f"message {message_id}"
        else:
            if topic is None or queue is None or (offset is None) == (at is None):
                raise CliUsageError("--topic and --queue go with one of --offset or --at")
            when = None if at is None else _when(at)
            found = admin.message_at(topic, queue, offset=offset, at=when)
            what = f"{topic}/{queue} " + (f"offset {offset}" if at is None else f"at {at}")
    if found is None:
        raise UnknownMessage(f"{what}: no message is stored there (now)")
    record = _record(found)
    if output is Output.JSON:
        typer.echo(json.dumps(record, ensure_ascii=False))
        return
    emit_table(["FIELD", "VALUE"], ((k, v) for k, v in record.items()), title=what)


@command(app)
def query(
    topic: Annotated[str, typer.Argument(help="The topic to search.", show_default=False)],
    *,
    key: Annotated[
        str, typer.Option("--key", "-k", help="A message key (its key or one of its keys).")
    ],
    since: Annotated[
        str | None,
        typer.Option("--from", metavar="TIME", help="Stored at or after this ISO time."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--to", metavar="TIME", help="Stored at or before this ISO time."),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            "--limit", min=1, max=limits.MAX_KEY_QUERY_MESSAGES, help="At most this many."
        ),
    ] = DEFAULT_QUERY_LIMIT,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Messages of TOPIC with key K, newest first (`-o json`: one JSON object a line)."""
    start = None if since is None else _when(since, "--from")
    end = None if until is None else _when(until, "--to")
    with Admin(check_bootstrap(bootstrap), client_config=client_config()) as admin:
        found = admin.query_messages(topic, key, start=start, end=end, limit=limit)
    records = [_record(m) for m in found]
    if output is Output.JSON:
        for record in records:
            typer.echo(json.dumps(record, ensure_ascii=False))
        return
    columns = ["id", "queue", "offset", "timestamp_ms", "key", "keys", "value"]
    emit_table(
        [c.upper() for c in columns],
        ([r[c] for c in columns] for r in records),
        title=f"{topic}: {len(records)} message(s) with key {key!r}",
    )
