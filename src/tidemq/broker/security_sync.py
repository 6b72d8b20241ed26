"""The broker's users and ACL entries as the cluster's (ADR 15).

The tables have a version (counter, digest; protocol/security_messages.py). Only the
cluster's writer, the group coordinator that the name servers name in their registration
answers, changes them: each change carries the next counter, written in the same SQLite
transaction as the change. Every registration reports the version; a broker whose name
server holds a newer one pulls it and replaces both tables in one transaction
(`Metadata.replace_security`), then its login and ACL caches (`Authenticator`,
`Authorization`) at once, so deletions and password changes converge like additions.

The writer refuses a change while it knows of a newer version than its own (it would
build on old tables and its change would lose against the newer one): the client is told
to retry (BrokerNotAvailable) and the next beat catches it up. One writer per cluster
keeps concurrent changes from two admins ordered; two writers at once (a failover seen
differently by two name servers) can still each make change N, and then the larger digest
wins everywhere and the other change is lost: ADR 15 says why that is accepted for now.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tidemq.broker.auth import Authenticator
from tidemq.broker.authorization import Authorization
from tidemq.broker.store_gateway import StoreGateway
from tidemq.cluster.security_holder import check_snapshot, users_of
from tidemq.core.errors import BrokerNotAvailable, InvalidRequest, NotCoordinator
from tidemq.protocol.acl_messages import AclEntryMsg
from tidemq.protocol.security_messages import SecuritySnapshot, UserRow, acl_key, snapshot_digest

__all__ = ["SecuritySync"]

log = logging.getLogger(__name__)


class SecuritySync:
    """One per broker, on its loop. Implements `cluster.security_link.SecurityTables`."""

    def __init__(
        self,
        auth: Authenticator,
        authz: Authorization,
        gateway: StoreGateway,
        *,
        address: str,
        changed: Callable[[], None],
    ) -> None:
        """`address`: this broker's, to compare with the writer's. `changed`: called
        after a change made here (register now, so the name servers ask for it)."""
        self._auth = auth
        self._authz = authz
        self._gateway = gateway
        self._address = address
        self._changed = changed
        self._counter = gateway.store.metadata.security_counter()
        self._digest = 0
        self._digest = self.snapshot().digest
        #: The newest version a name server holds, as far as this broker knows.
        self._newest = (0, 0)
        #: The writer's address, as the name servers last named it ("": unknown).
        self._writer = ""
        auth.next_counter = authz.next_counter = self.next_counter
        auth.on_change = authz.on_change = self._after_change

    def version(self) -> tuple[int, int]:
        return (self._counter, self._digest)

    def snapshot(self) -> SecuritySnapshot:
        users = [
            UserRow(
                name=name,
                salt=c.salt,
                iterations=c.iterations,
                stored_key=c.stored_key,
                server_key=c.server_key,
            )
            for name, c in self._auth.rows()
        ]
        acls = [_acl_message(row) for row in self._authz.rows()]
        digest = snapshot_digest(users, acls)
        return SecuritySnapshot(counter=self._counter, digest=digest, users=users, acls=acls)

    def seen(self, newest: tuple[int, int], writer: str) -> None:
        self._newest = max(self._newest, newest)
        self._writer = writer

    def behind(self) -> bool:
        """A name server holds a newer cluster-wide version than this broker's."""
        return self._newest[0] >= 1 and self._newest > self.version()

    def next_counter(self) -> int:
        """The counter of a change about to be made here; NotCoordinator if this broker
        is not the writer, BrokerNotAvailable (retriable) while it is catching up."""
        if self._writer and self._writer != self._address:
            raise NotCoordinator(
                f"users and ACL entries are changed on the cluster's writer {self._writer}, "
                f"not on {self._address}"
            )
        if self.behind():
            raise BrokerNotAvailable(
                f"this broker is catching up with users and ACL entries version "
                f"{self._newest[0]} (it has {self._counter}); retry"
            )
        return max(self._counter, self._newest[0]) + 1

    def _after_change(self, counter: int | None) -> None:
        if counter is not None:
            self._counter = counter
        self._digest = self.snapshot().digest
        self._changed()

    async def apply(self, snapshot: SecuritySnapshot) -> bool:
        """Take a pulled snapshot if it is a newer cluster-wide version than this
        broker's; InvalidRequest (nothing changed) if it is malformed."""
        if snapshot.counter < 1 or (snapshot.counter, snapshot.digest) <= self.version():
            return False
        check_snapshot(snapshot)
        users = users_of(snapshot)
        acl_rows = sorted({acl_key(e) for e in snapshot.acls})
        if len(acl_rows) != len(snapshot.acls):
            raise InvalidRequest("security snapshot: an ACL entry appears twice")
        user_rows = [
            (u.name, u.salt, u.iterations, u.stored_key, u.server_key) for u in snapshot.users
        ]
        counter = snapshot.counter
        await self._gateway.call(
            lambda s: s.metadata.replace_security(user_rows, acl_rows, counter=counter)
        )
        self._auth.replace_users(users)
        self._authz.replace_entries(acl_rows)
        self._counter = counter
        self._digest = self.snapshot().digest
        if self._digest != snapshot.digest:  # an entry this version cannot read
            log.error(
                "users and ACL entries version %d: stored, but some entries were not "
                "understood (see above); this broker reports digest %x",
                counter,
                self._digest,
            )
        return True


def _acl_message(row: tuple[str, str, str, str, str, str, str]) -> AclEntryMsg:
    principal, resource_type, resource_name, pattern_type, operation, permission, host = row
    return AclEntryMsg(
        principal=principal,
        resource_type=resource_type,
        resource_name=resource_name,
        pattern_type=pattern_type,
        operation=operation,
        permission=permission,
        host=host,
    )
