"""A broker's view of the security writer role (docs/adr/0020): per name server, the
writer it named in its last registration answer, the term, and, when it named this
broker, the lease's end: the name server's broker TTL after the registration was sent.

This broker may change users and ACL entries only while a majority of its name servers
hold a live lease for it (`held_term`); otherwise `refusal` says why, as the error to
answer. Leases are measured on the clock given (the registrations' real monotonic
clock, which keeps running while the process is stopped: a writer resumed after a
pause finds its lease run out before it hears of anything newer).

Not thread-safe. No I/O.
"""

from __future__ import annotations

from collections import Counter

from tidemq.core.clock import Clock
from tidemq.core.errors import BrokerNotAvailable, NotCoordinator, WriterFenced

__all__ = ["WriterLeases", "majority"]


def majority(count: int, name_servers: int) -> bool:
    """Whether `count` of `name_servers` is a majority (two majorities always share one)."""
    return count * 2 > name_servers


class WriterLeases:
    def __init__(self, address: str, name_servers: int, clock: Clock) -> None:
        """`address`: this broker's; `name_servers`: how many it registers with."""
        assert name_servers >= 1, name_servers
        self._address = address
        self._name_servers = name_servers
        self._clock = clock
        #: Name server -> (writer's address, its term, lease end in monotonic ms).
        self._named: dict[str, tuple[str, int, float]] = {}
        #: The writer as the name server that answered last named it ("": unknown).
        self.writer = ""

    def seen(self, server: str, writer: str, term: int, lease_until_ms: float) -> None:
        """Name server `server` answered: `writer` holds `term` (0: no lease granted)."""
        self._named[server] = (writer, term, lease_until_ms)
        self.writer = writer

    def held_term(self) -> int:
        """The term this broker holds a live lease for from a majority of its name
        servers, all naming that same term; 0: none. (Name servers number terms on
        their own: a term only some of them granted is not one a majority agreed on,
        and the majority's confirmations of a change are asked under it, ADR 26.)"""
        now = self._clock.monotonic_ms()
        terms = Counter(
            term
            for writer, term, until in self._named.values()
            if writer == self._address and term > 0 and now < until
        )
        held = [term for term, count in terms.items() if majority(count, self._name_servers)]
        return held[0] if held else 0

    def claimed_term(self) -> int:
        """The term each registration reports (0: none): the newest of the terms of the
        live leases on this broker, once a majority of the name servers grant one,
        whatever their numbers. A name server that numbered the role lower adopts it, so
        they come to grant the same term. (Not on one name server's grant alone: that
        would move the role away from a writer the others still name.)"""
        now = self._clock.monotonic_ms()
        terms = [
            term
            for writer, term, until in self._named.values()
            if writer == self._address and term > 0 and now < until
        ]
        return max(terms) if majority(len(terms), self._name_servers) else 0

    def refusal(self) -> NotCoordinator | BrokerNotAvailable:
        """Why this broker may not change the tables now (when `held_term` is 0)."""
        if self.writer and self.writer != self._address:
            return NotCoordinator(
                f"users and ACL entries are changed on the cluster's writer {self.writer}, "
                f"not on {self._address}"
            )
        now = self._clock.monotonic_ms()
        lapsed = [
            (term, until)
            for writer, term, until in self._named.values()
            if writer == self._address and term > 0 and until <= now
        ]
        if lapsed:
            term, until = max(lapsed)
            return WriterFenced(
                f"this broker's lease on the security writer role (term {term}) ran out "
                f"{now - until:.0f} ms ago: no name server renewed it (this broker was "
                "paused or cut off), so another broker may hold a newer term; the change "
                "was not made; retry on the current writer"
            )
        return BrokerNotAvailable(
            "no majority of the name servers has granted this broker the security writer "
            "role yet (a name server grants none in its first broker TTL); retry"
        )
