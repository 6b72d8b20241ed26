"""What a name server knows of the cluster's users and ACL entries (ADR 15).

It holds the newest snapshot any broker pushed (in memory only: a restarted name server
asks for it again at the next beats, as it learns the routes again), the version each
broker last reported, and whom it asked to push. Brokers that are behind pull the held
snapshot; the name server's own logins (`tidemq namesrv` with `broker.auth_enabled`)
check the users in it.

Pushes: a broker whose reported version is newer than the held one is asked to push,
but only one broker per version at a time (`PUSH_ASK_MS`): after a name server restarts,
a thousand brokers reporting the same version do not all send their tables at once.

Not thread-safe. No I/O.
"""

from __future__ import annotations

from typing import Final

import msgspec

from tidemq.core import limits
from tidemq.core.errors import InvalidRequest
from tidemq.core.scram import Credentials, ScramError
from tidemq.protocol.security_messages import SecuritySnapshot, snapshot_digest

__all__ = ["PUSH_ASK_MS", "SecurityHolder", "Version", "check_snapshot", "users_of"]

#: How long a name server waits for the broker it asked to push before asking another
#: (a push is one request; several beats without it means that broker is gone or failing).
PUSH_ASK_MS: Final = 5_000

#: (counter, digest), compared as a pair (protocol/security_messages.py).
Version = tuple[int, int]


class SecurityHolder:
    def __init__(self, *, max_brokers: int = 1024) -> None:
        self._snapshot = SecuritySnapshot()
        self._users: dict[str, Credentials] = {}
        #: broker name -> the version it last reported (at most `max_brokers`, the
        #: longest silent forgotten first: insertion order is report order).
        self._reported: dict[str, Version] = {}
        self._max_brokers = max_brokers
        #: (broker asked, version it reported, when: monotonic ms), if any.
        self._asked: tuple[str, Version, float] | None = None

    @property
    def held(self) -> Version:
        return (self._snapshot.counter, self._snapshot.digest)

    @property
    def snapshot(self) -> SecuritySnapshot:
        return self._snapshot

    def report(self, broker: str, version: Version, now_ms: float) -> bool:
        """A broker's registration reported `version`; whether to ask it to push."""
        self._reported.pop(broker, None)
        self._reported[broker] = version
        while len(self._reported) > self._max_brokers:
            del self._reported[next(iter(self._reported))]
        if version <= self.held:
            return False
        asked = self._asked
        if (
            asked is not None
            and asked[0] != broker
            and asked[1] >= version
            and now_ms - asked[2] < PUSH_ASK_MS
        ):
            return False  # another broker was asked for this version (or newer) just now
        self._asked = (broker, version, now_ms)
        return True

    @property
    def current(self) -> bool:
        """Whether the users held are as new as some broker's: a name server keeps
        nothing on disk, so from its start until a broker's registration says which
        version is current (and, if newer, pushes it), it cannot check a user's login."""
        held = self.held
        return any(version <= held for version in self._reported.values())

    def reported(self, broker: str) -> Version:
        return self._reported.get(broker, (0, 0))

    def offer(self, snapshot: SecuritySnapshot) -> bool:
        """Keep a pushed snapshot if it is newer than the held one; InvalidRequest if it
        is malformed (its digest does not match its tables, a bound is passed, a user's
        credentials are invalid): nothing is kept then."""
        if (snapshot.counter, snapshot.digest) <= self.held:
            return False
        check_snapshot(snapshot)
        self._users = users_of(snapshot)
        self._snapshot = snapshot
        return True

    def credentials(self, user: str) -> Credentials | None:
        """A user's credentials in the held snapshot (the name server's logins)."""
        return self._users.get(user)


def check_snapshot(snapshot: SecuritySnapshot) -> None:
    """InvalidRequest unless the snapshot is within its bounds and its digest is its
    tables' (a snapshot damaged or forged in transit is refused whole)."""
    if snapshot.counter < 0:
        raise InvalidRequest(f"security snapshot: negative counter {snapshot.counter}")
    if len(snapshot.users) > limits.MAX_USERS:
        raise InvalidRequest(f"security snapshot: more than {limits.MAX_USERS} users")
    if len(snapshot.acls) > limits.MAX_ACL_ENTRIES:
        raise InvalidRequest(f"security snapshot: more than {limits.MAX_ACL_ENTRIES} ACL entries")
    size = len(msgspec.msgpack.encode(snapshot))
    if size > limits.MAX_SECURITY_SNAPSHOT_BYTES:
        raise InvalidRequest(
            f"security snapshot: {size} bytes, over {limits.MAX_SECURITY_SNAPSHOT_BYTES}"
        )
    if snapshot_digest(snapshot.users, snapshot.acls) != snapshot.digest:
        raise InvalidRequest("security snapshot: its digest does not match its tables")


def users_of(snapshot: SecuritySnapshot) -> dict[str, Credentials]:
    """The snapshot's users (InvalidRequest for invalid credentials or a repeated name)."""
    users: dict[str, Credentials] = {}
    for u in snapshot.users:
        if u.name in users:
            raise InvalidRequest(f"security snapshot: user {u.name!r} appears twice")
        try:
            users[u.name] = Credentials(
                salt=u.salt,
                iterations=u.iterations,
                stored_key=u.stored_key,
                server_key=u.server_key,
            )
        except ScramError as exc:
            raise InvalidRequest(f"security snapshot: user {u.name!r}: {exc}") from None
    return users
