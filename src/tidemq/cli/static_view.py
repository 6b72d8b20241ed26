"""How `tidemq topic describe` and `tidemq topic remap` show a static topic's chains."""

from __future__ import annotations

import datetime as dt

from tidemq.cli.common import emit_table, say
from tidemq.client.results import TopicInfo
from tidemq.client.static_admin import RemapReport
from tidemq.core.static_chain import Link, QueueChain

__all__ = ["show_chains", "show_remap"]

_LINK_COLUMNS = [
    "QUEUE", "LINK", "BROKER", "LOGICAL FROM", "LOGICAL TO", "PHYSICAL FROM", "PHYSICAL TO",
    "OPENED", "SEALED", "STATE",
]  # fmt: skip


def _time(ms: int) -> str:
    if not ms:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _state(chain: QueueChain, n: int, link: Link) -> str:
    if link.is_open:
        return "open (write end)"
    if n == len(chain.links) - 1 and chain.target:
        return f"sealed, switch to {chain.target} unfinished (run remap --repair)"
    return "sealed"


def show_chains(topic: TopicInfo) -> None:
    """One row per link: where each logical range of each queue is stored."""
    epochs = sorted({c.epoch for c in topic.chains})
    epoch = str(epochs[0]) if len(epochs) == 1 else f"{epochs[0]}..{epochs[-1]}"
    pending = [c.queue for c in topic.chains if c.write_end is None]
    emit_table(
        _LINK_COLUMNS,
        (
            (
                chain.queue,
                n,
                link.broker,
                link.logical_start,
                "" if link.logical_end is None else link.logical_end,
                link.physical_start,
                "" if link.is_open else link.physical_end,
                _time(link.opened_ms),
                _time(link.sealed_ms),
                _state(chain, n, link),
            )
            for chain in topic.chains
            for n, link in enumerate(chain.links)
        ),
        title=f"Static topic {topic.name}: links of each queue (mapping epoch {epoch}):",
    )
    if pending:
        say(
            f"Queues {pending} have no writable link: a remap stopped half-way. Finish it "
            f"with: tidemq topic remap {topic.name} --repair"
        )


def show_remap(report: RemapReport) -> None:
    if not report.switches:
        say(f"Nothing to move: the write ends of {report.topic!r} are where asked.")
        return
    emit_table(
        ["QUEUE", "FROM", "TO", "NEW LINK STARTS AT", "DELAYED HANDED OVER"],
        ((s.queue, s.source, s.target, s.at, s.delayed) for s in report.switches),
        title=(
            f"Remapped {report.topic!r}: {len(report.switches)} write end(s) moved in "
            f"{report.elapsed_ms:.0f} ms, no data moved:"
        ),
    )
