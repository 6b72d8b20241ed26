"""Who writes the cluster's users and ACL entries, under which term (docs/adr/0020).

The security writer holds a numbered term. A name server grants it: to the broker that
holds the current term while that broker is live (the role is sticky: a broker that
comes back after a pause does not take it back), else to the oldest live broker (the
smallest (creation time, name)) under the next term. Each registration answer to the
writer renews its lease on the role (`broker_ttl_ms` from when it sent the
registration, security_sync.py); a broker's liveness here outlasts that lease, so by
the time this name server moves the role on, the deposed writer's lease has run out on
its own clock, paused or not.

A name server keeps nothing on disk. A new one learns the term from the brokers: each
reports the term it holds a lease for (`report`), and tables written under a term carry
it (security_messages.counter_of), so numbers never go back. Until it has run for one
TTL, every lease granted by its previous run has run out or been reported; in that
grace it names a candidate but grants no lease (term 0) unless the holder reported.

Pure: no I/O, no clock of its own (the caller passes monotonic ms). Not thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable

from tidemq.protocol.security_messages import term_of

__all__ = ["WriterTerms"]


class WriterTerms:
    def __init__(self, *, started_ms: float, grace_ms: int) -> None:
        """`started_ms`: when this name server started; `grace_ms`: its broker TTL (the
        longest a lease granted by an earlier run can last)."""
        self._grace_until_ms = started_ms + grace_ms
        #: The newest term granted or learnt, and the broker name holding it ("": none
        #: now; the next grant takes term + 1).
        self.term = 0
        self.holder = ""

    def report(self, broker: str, held_term: int, counter: int) -> bool:
        """A registration of `broker`, which holds a lease for `held_term` (0: none) and
        whose tables are at `counter`. Whether the writer or term changed."""
        if held_term > self.term or (held_term == self.term > 0 and not self.holder):
            self.term, self.holder = held_term, broker
            return True
        written = term_of(counter)
        if written > self.term:
            # Tables written under a term this name server never granted nor heard of
            # (another name server's): the numbers must not go back, and whoever holds
            # an older term here is not the writer any more.
            self.term, self.holder = written, ""
            return True
        return False

    def confirms(self, broker: str, term: int) -> str:
        """Whether this name server confirms a change `broker` made under writer `term`
        (docs/adr/0026): "" if `broker` holds `term` here, else why not. `report` the
        same term first (a term another name server granted is adopted as a
        registration's would be). Once this name server has granted a newer term it
        confirms nothing older: every answer granting a term carries the tables held,
        so a change it confirmed reaches the next writer before that one writes."""
        if self.holder == broker and self.term == term:
            return ""
        if self.term > term:
            return f"this name server has granted writer term {self.term}"
        return f"writer term {term} is not {broker}'s here (term {self.term}: {self.holder!r})"

    def release(self, broker: str) -> None:
        """`broker` is another process now (it registered from another address: a
        replica group's new leader under the group's name): whatever lease its previous
        process holds may still run, so the role goes to a next term."""
        if self.holder == broker:
            self.holder = ""

    def writer(self, live: Iterable[tuple[int, str]], now_ms: float) -> tuple[str, int]:
        """(the writer's broker name, its term) among the `live` brokers, given as
        (creation time, name); term 0: no lease may be granted now. ("", 0): none live."""
        ordered = sorted(live)
        if any(name == self.holder for _, name in ordered):
            return self.holder, self.term
        if not ordered:
            return "", 0
        candidate = ordered[0][1]
        if now_ms < self._grace_until_ms:
            return candidate, 0
        self.term += 1
        self.holder = candidate
        return candidate, self.term
