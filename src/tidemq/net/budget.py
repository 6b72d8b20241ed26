"""Byte budgets for responses: bytes being built or waiting in a write buffer.

A FETCH reserves its answer's bytes before it reads (`ConnectionBudget.acquire`), gets
at most what is free (the answer is then smaller than its `max_bytes`: the consumer asks
again) and waits while less than `min_grant_bytes` is free. The bytes stay charged until
the answer has left the process: released when it is written to a transport whose
buffer is below its high-water mark, or when that buffer drains (`resume_writing`). A
client that sends FETCHes and never reads their answers thus holds at most its
connection's budget, and all connections together at most the total.

Requests are told apart by their task (each request runs as a task of its own, see
`tidemq.net.server`). Only the event loop's thread uses these objects.
"""

from __future__ import annotations

import asyncio

from tidemq.core.errors import BrokerNotAvailable

__all__ = ["ConnectionBudget", "ResponseBudget"]


class ResponseBudget:
    """The server's budget: `total_bytes` over all connections, `per_address_bytes` over
    the connections from one IP address (so that one host cannot take it all), and
    `per_connection_bytes` each. A grant may exceed what is free by one record (a store
    read returns at least one whole batch), so the bound is the budget plus one batch per
    FETCH in flight."""

    def __init__(
        self,
        *,
        total_bytes: int,
        per_connection_bytes: int,
        min_grant_bytes: int,
        per_address_bytes: int | None = None,
    ) -> None:
        per_address_bytes = total_bytes if per_address_bytes is None else per_address_bytes
        assert 0 < min_grant_bytes <= per_connection_bytes <= per_address_bytes <= total_bytes
        self.total_bytes = total_bytes
        self.per_address_bytes = per_address_bytes
        self.per_connection_bytes = per_connection_bytes
        #: Bytes used by the connections of each address (addresses using none are absent).
        self._by_address: dict[str, int] = {}
        self.min_grant_bytes = min_grant_bytes
        self.used_bytes = 0
        self._waiters: list[asyncio.Future[None]] = []

    def connection(self, address: str = "") -> ConnectionBudget:
        """The budget of a connection from `address` (its IP address)."""
        return ConnectionBudget(self, address)

    def address_bytes(self, address: str) -> int:
        return self._by_address.get(address, 0)

    def _free(self, conn: ConnectionBudget) -> int:
        return min(
            self.per_connection_bytes - conn.used_bytes,
            self.per_address_bytes - self._by_address.get(conn.address, 0),
            self.total_bytes - self.used_bytes,
        )

    def _changed(self) -> None:
        """Bytes were released: every waiter checks again (waiters are few: at most the
        requests in flight)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class ConnectionBudget:
    """One connection's share of a ResponseBudget."""

    def __init__(self, parent: ResponseBudget, address: str) -> None:
        self._parent = parent
        self.address = address
        self.used_bytes = 0
        #: Bytes held by requests still running (by task), and by answers written to a
        #: transport whose buffer was above its high-water mark.
        self._held: dict[object, int] = {}
        self._queued = 0
        self._closed = False

    async def acquire(self, wanted_bytes: int) -> int:
        """Reserve up to `wanted_bytes` for the current request's answer; the bytes
        granted: at least min(wanted, min_grant_bytes), waiting until that much is free.
        Replaces what the request held before. BrokerNotAvailable if the connection
        closes meanwhile."""
        assert wanted_bytes > 0
        self.release()
        parent = self._parent
        need = min(wanted_bytes, parent.min_grant_bytes)
        while parent._free(self) < need:
            if self._closed:
                raise BrokerNotAvailable("the client disconnected")
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            parent._waiters.append(waiter)
            await waiter
        if self._closed:
            raise BrokerNotAvailable("the client disconnected")
        granted = min(wanted_bytes, parent._free(self))
        self.hold(granted)
        return granted

    def hold(self, size_bytes: int) -> None:
        """Set what the current request holds (the answer's real size once read; it may
        exceed the grant by one batch)."""
        assert size_bytes >= 0
        key = _key()
        before = self._held.pop(key, 0)
        if size_bytes:
            self._held[key] = size_bytes
        self._add(size_bytes - before)

    def release(self) -> None:
        """The current request holds nothing any more (an empty answer, before parking)."""
        self.hold(0)

    def settle(self, task: object, *, queued: bool) -> None:
        """The request run by `task` wrote its answer: its bytes are released, or (when
        the transport's buffer is above its high-water mark) kept until `drained`."""
        size = self._held.pop(task, 0)
        if queued and not self._closed:
            self._queued += size
            return
        self._add(-size)

    def drained(self) -> None:
        """The transport's buffer fell below its low-water mark: the answers written
        into it while it was full are gone."""
        size, self._queued = self._queued, 0
        self._add(-size)

    def close(self) -> None:
        """The connection is gone: release everything; waiting requests fail."""
        self._closed = True
        size = self.used_bytes
        self._held.clear()
        self._queued = 0
        self._add(-size)
        self._parent._changed()

    def _add(self, delta: int) -> None:
        if not delta:
            return
        self.used_bytes += delta
        parent = self._parent
        parent.used_bytes += delta
        by_address = parent._by_address.get(self.address, 0) + delta
        if by_address:
            parent._by_address[self.address] = by_address
        else:
            parent._by_address.pop(self.address, None)
        assert self.used_bytes >= 0
        assert self._parent.used_bytes >= 0
        if delta < 0:
            self._parent._changed()


def _key() -> object:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop (a direct call from a test)
        return None
