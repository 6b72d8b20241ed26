"""`tidemq cluster list / status / remove-broker / elect`."""

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
    to_builtins,
)
from tidemq.client.sync import Admin
from tidemq.core.errors import TidemqError
from tidemq.protocol.security_messages import counter_text

__all__ = ["app"]

app = typer.Typer(help="The brokers registered with the name server.", no_args_is_help=True)


def _admin(bootstrap: str) -> Admin:
    return Admin(check_bootstrap(bootstrap), client_config=client_config())


@command(app, "list")
def list_(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, output: OutputOpt = Output.TABLE) -> None:
    """List live brokers."""
    with _admin(bootstrap) as admin:
        brokers = admin.cluster_status()
    if output is Output.JSON:
        emit_json(brokers)
        return
    emit_table(
        ["BROKER", "ADDRESS", "TOPICS", "LAST HEARTBEAT", "USERS+ACLS"],
        (
            (
                b.name,
                b.address,
                b.topics,
                f"{b.last_heartbeat_ms_ago} ms ago",
                _security(to_builtins(b)),
            )
            for b in brokers
        ),
    )


#: Connection limits shown under the status table: (heading, limit key, usage key).
_LIMIT_ROWS = (
    ("connections", "max_connections", "connections"),
    ("connections per address", "max_connections_per_address", ""),
    ("requests in flight per connection", "max_in_flight_requests", ""),
    ("requests started per loop turn", "requests_per_turn", ""),
    ("request bytes unanswered", "max_inbound_bytes", "inbound_bytes"),
    ("answer bytes unsent", "max_response_bytes", "response_bytes"),
    ("answer bytes unsent per address", "max_response_bytes_per_address", ""),
    ("answer bytes unsent per connection", "max_response_bytes_per_connection", ""),
    ("write buffer high-water bytes", "write_buffer_high_bytes", ""),
    ("frame bytes", "max_frame_bytes", ""),
    ("parked fetches", "max_parked_fetches", ""),
    ("frame read timeout ms", "frame_read_timeout_ms", "read-timeout"),
    ("idle timeout ms", "connection_idle_timeout_ms", "idle"),
    ("write stall timeout ms", "write_stall_timeout_ms", "write-stall"),
)


@command(app)
def status(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
    limits: Annotated[
        bool,
        typer.Option(
            "--limits",
            help="Also list each broker's connection limits, their use, and how many "
            "connections each limit refused or closed.",
        ),
    ] = False,
) -> None:
    """Live brokers with their version, flush mode, log positions and connections (with
    --limits: the connection limits and their use; JSON output always has them)."""
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
        security = _security(row)
        if s is None:
            return [
                row["name"],
                row["address"],
                "unreachable",
                "",
                "",
                "",
                "",
                security,
                row["error"],
                "",
            ]
        unflushed = s["log_end_position"] - s["log_flushed_position"]
        return [
            row["name"],
            row["address"],
            s["version"],
            s["flush_mode"],
            s["topics"],
            _connections(s),
            f"{s['uptime_ms'] // 1000} s",
            security,
            f"end {s['log_end_position']}, unflushed {unflushed}",
            _replication(s),
        ]

    emit_table(
        [
            "BROKER",
            "ADDRESS",
            "VERSION",
            "FLUSH",
            "TOPICS",
            "CONNECTIONS",
            "UPTIME",
            "USERS+ACLS",
            "LOG",
            "REPLICATION",
        ],
        (cells(r) for r in rows),
    )
    if limits:
        for r in rows:
            if r["status"] is not None:
                _emit_limits(r["name"], r["status"])


def _replication(s: dict[str, Any]) -> str:
    """A replica group leader's "m0 epoch 3, committed 1200, in sync m0,m1 (2 needed);
    m2 behind 4096 B": the leader, the group's committed position, the in-sync set and
    how far each follower is from the leader's log end ("-": not a group)."""
    r = s.get("replication")
    if not r:
        return "-"
    text = (
        f"{r['member']} epoch {r['epoch']}, committed {r['committed']}, in sync "
        f"{','.join(r['in_sync'])} ({r['min_insync_replicas']} needed)"
    )
    behind = [
        f"{f['member']} behind {r['log_end'] - f['position']} B"
        for f in r.get("followers", [])
        if f["position"] < r["log_end"] or not f["in_sync"]
    ]
    return "; ".join([text, *behind])


def _security(row: dict[str, Any]) -> str:
    """ "2.3 (1a2b3c4d), writer": the users' and ACLs' version (writer term, change
    within it) and the start of its digest, equal on every broker once a change has
    reached them all (ADR 15); "writer" on the broker holding the role (ADR 20)."""
    digest = row.get("security_digest", "")
    if not digest:
        return "-"
    text = f"{counter_text(int(row.get('security_counter', 0)))} ({digest[:8]})"
    writer_term = row.get("writer_term", 0)
    return f"{text}, writer (term {writer_term})" if writer_term else text


def _connections(s: dict[str, Any]) -> str:
    """ "12 / 1024": open connections and the limit (older brokers report no limits)."""
    limit = s.get("limits", {}).get("max_connections")
    return f"{s['connections']} / {limit}" if limit else str(s["connections"])


def _emit_limits(broker: str, s: dict[str, Any]) -> None:
    lim: dict[str, int] = s.get("limits", {})
    usage: dict[str, int] = s.get("usage", {})
    if not lim:
        say(f"{broker}: this broker does not report its connection limits")
        return
    refused = usage.get("refused", 0)

    def cells(heading: str, key: str, use: str) -> list[object]:
        value = lim.get(key, "")
        if not use:
            return [heading, key, value, ""]
        if use in ("read-timeout", "idle", "write-stall"):
            return [heading, key, value, f"{usage.get(use, 0)} closed"]
        return [heading, key, value, usage.get(use, 0)]

    emit_table(
        ["LIMIT", "KEY (broker.)", "VALUE", "IN USE / EVENTS"],
        (cells(*row) for row in _LIMIT_ROWS),
        title=f"{broker}: connection limits ({refused} connections refused since start)",
    )


@command(app, "remove-broker")
def remove_broker(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The broker's name.")],
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Take a broker out of every static topic's chains, once all it holds has expired,
    or (tiered storage) is in the object store, where the other brokers read it from
    afterwards; refused while it holds data only it can serve, or a write end. Then stop
    it for good."""
    with _admin(bootstrap) as admin:
        pruned = admin.remove_broker(name)
    if output is Output.JSON:
        emit_json(pruned)
        return
    emit_table(
        ["TOPIC", "QUEUE", "LINKS DROPPED", "LINKS IN THE TIER", "CHAIN STARTS AT"],
        ((p.topic, p.queue, p.links, p.offloaded, p.starts_at) for p in pruned),
        title=f"Broker {name} is no longer needed to serve any data; stop it.",
    )


@command(app, "elect")
def elect(
    group: Annotated[str, typer.Argument(metavar="GROUP", help="The replica group.")],
    broker: Annotated[
        str,
        typer.Option("--broker", help="The member to lead it (an in-sync follower)."),
    ],
    timeout_ms: Annotated[
        int,
        typer.Option(
            "--timeout-ms",
            min=1,
            help="Longest the leader refuses writes while the member catches up.",
        ),
    ] = 10_000,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Move a replica group's leadership to another member by hand, losing nothing
    acknowledged: the leader refuses new writes (clients retry) until the member holds
    its whole log, then steps down for it (docs/guide/replication.md)."""
    with _admin(bootstrap) as admin:
        done = admin.elect_leader(group, broker, timeout_ms=timeout_ms)
    if output is Output.JSON:
        emit_json(done)
        return
    say(
        f"group {done.group}: {done.previous} handed over to {done.member} "
        f"(serving on {done.address}); writes refused {done.paused_ms:.0f} ms, "
        f"handover {done.took_ms:.0f} ms"
    )
