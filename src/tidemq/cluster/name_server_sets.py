"""Whether the brokers list the same name servers (docs/adr/0026).

The security writer's change is acknowledged once a majority of the name servers it
registers with confirmed it, and a writer holds its term from a majority of them too:
two majorities of one list always share a name server, which is what carries a
confirmed change to the next writer. Two brokers listing different name servers (one
left out, a third added on some brokers only) have majorities that need not meet. Each
registration carries a digest of the broker's list (`digest`); a name server that hears
different digests from live brokers logs a warning when the broker that differs
registers (at its start), and refuses writers' confirmations, naming them, until they
agree (the change is answered ChangeUnconfirmed: made on the writer, maybe never
anywhere else).

An address is compared as written: list the name servers the same way on every broker
(the order does not matter). Pure: no I/O, no clock. Not thread-safe.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["NameServerSets", "digest"]


def digest(name_servers: Iterable[str]) -> int:
    """A positive 63-bit digest of a broker's name servers, in any order."""
    text = "\n".join(sorted(set(name_servers))).encode()
    return (int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 1) | 1


class NameServerSets:
    def __init__(self, *, max_brokers: int = 1024) -> None:
        #: Broker name -> the digest its last registration carried (0s are not kept).
        self._digests: dict[str, int] = {}
        self._max_brokers = max_brokers

    def report(self, broker: str, list_digest: int) -> bool:
        """A registration of `broker` with `list_digest` (0: not said); whether that
        broker's list is new or changed (then look for a disagreement: at its start)."""
        before = self._digests.pop(broker, None)
        if list_digest:
            self._digests[broker] = list_digest
            while len(self._digests) > self._max_brokers:  # the longest silent first
                del self._digests[next(iter(self._digests))]
        return bool(list_digest) and before != list_digest

    def disagreement(self, live: Iterable[str]) -> str:
        """ "" if the `live` brokers that said list the same name servers; else which
        brokers list which (by digest), for an error and the log."""
        groups: dict[int, list[str]] = {}
        for broker in sorted(live):
            if broker in self._digests:
                groups.setdefault(self._digests[broker], []).append(broker)
        if len(groups) <= 1:
            return ""
        listed = "; ".join(f"{', '.join(names)} (list {d:x})" for d, names in groups.items())
        return (
            "the brokers register with different sets of name servers "
            f"({listed}): every broker must list the same name servers (broker.name_servers)"
        )
