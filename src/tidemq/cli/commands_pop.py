"""`tidemq pop status|resume GROUP`: the pop consumption of a consumer group (what it has
acknowledged, what is in flight or dead-lettered), and the messages it suspended after
their last attempt (`on_exhausted="suspend"`), which an operator resumes."""

from __future__ import annotations

from typing import Annotated

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
from tidemq.client.sync import Admin

__all__ = ["app"]

app = typer.Typer(
    help="Pop consumption of consumer groups: status, suspended messages.",
    no_args_is_help=True,
)

GroupArg = Annotated[
    str, typer.Argument(metavar="GROUP", show_default=False, help="The consumer group.")
]


def _admin(bootstrap: str) -> Admin:
    return Admin(check_bootstrap(bootstrap), client_config=client_config())


@command(app, "status")
def status(
    group: GroupArg, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, output: OutputOpt = Output.TABLE
) -> None:
    """Per queue: acknowledged below, next offset, in flight, retried, dead-lettered,
    suspended."""
    with _admin(bootstrap) as admin:
        queues = admin.pop_status(group)
    if output is Output.JSON:
        emit_json(queues)  # every field, empty ones too
        return
    emit_table(
        [
            "TOPIC",
            "QUEUE",
            "ACKED BELOW",
            "NEXT",
            "IN FLIGHT",
            "RETRIED",
            "DEAD-LETTERED",
            "SUSPENDED",
        ],
        (
            (
                q.topic,
                q.queue,
                q.acked_below,
                q.next_offset,
                q.in_flight,
                q.retried,
                q.dead_lettered,
                len(q.suspended),
            )
            for q in queues
        ),
        title=f"group {group!r}: {len(queues)} queue(s)",
    )
    suspended = [(q, s) for q in queues for s in q.suspended]
    if suspended:
        emit_table(
            ["MESSAGE ID", "TOPIC", "QUEUE", "OFFSET", "ATTEMPTS", "LAST ERROR"],
            (
                (s.message_id, q.topic, q.queue, s.offset, s.attempts, s.error or "(lease ran out)")
                for q, s in suspended
            ),
            title=f"{len(suspended)} suspended message(s): tidemq pop resume {group} ID",
        )


@command(app, "resume")
def resume(
    group: GroupArg,
    message_id: Annotated[
        str, typer.Argument(metavar="MESSAGE_ID", help="A suspended message (pop status).")
    ],
    dead_letter: Annotated[
        bool,
        typer.Option(
            "--dead-letter/--retry",
            help="Move it to the dead-letter topic now, or deliver it again (the default).",
        ),
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Resume a suspended message: retry it, or dead-letter it (its FIFO group goes on)."""
    with _admin(bootstrap) as admin:
        done = admin.resume(group, message_id, action="dead-letter" if dead_letter else "retry")
    if output is Output.JSON:
        emit_json(done)
        return
    what = "moved to the dead-letter topic" if dead_letter else "will be delivered again"
    say(f"{message_id} ({done.topic}/{done.queue}@{done.offset}) {what}")
