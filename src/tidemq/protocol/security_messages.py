"""Users and ACL entries shared by the brokers of a cluster (docs/adr/0015): the
snapshot that travels, its version, and the two requests that move it.

* SECURITY_PUSH (140), broker -> name server: "here are my tables" (when the name server's
  registration answer asks for them: the broker's version is newer than what it holds),
  or, with `writer_term`, the security writer's confirmation of a change it made: it
  answers the change's client only once a majority of the name servers accepted it
  (docs/adr/0026).
* SECURITY_PULL (141), broker -> name server: "give me the tables you hold" (when the
  registration answer names a newer version than the broker's).

A version is (counter, digest), compared as a pair: the counter grows by one at each
change the cluster's writer makes; the digest is `snapshot_digest` of the tables, so two
tables with the same version are the same tables, and two writers that both made change
N (a failover) still order one above the other: every broker and name server ends on the
same one. Counter 0 is a broker's own tables before any cluster-wide change (a bootstrap
user, tables from before this version): name servers keep them for logins, brokers never
pull them.

Both requests are signed with the cluster secret like REGISTER_BROKER
(`cluster/membership.py`): the push over (counter, digest), which the name server checks
against the tables it carries; the pull over the broker's name. Fields only ever added at
the end.

Writer terms (docs/adr/0020): the counter's high bits are the term of the writer that
made the change (`counter_of(term, seq)`), so comparing counters compares terms first:
whatever a writer makes under a newer term orders above anything a deposed writer made
under an older one, whatever their sequence numbers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Final

import msgspec

from tidemq.protocol.acl_messages import AclEntryMsg
from tidemq.protocol.codes import RequestCode

__all__ = [
    "CLUSTER_MECHANISM",
    "SECURITY_REQUESTS",
    "TERM_SHIFT",
    "ClusterLogin",
    "SecurityPullRequest",
    "SecurityPushRequest",
    "SecurityPushResponse",
    "SecuritySnapshot",
    "UserRow",
    "acl_key",
    "counter_of",
    "counter_text",
    "snapshot_digest",
    "term_of",
]

#: The SASL mechanism with which a broker logs in to a name server that requires logins:
#: one SASL_AUTHENTICATE whose message is a `ClusterLogin`, signed with the cluster secret.
CLUSTER_MECHANISM: Final = "TIDEMQ-CLUSTER-HMAC-SHA256"


#: Bits of a counter below its writer term: 2**32 changes per term, far beyond any
#: cluster's (a change is an operator's act), and terms up to 2**31 fit a signed 64-bit
#: integer (SQLite, msgpack).
TERM_SHIFT: Final = 32
_SEQ_MASK: Final = (1 << TERM_SHIFT) - 1


def counter_of(term: int, seq: int) -> int:
    """The counter of change `seq` of a writer holding `term` (seq 0: the term's floor)."""
    assert term >= 0, term
    assert 0 <= seq <= _SEQ_MASK, seq
    return (term << TERM_SHIFT) | seq


def term_of(counter: int) -> int:
    """The writer term a counter was made under (0: before terms, or a broker's own
    tables before any cluster-wide change)."""
    return counter >> TERM_SHIFT


def counter_text(counter: int) -> str:
    """A counter as people read it: "<term>.<change within the term>"."""
    return f"{term_of(counter)}.{counter & _SEQ_MASK}"


class _Msg(msgspec.Struct, kw_only=True, omit_defaults=True):
    pass


class UserRow(_Msg):
    """One user's SCRAM credentials, as the broker stores them (never a password)."""

    name: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


class SecuritySnapshot(_Msg):
    """Every user and ACL entry of one version, users by name, entries by `acl_key`."""

    counter: int = 0
    digest: int = 0
    users: list[UserRow] = msgspec.field(default_factory=list)
    acls: list[AclEntryMsg] = msgspec.field(default_factory=list)


class SecurityPushRequest(_Msg):
    broker_name: str
    snapshot: SecuritySnapshot
    #: As for RegisterBrokerRequest (membership.py), over (counter, digest) and, when
    #: set, `writer_term`.
    signed_ms: int = 0
    signature: bytes = b""
    #: 0: a copy of the tables (the name server asked for them). Else the writer term
    #: the pushing broker holds: a writer's confirmation of a change it made, which
    #: the name server accepts only from the broker holding that term there, and only
    #: if it holds no newer tables (docs/adr/0026).
    writer_term: int = 0


class SecurityPushResponse(_Msg):
    #: False: the name server holds this version or a newer one already. (A writer's
    #: confirmation is refused with an error instead; any answer confirms it.)
    accepted: bool = True


class SecurityPullRequest(_Msg):
    broker_name: str
    #: As for RegisterBrokerRequest (membership.py), over the broker's name.
    signed_ms: int = 0
    signature: bytes = b""


class ClusterLogin(_Msg):
    """A broker's login to a name server (the SASL_AUTHENTICATE message, msgpack), signed
    with the cluster secret over its name. It lifts the pre-login frame limit of that
    connection; every registration and push on it is still signed on its own."""

    broker_name: str
    signed_ms: int
    signature: bytes


def acl_key(entry: AclEntryMsg) -> tuple[str, str, str, str, str, str, str]:
    """An entry's sort key and identity (the `acls` table's primary key)."""
    return (
        entry.principal,
        entry.resource_type,
        entry.resource_name,
        entry.pattern_type,
        entry.operation,
        entry.permission,
        entry.host,
    )


_ENCODER = msgspec.msgpack.Encoder()


def snapshot_digest(users: Iterable[UserRow], acls: Iterable[AclEntryMsg]) -> int:
    """A positive 63-bit digest of the tables (SHA-256 over their sorted rows, in
    msgpack; order-independent: rows are sorted first). Fits SQLite's and msgpack's
    signed 64-bit integers."""
    rows = [
        sorted((u.name, u.salt, u.iterations, u.stored_key, u.server_key) for u in users),
        sorted(acl_key(e) for e in acls),
    ]
    digest = hashlib.sha256(_ENCODER.encode(["tidemq-security-v1", rows])).digest()
    return (int.from_bytes(digest[:8], "big") >> 1) | 1


SECURITY_REQUESTS: Final[dict[RequestCode, tuple[type[msgspec.Struct], type[msgspec.Struct]]]] = {
    RequestCode.SECURITY_PUSH: (SecurityPushRequest, SecurityPushResponse),
    RequestCode.SECURITY_PULL: (SecurityPullRequest, SecuritySnapshot),
}
