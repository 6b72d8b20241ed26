"""Where a replica group's state lives in etcd, and how its values are encoded. Pure.

Key layout, per broker group NAME (a user name, `tidemq.core.names`), under a prefix that
is `/tidemq` unless configured (so that several clusters can share one etcd)::

    <prefix>/groups/<NAME>/leader    JSON {"epoch": E, "member": M, "address": A}
                                     attached to the leader's lease: it disappears when
                                     the lease expires or is revoked
    <prefix>/groups/<NAME>/epoch     JSON integer E: the newest epoch ever granted; written
                                     only by the transaction that creates `leader`, never
                                     deleted, so it never goes back
    <prefix>/groups/<NAME>/in_sync   JSON {"epoch": E, "members": [M, ...]} (sorted, unique):
                                     written only by the leader of epoch E

JSON rather than msgpack so that `etcdctl get --prefix /tidemq/` shows an operator what a
group is doing. Values read back are checked (`CorruptMetadata` names the key), because
anything with access to etcd can write them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import msgspec

from tidemq.core.errors import ConfigError, TidemqError
from tidemq.core.names import MEMBER_PATTERN, NAME_RULE, is_user_name

__all__ = [
    "DEFAULT_PREFIX",
    "CorruptMetadata",
    "GroupKeys",
    "InSyncRecord",
    "LeaderRecord",
    "check_member",
    "decode_epoch",
    "decode_in_sync",
    "decode_leader",
    "encode_epoch",
    "encode_in_sync",
    "encode_leader",
]

DEFAULT_PREFIX: Final = "/tidemq"
_MEMBER: Final = re.compile(MEMBER_PATTERN)


class CorruptMetadata(TidemqError):
    """A value in etcd that is not what tidemq writes there; the message names the key."""


class LeaderRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Who leads a group, under which epoch. Epochs start at 1."""

    epoch: int
    member: str
    #: Where the leader serves clients (host:port).
    address: str
    #: Where the leader serves its followers' REPLICA_FETCH (host:port; "" when the
    #: member does not replicate a log, as in the election's own tests).
    replication_address: str = ""


class InSyncRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The members that hold every acknowledged record, as set by the leader of `epoch`."""

    epoch: int
    members: tuple[str, ...]


@dataclass(frozen=True)
class GroupKeys:
    """The etcd keys of one replica group."""

    group: str
    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not is_user_name(self.group):
            raise ConfigError(f"broker group name {self.group!r}: {NAME_RULE}")
        if not self.prefix.startswith("/") or self.prefix.endswith("/"):
            raise ConfigError(f"etcd prefix {self.prefix!r}: must start and not end with '/'")

    @property
    def leader(self) -> bytes:
        return f"{self.prefix}/groups/{self.group}/leader".encode()

    @property
    def epoch(self) -> bytes:
        return f"{self.prefix}/groups/{self.group}/epoch".encode()

    @property
    def in_sync(self) -> bytes:
        return f"{self.prefix}/groups/{self.group}/in_sync".encode()

    @property
    def preferred(self) -> bytes:
        """During a handover (`tidemq cluster elect`): the member that is to lead next,
        on a short lease; while it exists no other member campaigns."""
        return f"{self.prefix}/groups/{self.group}/preferred".encode()


def check_member(member: str) -> str:
    if _MEMBER.fullmatch(member) is None:
        raise ConfigError(f"member id {member!r}: expected {MEMBER_PATTERN}")
    return member


def encode_leader(record: LeaderRecord) -> bytes:
    return msgspec.json.encode(record)


def decode_leader(key: bytes, value: bytes) -> LeaderRecord:
    try:
        record = msgspec.json.decode(value, type=LeaderRecord)
    except msgspec.DecodeError as error:
        raise CorruptMetadata(f"etcd key {key.decode()}: not a leader record: {error}") from None
    if record.epoch < 1:
        raise CorruptMetadata(f"etcd key {key.decode()}: epoch {record.epoch} < 1")
    return record


def encode_epoch(epoch: int) -> bytes:
    assert epoch >= 1, epoch
    return msgspec.json.encode(epoch)


def decode_epoch(key: bytes, value: bytes) -> int:
    try:
        epoch = msgspec.json.decode(value, type=int)
    except msgspec.DecodeError as error:
        raise CorruptMetadata(f"etcd key {key.decode()}: not an epoch: {error}") from None
    if epoch < 1:
        raise CorruptMetadata(f"etcd key {key.decode()}: epoch {epoch} < 1")
    return epoch


def encode_in_sync(record: InSyncRecord) -> bytes:
    assert list(record.members) == sorted(set(record.members)), record.members
    return msgspec.json.encode(record)


def decode_in_sync(key: bytes, value: bytes) -> InSyncRecord:
    try:
        record = msgspec.json.decode(value, type=InSyncRecord)
    except msgspec.DecodeError as error:
        raise CorruptMetadata(f"etcd key {key.decode()}: not an in-sync record: {error}") from None
    if list(record.members) != sorted(set(record.members)):
        raise CorruptMetadata(f"etcd key {key.decode()}: members not sorted and unique")
    return record
