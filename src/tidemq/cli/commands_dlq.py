"""`tidemq dlq list|redrive GROUP`: the dead letters of a consumer group (messages it gave
up on after its attempts, in `%DLQ%<group>`), and sending them back to their topics."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tidemq.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    Output,
    OutputOpt,
    check_bootstrap,
    client_config,
    command,
    emit_json,
    emit_table,
    say,
)
from tidemq.client.admin import DLQ_HEADER_PREFIX, dlq_topic
from tidemq.client.sync import Admin
from tidemq.core.message import Message

__all__ = ["app"]

app = typer.Typer(help="Dead letters of consumer groups: list and redrive.", no_args_is_help=True)

GroupArg = Annotated[
    str, typer.Argument(metavar="GROUP", show_default=False, help="The consumer group.")
]
#: Longest value shown in a table cell (JSON output has it whole).
_VALUE_CHARS = 60


def _admin(bootstrap: str) -> Admin:
    return Admin(check_bootstrap(bootstrap), client_config=client_config())


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


def _dlq(m: Message, name: str) -> str:
    return m.headers.get(DLQ_HEADER_PREFIX + name, b"").decode("utf-8", errors="replace")


def _record(m: Message, redriven: bool) -> dict[str, Any]:
    origin_queue = _dlq(m, "queue")
    origin_offset = _dlq(m, "offset")
    record: dict[str, Any] = {
        "offset": m.offset,
        "message_id": m.message_id,
        "origin_topic": _dlq(m, "topic"),
        "origin_queue": int(origin_queue) if origin_queue.isdigit() else None,
        "origin_offset": int(origin_offset) if origin_offset.isdigit() else None,
        "origin_message_id": _dlq(m, "message_id"),
        "attempts": int(a) if (a := _dlq(m, "attempts")).isdigit() else None,
        "error": _dlq(m, "error"),
        "redriven": redriven,
        "timestamp_ms": m.timestamp_ms,
        "key": _text(m.key),
        "value": _text(m.value),
    }
    if m.tag is not None:
        record["tag"] = m.tag
    if m.keys:
        record["keys"] = list(m.keys)
    headers = {k: _text(v) for k, v in m.headers.items() if not k.startswith(DLQ_HEADER_PREFIX)}
    if headers:
        record["headers"] = headers
    return record


def _short(text: str | None) -> str:
    if text is None:
        return "null"
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 3] + "..."


@command(app, "list")
def list_(
    group: GroupArg,
    limit: Annotated[
        int, typer.Option("--limit", min=1, help="Show at most this many, oldest first.")
    ] = 100,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """List a group's dead letters: origin, attempts, last error, and whether redriven."""
    with _admin(bootstrap) as admin:
        letters = admin.dead_letters(group, limit=limit)
        position = admin.redrive_position(group) if letters else 0
    records = [_record(m, m.offset < position) for m in letters]
    if output is Output.JSON:
        emit_json(records)
        return
    emit_table(
        ["OFFSET", "ORIGIN", "MESSAGE ID", "ATTEMPTS", "ERROR", "REDRIVEN", "VALUE"],
        (
            (
                r["offset"],
                f"{r['origin_topic']}/{r['origin_queue']}@{r['origin_offset']}",
                r["origin_message_id"],
                r["attempts"],
                r["error"],
                "yes" if r["redriven"] else "no",
                _short(r["value"]),
            )
            for r in records
        ),
        title=f"{dlq_topic(group)}: {len(records)} dead letter(s) shown",
    )


@command(app, "redrive")
def redrive(
    group: GroupArg,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, help="Send back at most this many (default: all)."),
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Send a group's dead letters back to their origin topics, each once.

    The redrive position is kept on the broker: a second redrive sends only the dead
    letters that arrived since."""
    with _admin(bootstrap) as admin:
        sent = admin.redrive(group, limit=limit)
        position = admin.redrive_position(group)
    if output is Output.JSON:
        emit_json({"group": group, "redriven": sent, "position": position})
        return
    say(f"redrove {sent} dead letter(s) of group {group!r} (position {position})")
