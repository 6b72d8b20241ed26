"""The bookkeeping a server keeps over all its connections (`ConnectionLedger`), and
its limits (`ServerLimits`): admission by count and by address, refused connections
lingering, the inbound byte budget, the response byte budget, the timeouts sweep, event
counters and rate-limited logging. `tidemq.net.server.TcpServer` is one; the per-connection
side is `tidemq.net.server.C`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from tidemq.core.clock import Clock
from tidemq.core.limits import (
    NET_FRAME_READ_TIMEOUT_MS,
    NET_IDLE_TIMEOUT_MS,
    NET_LOG_INTERVAL_MS,
    NET_LOGIN_TIMEOUT_MS,
    NET_MAX_CONNECTIONS_PER_ADDRESS,
    NET_MAX_INBOUND_BYTES,
    NET_MAX_LINGERING_REFUSALS,
    NET_MAX_RESPONSE_BYTES,
    NET_MAX_RESPONSE_BYTES_PER_ADDRESS,
    NET_MAX_RESPONSE_BYTES_PER_CONNECTION,
    NET_MIN_RESPONSE_GRANT_BYTES,
    NET_REFUSAL_LINGER_MS,
    NET_REQUESTS_PER_TURN,
    NET_WRITE_BUFFER_HIGH_BYTES,
    NET_WRITE_STALL_TIMEOUT_MS,
)
from tidemq.core.log_limit import RateLimitedLog
from tidemq.net.budget import ResponseBudget

__all__ = ["ConnectionLedger", "ServerLimits"]

#: The timeouts sweep runs this often at most (and at least 4 times per shortest timeout).
_SWEEP_MAX_INTERVAL_MS = 1_000
_SWEEP_MIN_INTERVAL_MS = 10
#: Events counted (and logged at most once per interval each).
EVENTS = ("refused", "read-timeout", "idle", "write-stall", "protocol", "internal")


@dataclass(frozen=True, kw_only=True)
class ServerLimits:
    max_frame_bytes: int
    max_in_flight: int = 32
    max_connections: int = 1024
    max_connections_per_address: int = NET_MAX_CONNECTIONS_PER_ADDRESS
    frame_read_timeout_ms: int = NET_FRAME_READ_TIMEOUT_MS
    idle_timeout_ms: int = NET_IDLE_TIMEOUT_MS
    #: With authentication required: log in within this after connecting.
    login_timeout_ms: int = NET_LOGIN_TIMEOUT_MS
    write_stall_timeout_ms: int = NET_WRITE_STALL_TIMEOUT_MS
    write_buffer_high_bytes: int = NET_WRITE_BUFFER_HIGH_BYTES
    max_response_bytes: int = NET_MAX_RESPONSE_BYTES
    max_response_bytes_per_connection: int = NET_MAX_RESPONSE_BYTES_PER_CONNECTION
    max_response_bytes_per_address: int = NET_MAX_RESPONSE_BYTES_PER_ADDRESS
    max_inbound_bytes: int = NET_MAX_INBOUND_BYTES
    requests_per_turn: int = NET_REQUESTS_PER_TURN
    refusal_linger_ms: int = NET_REFUSAL_LINGER_MS
    max_lingering_refusals: int = NET_MAX_LINGERING_REFUSALS
    log_interval_ms: int = NET_LOG_INTERVAL_MS

    def __post_init__(self) -> None:
        for name, value in self.as_dict().items():
            if value <= 0 and name != "max_lingering_refusals":
                raise ValueError(f"{name} must be positive, got {value}")
        if self.max_connections_per_address > self.max_connections:
            raise ValueError("max_connections_per_address exceeds max_connections")

    def as_dict(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


class Connection(Protocol):
    """What the ledger needs of a connection."""

    host: str

    def close(self) -> None: ...

    def check_timeouts(self, now_ms: float) -> str | None: ...

    def update_reading(self) -> None: ...


C = TypeVar("C", bound=Connection)


class ConnectionLedger(Generic[C]):
    """Shared state of a server's connections. Only the event loop's thread uses it."""

    def __init__(self, limits: ServerLimits, clock: Clock, logger: logging.Logger) -> None:
        self.limits = limits
        self.clock = clock
        self._conns: set[C] = set()
        self._per_address: dict[str, int] = {}
        #: Refused connections kept open a moment, with the time they are closed.
        self._lingering: dict[C, float] = {}
        #: Connections not reading because the inbound budget is spent.
        self._inbound_paused: set[C] = set()
        self.inbound_bytes = 0
        # Each bound at most the one above it (a smaller total caps the others).
        total = limits.max_response_bytes
        per_address = min(limits.max_response_bytes_per_address, total)
        per_connection = min(limits.max_response_bytes_per_connection, per_address)
        self.response_budget = ResponseBudget(
            total_bytes=total,
            per_address_bytes=per_address,
            per_connection_bytes=per_connection,
            min_grant_bytes=min(NET_MIN_RESPONSE_GRANT_BYTES, per_connection),
        )
        self._rlog = RateLimitedLog(logger, clock, interval_ms=limits.log_interval_ms)
        self.counters: dict[str, int] = dict.fromkeys(EVENTS, 0)

    @property
    def connections(self) -> int:
        return len(self._conns)

    def accept(self, conn: C) -> str | None:
        """Admit a new connection; None, or why it is refused (naming the limit)."""
        lim = self.limits
        if len(self._conns) >= lim.max_connections:
            return f"{len(self._conns)} connections open (broker.max_connections)"
        count = self._per_address.get(conn.host, 0)
        if count >= lim.max_connections_per_address:
            return f"{count} connections open from {conn.host} (broker.max_connections_per_address)"
        self._conns.add(conn)
        self._per_address[conn.host] = count + 1
        return None

    def linger(self, conn: C) -> bool:
        """Keep a refused connection open for `refusal_linger_ms` (False: too many are)."""
        if len(self._lingering) >= self.limits.max_lingering_refusals:
            return False
        self._lingering[conn] = self.clock.monotonic_ms() + self.limits.refusal_linger_ms
        return True

    def forget(self, conn: C) -> None:
        self._lingering.pop(conn, None)
        self._inbound_paused.discard(conn)
        if conn in self._conns:
            self._conns.discard(conn)
            count = self._per_address.get(conn.host, 0) - 1
            if count > 0:
                self._per_address[conn.host] = count
            else:
                self._per_address.pop(conn.host, None)

    def log_event(
        self, level: int, kind: str, msg: str, *args: object, exc_info: bool = False
    ) -> None:
        """Log a connection event, at most one line per kind per `log_interval_ms`."""
        if kind in self.counters:
            self.counters[kind] += 1
        self._rlog.log(level, kind, msg, *args, exc_info=exc_info)

    # ------------------------------------------------------------------ inbound budget

    def inbound_over(self) -> bool:
        return self.inbound_bytes >= self.limits.max_inbound_bytes

    def add_inbound(self, delta: int) -> None:
        was_over = self.inbound_over()
        self.inbound_bytes += delta
        assert self.inbound_bytes >= 0
        if was_over and not self.inbound_over():
            for conn in list(self._inbound_paused):
                conn.update_reading()

    def waiting_for_inbound(self, conn: C, waiting: bool) -> None:
        """Track the connections not reading for the inbound budget (woken when it falls)."""
        if waiting:
            self._inbound_paused.add(conn)
        else:
            self._inbound_paused.discard(conn)

    # ------------------------------------------------------------------ timeouts

    def sweep(self) -> int:
        """Close the connections whose timeouts passed and refusals that lingered long
        enough; how many were closed. Runs periodically; tests call it with a
        ManualClock."""
        now = self.clock.monotonic_ms()
        closed = 0
        for conn, deadline in list(self._lingering.items()):
            if now >= deadline:
                self._lingering.pop(conn, None)
                conn.close()
                closed += 1
        for conn in list(self._conns):
            if conn.check_timeouts(now) is not None:
                closed += 1
        return closed

    def sweep_interval_ms(self) -> float:
        lim = self.limits
        shortest = min(
            lim.frame_read_timeout_ms,
            lim.idle_timeout_ms,
            lim.login_timeout_ms,
            lim.write_stall_timeout_ms,
            lim.refusal_linger_ms,
        )
        return min(_SWEEP_MAX_INTERVAL_MS, max(shortest / 4, _SWEEP_MIN_INTERVAL_MS))

    def status(self) -> tuple[dict[str, int], dict[str, int]]:
        """The limits, and the counters and usage (for the STATUS answer)."""
        usage = dict(self.counters)
        usage["connections"] = len(self._conns)
        usage["inbound_bytes"] = self.inbound_bytes
        usage["response_bytes"] = self.response_budget.used_bytes
        usage["lingering_refusals"] = len(self._lingering)
        return self.limits.as_dict(), usage
