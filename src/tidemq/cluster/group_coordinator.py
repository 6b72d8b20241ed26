"""Which broker coordinates a consumer group: rendezvous (highest-random-weight) hashing of
the group's name over the names of the live brokers (ADR 17).

Every broker name gets a weight for the group, a stable hash of (name, group); the broker
with the highest weight coordinates the group: it keeps the group's membership and stores
its committed offsets. A pure function of the group and the live names, so every client
that sees the same name server's broker list picks the same broker, with no coordination
and nothing stored. Its properties, which the unit tests check:

* **Stable.** The hash is BLAKE2b of the name and the group (never Python's salted
  `hash()`): the same in every process, version and client.
* **Spread.** With N brokers each coordinates about 1/N of the groups.
* **Minimal movement.** A broker that joins takes exactly the groups for which it now
  has the highest weight, each from the broker that had it; no other group moves. A broker
  that leaves gives up exactly its own groups, each to the broker with the next highest
  weight for it; when it returns they come back to it.

Names, not addresses, are hashed: a broker that restarts on another port keeps its
groups, and in a replicated cluster the name is the replica group's (registered by its
leader), so a failover inside the group moves no group at all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

__all__ = ["coordinator_for", "coordinator_name", "weight"]

#: Separates the broker name from the group name in the hashed bytes, so that
#: ("ab", "c") and ("a", "bc") weigh differently. Neither name can contain it.
_SEPARATOR = b"\x00"


def weight(broker_name: str, group: str) -> int:
    """The broker's weight for the group: 64 bits of BLAKE2b over both names."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(broker_name.encode())
    digest.update(_SEPARATOR)
    digest.update(group.encode())
    return int.from_bytes(digest.digest(), "big")


def coordinator_name(group: str, broker_names: Iterable[str]) -> str | None:
    """The name of the broker that coordinates `group` among `broker_names` (the highest
    weight; a tie, at odds of 2**-64, goes to the smaller name); None when there is none."""
    best: tuple[int, str] | None = None
    for name in broker_names:
        w = weight(name, group)
        if best is None or w > best[0] or (w == best[0] and name < best[1]):
            best = (w, name)
    return None if best is None else best[1]


def coordinator_for(group: str, brokers: Mapping[str, str]) -> str:
    """The address of the broker that coordinates `group`, from the live brokers as the
    name servers list them (name -> address); "" when none is live."""
    name = coordinator_name(group, brokers)
    return "" if name is None else brokers[name]
