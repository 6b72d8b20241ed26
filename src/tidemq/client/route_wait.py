"""Sends waiting for their topic's route, in the order they were made.

A send's queue depends on the topic's route (its queue count, for key hashing and round
robin). When the route is not known, or not trusted any more, the send cannot go to its
queue's sender yet. It waits here, in one line per topic, and so does every later send to
that topic until the line is empty: a send made while earlier ones wait for the route
never overtakes them (the bug of issue 15: sends made after the route arrived took the
fast path ahead of sends still awaiting it). One task per waiting topic looks the route
up (with retries within the sends' delivery time), then hands every waiting send to its
queue in order, in one go, with no await in between.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tidemq.client.cluster import ClusterClient, RouteTable
from tidemq.core.errors import RequestTimeout, TidemqError

__all__ = ["RouteWait", "WaitingSend"]

#: The least time a route lookup gets, even for sends past their delivery deadline.
_MIN_LOOKUP_S = 0.5


@dataclass(slots=True)
class WaitingSend:
    """One send waiting for its topic's route: `deliver(queue)` hands it to its queue (it
    must not raise), `fail(error)` answers it."""

    key: bytes | None
    queue: int | None
    deliver: Callable[[int], None]
    fail: Callable[[BaseException], None]
    deadline: float  # time.monotonic() seconds


class RouteWait:
    """The per-topic lines of sends waiting for a route. Owned by one producer; used
    only from its event loop."""

    def __init__(self, cluster: ClusterClient, routes_checked: Callable[[], None]) -> None:
        self._cluster = cluster
        self._routes_checked = routes_checked
        self._lines: dict[str, deque[WaitingSend]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._round_robin = itertools.count()

    def waiting(self, topic: str) -> bool:
        """Whether sends to `topic` are waiting: a new send must wait behind them."""
        return topic in self._lines

    def next_round_robin(self) -> int:
        return next(self._round_robin)

    def add(self, topic: str, send: WaitingSend) -> None:
        line = self._lines.get(topic)
        if line is None:
            line = self._lines[topic] = deque()
            task = asyncio.get_running_loop().create_task(self._drain(topic, line))
            self._tasks[topic] = task
        line.append(send)

    async def wait_all(self) -> None:
        """Until no send waits for a route (each has gone to its queue or failed)."""
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def _drain(self, topic: str, line: deque[WaitingSend]) -> None:
        try:
            routes = await self._lookup(topic, line)
            if routes is not None:
                self._hand_over(topic, line, routes)
        except BaseException as exc:  # cancelled, or a bug: answer every waiting send
            error = exc if isinstance(exc, Exception) else _cancelled(topic)
            while line:
                line.popleft().fail(error)
            if not isinstance(exc, Exception):
                raise
        finally:
            # In the same step as the last hand-over: a send made after this goes straight
            # to its queue, behind the ones just handed over.
            del self._lines[topic]
            del self._tasks[topic]

    async def _lookup(self, topic: str, line: deque[WaitingSend]) -> RouteTable | None:
        """The topic's routes, retried within the waiting sends' delivery time; None when
        every waiting send has failed."""
        cluster = self._cluster
        attempt = 0
        while line:
            # No lookup outlasts the earliest waiting send's delivery time (a lookup that
            # retries on its own could take longer).
            budget_s = max(_MIN_LOOKUP_S, min(s.deadline for s in line) - time.monotonic())
            try:
                try:
                    async with asyncio.timeout(budget_s):
                        routes = await cluster.refresh_routes()
                        if topic not in routes:  # new to this client: its route alone
                            routes = await cluster.refresh_topics([topic])
                        if topic not in routes:
                            routes = await cluster.refresh_routes(force=True)
                except TimeoutError:
                    raise RequestTimeout(
                        f"looking up the route of {topic!r} took longer than {budget_s:.1f} s"
                    ) from None
                routes.select_queue(topic, None, 0)  # raises TopicNotFound, no live broker
            except TidemqError as exc:
                attempt += 1
                self._fail_expired(line, exc, final=not exc.retriable)
                if attempt > cluster.config.retries:
                    self._fail_expired(line, exc, final=True)
                if line:
                    cluster.invalidate(exc)
                    await asyncio.sleep(cluster.backoff_s(attempt))
                continue
            self._routes_checked()
            return routes
        return None

    @staticmethod
    def _fail_expired(line: deque[WaitingSend], exc: TidemqError, *, final: bool) -> None:
        now = time.monotonic()
        kept = [s for s in line if not final and s.deadline > now]
        for send in line:
            if final:
                send.fail(exc)
            elif send.deadline <= now:
                send.fail(RequestTimeout(f"no route within the delivery timeout: {exc}"))
        line.clear()
        line.extend(kept)

    def _hand_over(self, topic: str, line: deque[WaitingSend], routes: RouteTable) -> None:
        while line:
            send = line.popleft()
            try:
                queue = send.queue
                if queue is None and send.key is not None:
                    # Its queue even if no broker serves it this moment (a broker away, a
                    # static queue between two links): the queue's sender retries within
                    # the delivery time, as for a send that names its queue.
                    queue = routes.key_queue(topic, send.key)
                elif queue is None:
                    queue = routes.select_queue(topic, None, next(self._round_robin))
            except TidemqError as exc:  # no queue of the topic has a live broker
                send.fail(exc)
                continue
            send.deliver(queue)


def _cancelled(topic: str) -> RequestTimeout:
    return RequestTimeout(
        f"the producer stopped while sends to {topic!r} waited for its route; they were not sent"
    )
