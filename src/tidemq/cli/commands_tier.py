"""`tidemq tier status|files`: what tiered storage holds, how its uploads go, and where a
topic's offloaded files are (to read them with pyarrow, DuckDB or Spark)."""

from __future__ import annotations

from datetime import UTC, datetime
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
)
from tidemq.client.sync import Admin

__all__ = ["app"]

app = typer.Typer(help="Tiered storage: offloaded data in the object store.", no_args_is_help=True)

_MIB = 1024 * 1024


def _when(ms: int) -> str:
    if not ms:
        return ""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds")


def _mib(size: int) -> str:
    return f"{size / _MIB:.1f}"


@command(app, "status")
def tier_status(
    topic: Annotated[str, typer.Option("--topic", help="Only this topic.")] = "",
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Per offloaded queue: its remote and local offsets, files, bytes waiting for upload,
    and the last error; per broker: uploads, deletes and read counters."""
    with Admin(check_bootstrap(bootstrap), client_config=client_config()) as admin:
        brokers = admin.tier_status(topic)
    if output is Output.JSON:
        emit_json(brokers)
        return
    rows = []
    for b in brokers:
        for q in b.queues:
            lost = f"lost {q.lost_from}..{q.lost_to}; " if q.lost_to > q.lost_from else ""
            retry = f" (retry in {q.retry_in_ms / 1000:.0f} s)" if q.error else ""
            rows.append(
                (
                    b.broker, q.topic, q.queue, f"{q.log_start}..{q.remote_end}",
                    f"{q.local_min}..{q.next_offset}", q.files, _mib(q.remote_bytes),
                    _mib(q.pending_bytes), _when(q.last_upload_ms), lost + q.error + retry,
                )
            )  # fmt: skip
    emit_table(
        [
            "BROKER", "TOPIC", "QUEUE", "REMOTE", "LOCAL", "FILES", "REMOTE MiB",
            "PENDING MiB", "LAST UPLOAD (UTC)", "ERROR",
        ],
        rows,
    )  # fmt: skip
    for b in brokers:
        if not b.enabled:
            typer.echo(f"{b.broker}: tiered storage off (no tiered.url)")
            continue
        typer.echo(
            f"{b.broker}: {b.url}: uploaded {b.uploaded_files} files ({_mib(b.uploaded_bytes)} "
            f"MiB), deleted {b.deleted_files}, orphans removed {b.orphans_deleted}, "
            f"{b.errors} errors, {b.remote_reads} remote reads, cache {_mib(b.cache_bytes)} MiB"
        )


@command(app, "files")
def tier_files(
    topic: Annotated[str, typer.Argument(help="The topic.")],
    *,
    queue: Annotated[int | None, typer.Option("--queue", help="Only this queue.")] = None,
    start: Annotated[int, typer.Option("--from", help="Files with offsets from this.")] = 0,
    end: Annotated[
        int | None, typer.Option("--to", help="...and below this (default: no bound).")
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """The Parquet files holding a topic's offloaded offsets [--from, --to), by queue."""
    with Admin(check_bootstrap(bootstrap), client_config=client_config()) as admin:
        files = admin.tier_files(topic, queue=queue, start=start, end=end)
    if output is Output.JSON:
        emit_json(files)
        return
    emit_table(
        ["QUEUE", "OFFSETS", "MESSAGES", "MiB", "STORED (UTC)", "URL"],
        (
            (f.queue, f"{f.start}..{f.end}", f.messages, _mib(f.size),
             f"{_when(f.min_store_time_ms)} .. {_when(f.max_store_time_ms)}", f.url)
            for f in files
        ),
    )  # fmt: skip


@command(app, "offload")
def tier_offload(
    topic: Annotated[str, typer.Argument(help="A topic with remote.storage.enable=true.")],
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Upload every durable message of a topic to the object store now, whatever the file
    size and age thresholds (before maintenance); local copies then go by
    local.retention.*."""
    with Admin(check_bootstrap(bootstrap), client_config=client_config()) as admin:
        brokers = admin.tier_offload(topic)
    if output is Output.JSON:
        emit_json(brokers)
        return
    for b in brokers:
        for q in b.queues:
            typer.echo(
                f"{b.broker} {q.topic}/{q.queue}: offsets {q.log_start}..{q.remote_end} in "
                f"{q.files} files ({_mib(q.remote_bytes)} MiB), {q.local_min}..{q.next_offset} "
                "on disk"
            )
