"""Authenticated cluster membership: brokers sign their registrations with the cluster
secret, name servers that know the secret refuse any registration not signed with it
(issue 16: a `RegisterBrokerRequest` naming another address, sent to a name server's
client port, hijacked the routes; an `UnregisterBrokerRequest` made topics vanish).

The secret comes from the environment of `tidemq namesrv` and `tidemq broker`
(`TIDEMQ_CLUSTER_SECRET`, never a flag or a file: a flag shows in `ps`). The signature is
HMAC-SHA256 over a canonical encoding of everything the request claims (kind, broker name,
address, creation time, topics and queues) and the signer's wall-clock time, which must be
within `SIGNATURE_MAX_AGE_MS` of the name server's. A replay inside that window repeats
exactly what the broker itself said (its own registration, or its own unregistration at
shutdown): it changes nothing an attacker chooses. Pure: no I/O; the time is passed in.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from typing import Final

import msgspec

from tidemq.core.errors import AuthenticationFailed, ConfigError
from tidemq.protocol.commands import RegisterBrokerRequest, UnregisterBrokerRequest

__all__ = [
    "CLUSTER_SECRET_ENV",
    "MIN_SECRET_BYTES",
    "SIGNATURE_MAX_AGE_MS",
    "check_secret",
    "registration_fields",
    "sign",
    "unregistration_fields",
    "verify",
]

#: The environment variable `tidemq namesrv` and `tidemq broker` read the secret from.
CLUSTER_SECRET_ENV: Final = "TIDEMQ_CLUSTER_SECRET"
#: How far a registration's signing time may be from the name server's clock (either
#: way: the clocks of two machines differ a little).
SIGNATURE_MAX_AGE_MS: Final = 60_000
#: A shorter secret is refused at start (HMAC keys shorter than this are guessable).
MIN_SECRET_BYTES: Final = 16

_ENCODER = msgspec.msgpack.Encoder()


def check_secret(secret: str) -> bytes:
    """The secret as a key; ConfigError for one too short."""
    key = secret.encode()
    if len(key) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"TIDEMQ_CLUSTER_SECRET must be at least {MIN_SECRET_BYTES} bytes, got {len(key)}"
        )
    return key


def registration_fields(request: RegisterBrokerRequest) -> list[object]:
    """What a registration claims, in the signed order."""
    topics = [[t, total, kind, list(queues)] for t, total, kind, queues in request.topics]
    fields: list[object] = [request.broker_name, request.address, request.created_ms, topics]
    if request.static_topics:
        fields.append(msgspec.to_builtins(request.static_topics))
    if request.epoch:  # a versioned registration or delta (cluster/topic_journal.py)
        fields += [request.epoch, request.version, request.base_version, request.removed]
    if request.security_counter or request.security_digest:  # docs/adr/0015
        fields += ["security", request.security_counter, request.security_digest]
    if request.leader_epoch:  # a replica group's leader
        fields += ["leader_epoch", request.leader_epoch]
    if request.writer_term:  # docs/adr/0020
        fields += ["writer_term", request.writer_term]
    return fields


def unregistration_fields(request: UnregisterBrokerRequest) -> list[object]:
    """What an unregistration claims, in the signed order."""
    fields: list[object] = [request.broker_name]
    if request.leader_epoch:  # a replica group's leader
        fields += ["leader_epoch", request.leader_epoch]
    return fields


def _message(kind: str, fields: Sequence[object], signed_ms: int) -> bytes:
    return _ENCODER.encode(["tidemq-membership-v1", kind, *fields, signed_ms])


def sign(key: bytes, kind: str, fields: Sequence[object], *, now_ms: int) -> tuple[int, bytes]:
    """(signing time, signature) for a request of `kind` claiming `fields`."""
    return now_ms, hmac.new(key, _message(kind, fields, now_ms), hashlib.sha256).digest()


def verify(
    key: bytes,
    kind: str,
    fields: Sequence[object],
    *,
    signed_ms: int,
    signature: bytes,
    now_ms: int,
) -> None:
    """Raise AuthenticationFailed unless `signature` is the secret's over these fields,
    made within SIGNATURE_MAX_AGE_MS of `now_ms`."""
    if not signature:
        raise AuthenticationFailed(
            f"{kind} refused: this name server accepts only brokers that sign their "
            "registration with the cluster secret (set TIDEMQ_CLUSTER_SECRET for the broker)"
        )
    expected = hmac.new(key, _message(kind, fields, signed_ms), hashlib.sha256).digest()
    if not hmac.compare_digest(expected, signature):
        raise AuthenticationFailed(f"{kind} refused: bad signature (not the cluster secret)")
    if abs(now_ms - signed_ms) > SIGNATURE_MAX_AGE_MS:
        raise AuthenticationFailed(
            f"{kind} refused: signed {abs(now_ms - signed_ms) / 1000:.0f} s away from this "
            f"name server's clock (at most {SIGNATURE_MAX_AGE_MS // 1000} s; check the clocks)"
        )
