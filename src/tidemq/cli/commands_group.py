"""`tidemq group list / describe / reset-offsets`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

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
    emit_json,
    emit_table,
    is_internal,
    say,
)
from tidemq.client.sync import Admin

__all__ = ["app"]

app = typer.Typer(help="List, describe and reset consumer groups.", no_args_is_help=True)

GroupArg = Annotated[
    str, typer.Argument(metavar="GROUP", help="The consumer group.", show_default=False)
]


def _admin(bootstrap: str) -> Admin:
    return Admin(check_bootstrap(bootstrap), client_config=client_config())


def _assignment(queues: list[tuple[str, int]]) -> str:
    return ",".join(f"{t}/{q}" for t, q in sorted(queues))


@command(app, "list")
def list_(
    show_all: Annotated[
        bool,
        typer.Option(
            "--all", "-a", help="Also list internal groups (%REDRIVE%..., ...%BROADCAST%...)."
        ),
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """List consumer groups: active, with committed offsets, or consuming by pop (simple
    and push consumers); internal ones only with --all."""
    with _admin(bootstrap) as admin:
        groups = [g for g in admin.list_groups() if show_all or not is_internal(g)]
    if output is Output.JSON:
        emit_json(groups)
    else:
        emit_table(["GROUP"], ([g] for g in groups))


@command(app)
def describe(
    *,
    group: GroupArg,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Show a group's members, committed offsets and lag."""
    with _admin(bootstrap) as admin:
        if group not in admin.list_groups():
            raise CliError(f"consumer group {group!r} does not exist")
        described = admin.describe_group(group)
    if output is Output.JSON:
        emit_json(described)
        return
    emit_table(
        ["TOPIC", "QUEUE", "COMMITTED", "MAX OFFSET", "LAG"],
        (
            (o.topic, o.queue, "-" if o.committed < 0 else o.committed, o.max_offset, o.lag)
            for o in described.offsets
        ),
        title=f"Group: {described.group}  Generation: {described.generation}  "
        f"Members: {len(described.members)}",
    )
    if described.members:
        emit_table(
            ["MEMBER", "CLIENT", "ASSIGNMENT"],
            (
                (m.member_id, m.client_id, _assignment([(t, q) for t, q in m.assignment]))
                for m in described.members
            ),
        )


def _target(
    to_earliest: bool,
    to_latest: bool,
    to_datetime: str | None,
    to_offset: int | None,
    shift_by: int | None,
) -> tuple[str, int]:
    chosen: list[tuple[str, int]] = []
    if to_earliest:
        chosen.append(("earliest", 0))
    if to_latest:
        chosen.append(("latest", 0))
    if to_datetime is not None:
        try:
            when = datetime.fromisoformat(to_datetime)
        except ValueError:
            raise CliUsageError(
                f"--to-datetime {to_datetime!r}: use ISO 8601, e.g. 2025-01-31T12:00:00Z"
            ) from None
        # Without a zone the time is local, as Kafka's tools read it.
        chosen.append(("timestamp", int(when.astimezone().timestamp() * 1000)))
    if to_offset is not None:
        chosen.append(("offset", to_offset))
    if shift_by is not None:
        chosen.append(("shift", shift_by))
    if len(chosen) != 1:
        raise CliUsageError(
            "give exactly one of --to-earliest, --to-latest, --to-datetime, --to-offset, --shift-by"
        )
    return chosen[0]


@command(app, "reset-offsets")
def reset_offsets(
    *,
    group: GroupArg,
    topic: Annotated[
        str,
        typer.Option("--topic", "-t", metavar="TOPIC", help="The topic whose offsets to reset."),
    ],
    to_earliest: Annotated[
        bool, typer.Option("--to-earliest", help="The oldest message each queue retains.")
    ] = False,
    to_latest: Annotated[
        bool, typer.Option("--to-latest", help="The end of each queue (skip everything).")
    ] = False,
    to_datetime: Annotated[
        str | None,
        typer.Option(
            "--to-datetime",
            metavar="ISO",
            help="First message at or after this time (no zone: local time).",
            show_default=False,
        ),
    ] = None,
    to_offset: Annotated[
        int | None,
        typer.Option(
            "--to-offset",
            min=0,
            metavar="N",
            help="This offset in every queue (clamped to what it retains).",
            show_default=False,
        ),
    ] = None,
    shift_by: Annotated[
        int | None,
        typer.Option(
            "--shift-by", metavar="N", help="Move by N (negative: back).", show_default=False
        ),
    ] = None,
    execute: Annotated[
        bool,
        typer.Option("--execute/--dry-run", help="Apply the plan (default: only print it)."),
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Plan (by default) or apply new committed offsets for every queue of a topic.
    Targets are clamped to each queue's retained range; refused while the group has
    active members."""
    to, value = _target(to_earliest, to_latest, to_datetime, to_offset, shift_by)
    with _admin(bootstrap) as admin:
        current = {
            (o.topic, o.queue): o.committed
            for o in admin.describe_group(group).offsets
            if o.topic == topic
        }
        plan = admin.reset_offsets(group, topic, to=to, value=value, execute=execute)
    rows = [(p.topic, p.queue, current.get((p.topic, p.queue), -1), p.offset) for p in plan]
    if output is Output.JSON:
        emit_json(
            {
                "group": group,
                "executed": execute,
                "offsets": [
                    {"topic": t, "queue": q, "current": c, "new": n} for t, q, c, n in rows
                ],
            }
        )
        return
    emit_table(
        ["TOPIC", "QUEUE", "CURRENT", "NEW"],
        ((t, q, "-" if c < 0 else c, n) for t, q, c, n in rows),
        title=f"Group: {group}",
    )
    if execute:
        say(f"Offsets of group {group!r} on {topic!r} reset.")
    else:
        say("Dry run: nothing changed. Add --execute to apply.")
