"""`tidemq timer status|cancel` and `tidemq txn status|rollback`: delayed and transactional
messages as the brokers see them."""

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
from tidemq.client.sync import Admin, Producer

__all__ = ["timer_app", "txn_app"]

timer_app = typer.Typer(help="Delayed (timer) messages.", no_args_is_help=True)
txn_app = typer.Typer(help="Transactional messages.", no_args_is_help=True)


def _when(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds") if ms else ""
    )


@command(timer_app, "status")
def timer_status(
    topic: Annotated[str, typer.Option("--topic", help="Only this topic.")] = "",
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Pending delayed messages per topic, with the next due time."""
    with Admin(check_bootstrap(bootstrap), client_config=client_config()) as admin:
        status = admin.timer_status(topic)
    if output is Output.JSON:
        emit_json(status)
        return
    emit_table(
        ["TOPIC", "PENDING BATCHES", "PENDING MESSAGES", "NEXT DUE (UTC)"],
        (
            (t.topic, t.pending_batches, t.pending_messages, _when(t.next_due_ms))
            for t in status.topics
        ),
    )
    typer.echo(
        f"delivered {status.delivered_batches} batches, cancelled {status.cancelled_batches}; "
        f"precision {status.precision_ms} ms, max delay {status.max_delay_ms // 1000} s"
    )


@command(timer_app, "cancel")
def timer_cancel(
    message_id: Annotated[str, typer.Argument(help="The id a delayed send returned.")],
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Cancel a delayed message before its delivery."""
    with Producer(check_bootstrap(bootstrap), client_config=client_config()) as producer:
        answer = producer.cancel(message_id)
    if output is Output.JSON:
        emit_json(answer)
        return
    typer.echo(
        f"cancelled {answer.count} message(s) for {answer.topic}, due {_when(answer.deliver_at_ms)}"
    )


@command(txn_app, "status")
def txn_status(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, output: OutputOpt = Output.TABLE) -> None:
    """Open transactions, and the ones the brokers rolled back after their check-backs."""
    with Admin(check_bootstrap(bootstrap), client_config=client_config()) as admin:
        status = admin.transaction_status()
    if output is Output.JSON:
        emit_json(status)
        return
    emit_table(
        ["STATE", "TRANSACTION", "GROUP", "MESSAGES", "SINCE (UTC)", "CHECKS / REASON"],
        [
            *(
                ("open", t.txn_id, t.group, t.messages, _when(t.first_send_ms), t.checks)
                for t in status.open
            ),
            *(
                ("discarded", d.txn_id, d.group, d.messages, _when(d.decided_ms), d.reason)
                for d in status.discarded
            ),
        ],
    )
    typer.echo(
        f"committed {status.committed}, rolled back {status.rolled_back}; checks after "
        f"{status.check_delay_ms} ms, every {status.check_interval_ms} ms, "
        f"at most {status.max_checks}"
    )


@command(txn_app, "rollback")
def txn_rollback(
    txn_id: Annotated[str, typer.Argument(help="An open transaction's id (tidemq txn status).")],
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Roll back an open transaction, as its producer would: its messages are never
    published, and the producer's later commit fails."""
    with Admin(check_bootstrap(bootstrap), client_config=client_config()) as admin:
        admin.rollback_transaction(txn_id)
    typer.echo(f"rolled back {txn_id}")
