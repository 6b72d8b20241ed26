"""A pop consumer's view of its group's progress on static FIFO queues whose links span
brokers (`core/static_fifo.py`): each broker reports how far the group finished its own
links; the consumer tells every broker how far the whole queue is finished, so a link is
popped only once the links before it are."""

from __future__ import annotations

from tidemq.client.cluster import RouteTable
from tidemq.core.static_fifo import contiguous_finished

__all__ = ["FifoProgress"]


class FifoProgress:
    def __init__(self) -> None:
        #: (topic, queue) -> broker name -> its report (only grows).
        self._reports: dict[tuple[str, int], dict[str, int]] = {}

    def record(
        self, routes: RouteTable, address: str, finished: list[tuple[str, int, int]]
    ) -> None:
        names = [name for name, a in routes.brokers.items() if a == address]
        if not names:
            return  # a broker that left the routes meanwhile: its next answer counts
        for topic, queue, offset in finished:
            reports = self._reports.setdefault((topic, queue), {})
            reports[names[0]] = max(offset, reports.get(names[0], -1))

    def finished(self, routes: RouteTable) -> list[tuple[str, int, int]]:
        """(topic, queue, logical offset below which the group finished everything)."""
        out = []
        for (topic, queue), reports in self._reports.items():
            chain = routes.chain(topic, queue) if topic in routes else None
            if chain is not None:
                out.append((topic, queue, contiguous_finished(chain, reports)))
        return out
