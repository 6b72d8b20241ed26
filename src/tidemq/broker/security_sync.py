"""The broker's users and ACL entries as the cluster's (ADR 15), changed by one fenced
writer (ADR 20).

The tables have a version (counter, digest; protocol/security_messages.py). Only the
cluster's security writer changes them: each change carries the next counter, written in
the same SQLite transaction as the change. Every registration reports the version; a
broker whose name server holds a newer one pulls it and replaces both tables in one
transaction (`Metadata.replace_security`), then its login and ACL caches
(`Authenticator`, `Authorization`) at once, so deletions and password changes converge
like additions.

The writer is fenced by a term (ADR 20). The name servers grant the role with a term
(cluster/writer_terms.py), and each registration answer renews this broker's lease on it
for the name server's broker TTL, counted from when the registration was sent. A change
is made only while a majority of the name servers hold a live lease for this broker,
and its counter carries the term in its high bits, so anything a newer writer makes
orders above anything made under an older term. A writer paused (SIGSTOP, a VM pause)
or cut off finds its lease run out on its own clock when it resumes, before it has
heard of a newer writer, and refuses the change (WriterFenced); a name server refuses
tables written under an older term than those it holds, and the deposed broker then
takes the newer tables. With an embedded name server (`tidemq server`) the broker is the
cluster: no lease is needed.

The writer also refuses a change while it knows of a newer version than its own (it
would build on old tables): the client is told to retry (BrokerNotAvailable) and the
next beat catches it up.

A change is answered only once confirmed (ADR 26): after it is committed here, `confirm`
pushes the tables, under the writer's term, to every name server at once, and returns
once a majority of them hold them under that term. A name server confirms only for the
broker holding that term there, and every answer granting a newer term carries the
tables it holds, so the next writer starts from them. Otherwise the client is answered
ChangeUnconfirmed ("it may or may not take effect; retry"), and a change refused under a
newer term is dropped here (the name server's tables replace this broker's).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tidemq.broker.auth import Authenticator
from tidemq.broker.authorization import Authorization
from tidemq.broker.store_gateway import StoreGateway
from tidemq.cluster.security_holder import check_snapshot, users_of
from tidemq.cluster.writer_lease import WriterLeases
from tidemq.core.clock import Clock, SystemClock
from tidemq.core.errors import (
    BrokerNotAvailable,
    ChangeUnconfirmed,
    InvalidRequest,
    WriterFenced,
)
from tidemq.protocol.acl_messages import AclEntryMsg
from tidemq.protocol.security_messages import (
    SecuritySnapshot,
    UserRow,
    acl_key,
    counter_of,
    counter_text,
    snapshot_digest,
    term_of,
)

__all__ = ["Confirmer", "SecuritySync"]

#: Asks the name servers to confirm tables made under a term: [] when a majority did,
#: else why each other did not (cluster.registration.Registration.confirm).
Confirmer = Callable[[SecuritySnapshot, int], Awaitable[list[str]]]

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
        name_servers: int = 0,
        clock: Clock | None = None,
    ) -> None:
        """`address`: this broker's, to compare with the writer's. `changed`: called
        after a change made here (register now, so the name servers ask for it).
        `name_servers`: how many this broker registers with (0: an embedded one; no
        lease then). `clock`: real time for the leases (the registrations' clock)."""
        self._auth = auth
        self._authz = authz
        self._gateway = gateway
        self._changed = changed
        self._counter = gateway.store.metadata.security_counter()
        self._digest = 0
        self._digest = self.snapshot().digest
        #: The newest version a name server holds, as far as this broker knows.
        self._newest = (0, 0)
        #: The writer role as the name servers grant it (None: an embedded name server,
        #: this broker is the cluster and needs no lease).
        self._leases = (
            None
            if name_servers == 0
            else WriterLeases(address, name_servers, clock or SystemClock())
        )
        #: Set once the registration runs (None: nothing to confirm with, no lease).
        self.confirmer: Confirmer | None = None
        #: The version a majority of the name servers last confirmed, and whether a
        #: change was made here since (a broker that made none refuses as it would
        #: have before the change: nothing of its own is at stake).
        self._confirmed = (-1, 0)
        self._made_since = False
        self._confirming = asyncio.Lock()
        #: Pulls from several name servers at once take their turns (an older one
        #: finishing last must not replace a newer one).
        self._applying = asyncio.Lock()
        auth.next_counter = authz.next_counter = self.next_counter
        auth.confirm = self.confirm
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

    def seen(
        self,
        server: str,
        newest: tuple[int, int],
        writer: str,
        *,
        term: int,
        lease_until_ms: float,
    ) -> None:
        self._newest = max(self._newest, newest)
        if self._leases is not None:
            self._leases.seen(server, writer, term, lease_until_ms)

    def held_term(self) -> int:
        """The term to report (WriterLeases.claimed_term): what the name servers adopt."""
        return 0 if self._leases is None else self._leases.claimed_term()

    def behind(self) -> bool:
        """A name server holds a newer cluster-wide version than this broker's."""
        return self._newest[0] >= 1 and self._newest > self.version()

    def next_counter(self) -> int:
        """The counter of a change about to be made here. NotCoordinator if this broker
        is not the writer, WriterFenced if its lease ran out or a newer term wrote,
        BrokerNotAvailable (retriable) while it is catching up or not yet granted."""
        term = 0
        if self._leases is not None:
            term = self._leases.held_term()
            if term == 0:
                raise self._leases.refusal()
            newest_term = term_of(max(self._newest[0], self._counter))
            if newest_term > term:
                raise WriterFenced(
                    f"users and ACL entries were changed under writer term {newest_term}; "
                    f"this broker's term {term} is deposed; retry on the current writer"
                )
        if self.behind():
            raise BrokerNotAvailable(
                f"this broker is catching up with users and ACL entries version "
                f"{counter_text(self._newest[0])} (it has {counter_text(self._counter)}); retry"
            )
        return max(counter_of(term, 0), self._counter, self._newest[0]) + 1

    async def confirm(self) -> None:
        """Return once the tables as they are now are held by a majority of the name
        servers under this writer's term (ADR 26); called after every change request,
        a no-op one too (a retry must not be answered from a change never confirmed).
        ChangeUnconfirmed otherwise. Nothing to do without leases (an embedded name
        server: this broker is the cluster)."""
        if self._leases is None or self.confirmer is None:
            return
        async with self._confirming:
            version = self.version()
            if version == self._confirmed:
                return
            term = self._leases.held_term()
            if term == 0 and not self._made_since:
                raise self._leases.refusal()  # a no-op on a broker that is not the writer
            if term == 0:
                raise ChangeUnconfirmed(
                    f"users and ACL entries version {counter_text(version[0])} not confirmed: "
                    f"{self._leases.refusal()}; it may or may not take effect; retry"
                )
            refusals = await self.confirmer(self.snapshot(), term)
            if refusals:
                raise ChangeUnconfirmed(
                    f"users and ACL entries version {counter_text(version[0])} (writer term "
                    f"{term}) not confirmed by a majority of the name servers "
                    f"({'; '.join(refusals)}); it may or may not take effect; retry"
                )
            self._confirmed = max(self._confirmed, version)
            self._made_since = self.version() != version  # a change made meanwhile

    def _after_change(self, counter: int | None) -> None:
        if counter is not None:
            self._counter = counter
            self._made_since = True
        self._digest = self.snapshot().digest
        self._changed()

    async def apply(self, snapshot: SecuritySnapshot, *, replace: bool = False) -> bool:
        """Take a pulled snapshot if it is a newer cluster-wide version than this
        broker's (with `replace`: if it is another one); InvalidRequest (nothing
        changed) if it is malformed."""
        async with self._applying:
            return await self._apply(snapshot, replace=replace)

    async def _apply(self, snapshot: SecuritySnapshot, *, replace: bool) -> bool:
        pulled = (snapshot.counter, snapshot.digest)
        if snapshot.counter < 1 or pulled == self.version():
            return False
        if pulled < self.version() and not replace:
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
        self._made_since = False  # whatever was made here is replaced
        self._digest = self.snapshot().digest
        if self._digest != snapshot.digest:  # an entry this version cannot read
            log.error(
                "users and ACL entries version %s: stored, but some entries were not "
                "understood (see above); this broker reports digest %x",
                counter_text(counter),
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
