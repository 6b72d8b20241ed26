"""`tidemq cluster list / status`."""

from __future__ import annotations

from typing import Any

import typer

from tidemq.cli.common import (
    CLIENT_CONFIG,
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    Output,
    OutputOpt,
    check_bootstrap,
    command,
    emit_json,
    emit_table,
    to_builtins,
)
from tidemq.client.sync import Admin
from tidemq.core.errors import TidemqError

__all__ = ["app"]

app = typer.Typer(help="The brokers registered with the name server.", no_args_is_help=True)


def _admin(bootstrap: str) -> Admin:
    return Admin(check_bootstrap(bootstrap), client_config=CLIENT_CONFIG)


@command(app, "list")
def list_(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, output: OutputOpt = Output.TABLE) -> None:
    """List live brokers."""
    with _admin(bootstrap) as admin:
        brokers = admin.cluster_status()
    if output is Output.JSON:
        emit_json(brokers)
        return
    emit_table(
        ["BROKER", "ADDRESS", "TOPICS", "LAST HEARTBEAT"],
        ((b.name, b.address, b.topics, f"{b.last_heartbeat_ms_ago} ms ago") for b in brokers),
    )


@command(app)
def status(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, output: OutputOpt = Output.TABLE) -> None:
    """Live brokers with their version, flush mode, log positions and connections."""
    rows: list[dict[str, Any]] = []
    with _admin(bootstrap) as admin:
        for b in admin.cluster_status():
            row: dict[str, Any] = to_builtins(b)
            try:
                row["status"] = to_builtins(admin.broker_status(b.address))
            except TidemqError as exc:  # registered but not answering: report, go on
                row["status"] = None
                row["error"] = str(exc)
            rows.append(row)
    if output is Output.JSON:
        emit_json(rows)
        return

    def cells(row: dict[str, Any]) -> list[object]:
        s = row["status"]
        if s is None:
            return [row["name"], row["address"], "unreachable", "", "", "", "", row["error"]]
        unflushed = s["log_end_position"] - s["log_flushed_position"]
        return [
            row["name"],
            row["address"],
            s["version"],
            s["flush_mode"],
            s["topics"],
            s["connections"],
            f"{s['uptime_ms'] // 1000} s",
            f"end {s['log_end_position']}, unflushed {unflushed}",
        ]

    emit_table(
        ["BROKER", "ADDRESS", "VERSION", "FLUSH", "TOPICS", "CONNECTIONS", "UPTIME", "LOG"],
        (cells(r) for r in rows),
    )
