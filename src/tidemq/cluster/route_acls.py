"""Routes cut by the ACLs on a standalone name server (`tidemq namesrv` with
`broker.authorization_enabled`), as a broker cuts them (broker/authorization.py): a
principal learns the route of a topic only if it may describe it (READ, WRITE, DELETE and
ALTER imply DESCRIBE, core/acl.py), so a topic it may not see looks like one that does
not exist; a query naming such topics is told which (`denied`).

The entries are those of the users and ACL tables the brokers push (security_holder.py);
the authorizer is rebuilt when that version changes. The cluster's brokers (logged in with
the cluster secret, `Broker:<name>`) see every route: they look up queue counts and
the live brokers. CLUSTER_STATUS needs DESCRIBE on the cluster, as on a broker.

Not thread-safe. No I/O.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable

from tidemq.cluster.security_holder import SecurityHolder, Version
from tidemq.cluster.security_link import BROKER_PRINCIPAL_PREFIX
from tidemq.core.acl import CLUSTER_NAME, AclEntry, Authorizer, Operation, ResourceType
from tidemq.core.errors import AuthorizationFailed, InvalidRequest
from tidemq.protocol.acl_messages import entry_of
from tidemq.protocol.commands import GetRoutesRequest, GetRoutesResponse

__all__ = ["RouteAcls"]

log = logging.getLogger(__name__)


class RouteAcls:
    def __init__(self, holder: SecurityHolder, *, super_users: Iterable[str]) -> None:
        """`super_users`: principals (`User:<name>`) allowed everything."""
        self._holder = holder
        self._super = frozenset(super_users)
        self._built_for: Version | None = None
        self._authorizer = Authorizer((), super_users=self._super)

    def _current(self) -> Authorizer:
        held = self._holder.held
        if held != self._built_for:
            entries: list[AclEntry] = []
            for msg in self._holder.snapshot.acls:
                try:
                    entries.append(entry_of(msg))
                except InvalidRequest as exc:  # written by a newer version
                    log.error("route filter: ignoring an ACL entry: %s", exc)
            self._authorizer = Authorizer(entries, super_users=self._super)
            self._built_for = held
        return self._authorizer

    def may_describe(self, principal: str | None, host: str, topic: str) -> bool:
        if principal is None:
            return False
        if principal.startswith(BROKER_PRINCIPAL_PREFIX):
            return True
        decision = self._current().authorize(
            principal, host, Operation.DESCRIBE, ResourceType.TOPIC, topic
        )
        return decision.allowed

    def check_status(self, principal: str | None, host: str) -> None:
        """CLUSTER_STATUS needs DESCRIBE on the cluster, as on a broker."""
        if principal is not None and principal.startswith(BROKER_PRINCIPAL_PREFIX):
            return
        allowed = principal is not None and (
            self._current()
            .authorize(principal, host, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME)
            .allowed
        )
        if not allowed:
            raise AuthorizationFailed(
                f"{principal} may not DESCRIBE cluster {CLUSTER_NAME!r} (CLUSTER_STATUS)"
            )

    def token(self, token: int, principal: str | None, host: str) -> int:
        """A route generation as this principal sees it, and back (the same call): its
        answers are cut by the ACLs, so "unchanged since this token" must also mean the
        same tables, principal and host. 0 (none) stays 0."""
        if token == 0:
            return 0
        counter, digest = self._holder.held
        who = f"{counter}\0{digest}\0{principal or ''}\0{host}".encode()
        mask = int.from_bytes(hashlib.blake2b(who, digest_size=8).digest(), "big") >> 1
        return token ^ mask

    def filter(
        self, header: GetRoutesRequest, answer: GetRoutesResponse, principal: str | None, host: str
    ) -> GetRoutesResponse:
        """The answer cut to the topics the principal may describe."""
        answer.routes = [r for r in answer.routes if self.may_describe(principal, host, r.topic)]
        if header.topics is not None:
            answer.denied = [
                t for t in dict.fromkeys(header.topics) if not self.may_describe(principal, host, t)
            ]
        answer.generation = self.token(answer.generation, principal, host)
        return answer
