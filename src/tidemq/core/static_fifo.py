"""FIFO pop consumption across the links of a static queue: a broker may lease messages of
one of its links only once every message before that link, on other brokers, is finished
(acknowledged or dead-lettered) for the pop group, so a message group's order holds
across a remap (docs/design/static-topics.md, "Pop consumption of FIFO topics").

No broker knows another's pop state, so the pop consumer carries it: every broker answers
a receive with how far the group has finished its own links of each static queue
(`finished_logical`); the consumer walks the chain to the first link not finished
(`contiguous_finished`) and tells every broker that offset with its next receive; a
broker reads its physical queue only up to the first of its links that the offset does
not clear yet (`pop_limit`). A consumer that does not say so leaves the later links
unread: the barrier fails closed.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidemq.core.static_chain import QueueChain

__all__ = ["contiguous_finished", "finished_logical", "pop_limit"]


def pop_limit(chain: QueueChain, broker: str, finished: int) -> int | None:
    """The physical offset of `broker`'s queue before which its pop may read, given that
    every logical offset below `finished` is done for the group; None: no limit."""
    others_end = -1  # the logical end of the latest link of another broker so far
    for link in chain.links:
        if link.broker != broker:
            others_end = max(others_end, link.logical_end or link.logical_start)
            continue
        if others_end > finished:
            return link.physical_start
    return None


def finished_logical(chain: QueueChain, broker: str, physical: int) -> int:
    """What `broker` reports: every message of its own links below this logical offset is
    finished, when the group's pop has finished everything below `physical` there."""
    mine = [link for link in chain.links if link.broker == broker]
    for link in mine:
        end = link.physical_end
        if link.is_open or physical < end:
            return link.logical_start + max(0, physical - link.physical_start)
    # Every own link is sealed and finished: report the end of the last one.
    return (mine[-1].logical_end or 0) if mine else 0


def contiguous_finished(chain: QueueChain, reports: Mapping[str, int]) -> int:
    """The logical offset below which the group has finished every message of the queue,
    from the brokers' reports (broker name -> `finished_logical`): each link is finished
    when its broker's report reaches its end, and the walk stops at the first that is not."""
    done = chain.links[0].logical_start if chain.links else 0
    for link in chain.links:
        report = reports.get(link.broker)
        if report is None:
            return done
        end = link.logical_end
        if end is None or report < end:
            return max(done, report)
        done = end
    return done
