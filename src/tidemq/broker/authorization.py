"""Who may do what: the ACL entries the broker keeps, and the check every request passes
before its handler runs (with `broker.authorization_enabled`; docs/design/security.md
sections 2 and 4), by the table of what each request code needs (`request_permissions`).

List requests filter instead of refusing (Kafka's rule): LIST_TOPICS, LIST_GROUPS and
GET_ROUTES (for every topic or named ones) answer with what the principal may describe,
so a topic the principal may not describe looks like one that does not exist.

The refusal a client sees names the operation and the resource, never the entries; the
decision's full reason goes to the audit log (rate-limited per kind of refusal).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from tidemq.broker.request_permissions import (
    ACL_CODES,
    FILTERED_CODES,
    REQUEST_ACLS,
    Rule,
    txn_ids,
)
from tidemq.core.acl import AclEntry, Authorizer, Operation, Requirement, ResourceType
from tidemq.core.clock import Clock
from tidemq.core.errors import AuthorizationFailed, InvalidRequest
from tidemq.core.limits import MAX_ACL_ENTRIES
from tidemq.core.log_limit import RateLimitedLog
from tidemq.protocol.acl_messages import (
    AclCreateRequest,
    AclDeleteRequest,
    AclEntryMsg,
    AclListRequest,
    AclListResponse,
    AclsChangedResponse,
    acl_message,
    entry_of,
)
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import GetRoutesResponse, ListGroupsResponse, ListTopicsResponse

__all__ = [
    "ACL_CODES",
    "FILTERED_CODES",
    "REQUEST_ACLS",
    "Authorization",
    "Rule",
    "entry_of",
]

log = logging.getLogger("tidemq.audit")

#: One line per kind of refusal per interval in the audit log.
AUDIT_LOG_INTERVAL_MS: Final = 10_000
#: Entries one ACL_CREATE or ACL_DELETE may carry.
MAX_ACLS_PER_REQUEST: Final = 1_000

#: An entry as the metadata stores it (`_row`).
AclRow = tuple[str, str, str, str, str, str, str]

_T, _G = ResourceType.TOPIC, ResourceType.GROUP
_READ, _WRITE, _DESCRIBE = Operation.READ, Operation.WRITE, Operation.DESCRIBE


def _row(entry: AclEntry) -> AclRow:
    m = acl_message(entry)
    return (
        m.principal,
        m.resource_type,
        m.resource_name,
        m.pattern_type,
        m.operation,
        m.permission,
        m.host,
    )


class Authorization:
    """The broker's ACL entries and the check of each request (one per broker, on its
    loop). `enabled` is broker.authorization_enabled; the ACL requests work either way
    (entries may be prepared before authorization is turned on)."""

    def __init__(
        self,
        *,
        enabled: bool,
        super_users: Iterable[str],
        rows: Iterable[Sequence[str]],
        save: Callable[[list[AclRow], int | None], Any],
        remove: Callable[[list[AclRow], int | None], Any],
        txn_groups: Callable[[Sequence[str]], list[str]],
        clock: Clock,
    ) -> None:
        self.enabled = enabled
        self._super = frozenset(super_users)
        self._save = save
        self._remove = remove
        self._txn_groups = txn_groups
        self._audit = RateLimitedLog(log, clock, interval_ms=AUDIT_LOG_INTERVAL_MS)
        self._entries: set[AclEntry] = set()
        self._load(rows)
        self._authorizer = self._build()
        #: Bumped at each change of the entries (see `route_token`).
        self._version = 0
        #: The users' and ACLs' next version counter, asked before each change (the
        #: broker's SecuritySync, ADR 15); None: the change carries no counter.
        self.next_counter: Callable[[], int | None] = lambda: None
        #: Called after each change of the entries, with the counter it carried.
        self.on_change: Callable[[int | None], None] = lambda _: None

    def _load(self, rows: Iterable[Sequence[str]]) -> None:
        for row in rows:
            principal, resource_type, resource_name, pattern_type, operation, permission, host = row
            try:
                self._entries.add(
                    entry_of(
                        AclEntryMsg(
                            principal=principal,
                            resource_type=resource_type,
                            resource_name=resource_name,
                            operation=operation,
                            permission=permission,
                            pattern_type=pattern_type,
                            host=host,
                        )
                    )
                )
            except InvalidRequest as exc:  # written by an older version, or by hand
                log.error("ignoring a stored ACL entry: %s", exc)

    def rows(self) -> list[AclRow]:
        """Every entry as stored, sorted."""
        return sorted(_row(e) for e in self._entries)

    def replace_entries(self, rows: Iterable[Sequence[str]]) -> None:
        """Take another version of the entries (written to the store by the caller)."""
        self._entries = set()
        self._load(rows)
        self._authorizer = self._build()
        self._version += 1

    def _build(self) -> Authorizer:
        return Authorizer(self._entries, super_users=self._super)

    # ------------------------------------------------------------------ checks

    def check(self, code: RequestCode, header: Any, principal: str | None, host: str) -> None:
        """Raise AuthorizationFailed unless `principal` may make this request."""
        if not self.enabled:
            return
        if principal is None:  # authentication is on whenever authorization is (config)
            raise AuthorizationFailed(f"{code.name} refused: not logged in")
        for rule in REQUEST_ACLS[code]:
            names = rule.names(header)
            if rule.names is txn_ids:
                names = self._txn_groups(list(names))
            for resource in sorted(set(names)):
                self._check_one(code, principal, host, rule.requirement, resource)

    def _check_one(
        self, code: RequestCode, principal: str, host: str, req: Requirement, resource: str
    ) -> None:
        decision = self._authorizer.authorize(
            principal, host, req.operation, req.resource_type, resource
        )
        if decision.allowed:
            return
        self._audit.log(
            logging.WARNING,
            f"denied-{code.name}",
            "denied %s from %s: %s (%s)",
            principal,
            host,
            code.name,
            decision.reason,
        )
        raise AuthorizationFailed(
            f"{principal} may not {req.operation.name} {req.resource_type.value} "
            f"{resource!r} ({code.name})"
        )

    def check_cancel(self, principal: str | None, host: str, topic: str) -> None:
        """CANCEL_DELAYED of a message of `topic`: WRITE on it, as its send needed."""
        if not self.enabled:
            return
        if principal is None:
            raise AuthorizationFailed("CANCEL_DELAYED refused: not logged in")
        requirement = Requirement(_WRITE, _T)
        self._check_one(RequestCode.CANCEL_DELAYED, principal, host, requirement, topic)

    def check_read(self, code: RequestCode, principal: str | None, host: str, topic: str) -> None:
        """READ on `topic`, for a request whose topic is known only once it is read (a
        delayed or transactional message looked up by its id)."""
        if not self.enabled:
            return
        if principal is None:
            raise AuthorizationFailed(f"{code.name} refused: not logged in")
        self._check_one(code, principal, host, Requirement(_READ, _T), topic)

    def may_describe(self, principal: str | None, host: str, kind: ResourceType, name: str) -> bool:
        if not self.enabled:
            return True
        if principal is None:
            return False
        return self._authorizer.authorize(principal, host, _DESCRIBE, kind, name).allowed

    def filter(
        self, code: RequestCode, header: Any, answer: Any, principal: str | None, host: str
    ) -> Any:
        """The answer of a list request, cut to what the principal may describe."""
        if not self.enabled:
            return answer

        def visible(kind: ResourceType, name: str) -> bool:
            return self.may_describe(principal, host, kind, name)

        if code is RequestCode.LIST_TOPICS and isinstance(answer, ListTopicsResponse):
            answer.topics = [t for t in answer.topics if visible(_T, t.name)]
        elif code is RequestCode.LIST_GROUPS and isinstance(answer, ListGroupsResponse):
            answer.groups = [g for g in answer.groups if visible(_G, g)]
        elif code is RequestCode.GET_ROUTES and isinstance(answer, GetRoutesResponse):
            answer.routes = [r for r in answer.routes if visible(_T, r.topic)]
            if header.topics is not None:  # named ones: say which are refused
                answer.denied = [t for t in dict.fromkeys(header.topics) if not visible(_T, t)]
        return answer

    def route_token(self, token: int, principal: str | None, host: str) -> int:
        """A GET_ROUTES generation as this principal sees it, and back (the same call):
        its answers are cut to what it may describe, so "unchanged since this token" must
        also mean the same ACLs. The name server's token XOR a mask of the ACLs' version,
        the principal and its host; 0 (none) stays 0."""
        if token == 0:
            return 0
        who = f"{self._version}\0{principal or ''}\0{host}".encode()
        mask = int.from_bytes(hashlib.blake2b(who, digest_size=8).digest(), "big") >> 1
        return token ^ mask

    # ------------------------------------------------------------------ management

    def create(self, req: AclCreateRequest) -> AclsChangedResponse:
        entries = self._entries_of(req.entries)
        new = [e for e in dict.fromkeys(entries) if e not in self._entries]
        if len(self._entries) + len(new) > MAX_ACL_ENTRIES:
            raise InvalidRequest(
                f"at most {MAX_ACL_ENTRIES} ACL entries in a cluster ({len(self._entries)} now)"
            )
        if new:
            counter = self.next_counter()
            self._save([_row(e) for e in new], counter)
            self._entries.update(new)
            self._authorizer = self._build()
            self._version += 1
            self.on_change(counter)
        return AclsChangedResponse(changed=len(new))

    def delete(self, req: AclDeleteRequest) -> AclsChangedResponse:
        entries = self._entries_of(req.entries)
        gone = [e for e in dict.fromkeys(entries) if e in self._entries]
        if gone:
            counter = self.next_counter()
            self._remove([_row(e) for e in gone], counter)
            self._entries.difference_update(gone)
            self._authorizer = self._build()
            self._version += 1
            self.on_change(counter)
        return AclsChangedResponse(changed=len(gone))

    def listed(self, req: AclListRequest) -> AclListResponse:
        kind = req.resource_type.lower()
        entries = sorted(
            (
                e
                for e in self._entries
                if (not req.principal or e.principal == req.principal)
                and (not kind or e.resource_type.value == kind)
            ),
            key=_row,
        )
        return AclListResponse(entries=[acl_message(e) for e in entries])

    @staticmethod
    def _entries_of(messages: list[AclEntryMsg]) -> list[AclEntry]:
        if not messages:
            raise InvalidRequest("no ACL entry given")
        if len(messages) > MAX_ACLS_PER_REQUEST:
            raise InvalidRequest(f"at most {MAX_ACLS_PER_REQUEST} ACL entries per request")
        return [entry_of(m) for m in messages]
