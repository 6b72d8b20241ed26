"""ReplicationConfig: the `[replication]` section (a broker as a member of a replica
group, docs/design/replication.md). Off unless `group` is set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from tidemq.cluster.election import MAX_LEASE_TTL_S
from tidemq.cluster.group_keys import DEFAULT_PREFIX, GroupKeys
from tidemq.core.errors import ConfigError

__all__ = ["MAX_REPLICA_FETCH_BYTES", "ReplicationConfig"]

#: Largest chunk of log one REPLICA_FETCH answer carries.
MAX_REPLICA_FETCH_BYTES: Final = 64 << 20


@dataclass(frozen=True, kw_only=True)
class ReplicationConfig:
    #: The replica group this broker is a member of ("" = replication off). The group's
    #: leader serves clients under this name.
    group: str = ""
    #: etcd endpoints (http://HOST:PORT), the group's controller.
    etcd: tuple[str, ...] = ()
    #: The replication listener's port (followers fetch there; published in etcd with
    #: the leader record); 0: any free port.
    port: int = 0
    #: Key prefix in etcd, so that clusters can share one.
    etcd_prefix: str = DEFAULT_PREFIX
    #: Members (leader included) that must hold a record durably before it is
    #: acknowledged; while fewer are in sync, writes are refused (NotEnoughReplicas).
    min_insync_replicas: int = 2
    #: The leader's lease in etcd: how long a dead or cut-off leader keeps the group
    #: without one.
    lease_ttl_s: int = 2
    #: A follower that has not reached the leader's log end for this long leaves the
    #: in-sync set (and rejoins once it has).
    replica_lag_max_ms: int = 10_000
    #: Largest chunk a follower asks for, and how long the leader holds a fetch that
    #: has nothing new.
    fetch_max_bytes: int = 4 << 20
    fetch_wait_ms: int = 500
    #: Longest an append waits for the in-sync set before it fails (NotEnoughReplicas;
    #: the record stays in the leader's log, and an idempotent retry is deduplicated).
    ack_timeout_ms: int = 30_000
    #: Let a member outside the in-sync set become leader (it may lack acknowledged
    #: records: they would be lost). Off: the group waits for an in-sync member.
    unclean_election: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.group)

    def __post_init__(self) -> None:
        if not self.group:
            return
        GroupKeys(self.group, self.etcd_prefix)  # validates both
        if not self.etcd:
            raise ConfigError(f"replication.group {self.group!r} needs replication.etcd")
        if not 1 <= self.min_insync_replicas <= 16:
            raise ConfigError(
                f"replication.min_insync_replicas must be 1-16, got {self.min_insync_replicas}"
            )
        if not 1 <= self.lease_ttl_s <= MAX_LEASE_TTL_S:
            raise ConfigError(f"replication.lease_ttl_s must be 1-{MAX_LEASE_TTL_S}")
        if not 1 << 16 <= self.fetch_max_bytes <= MAX_REPLICA_FETCH_BYTES:
            raise ConfigError(
                f"replication.fetch_max_bytes must be 64 KiB-{MAX_REPLICA_FETCH_BYTES >> 20} MiB"
            )
        for name in ("replica_lag_max_ms", "fetch_wait_ms", "ack_timeout_ms"):
            if not 1 <= getattr(self, name) <= 3_600_000:
                raise ConfigError(f"replication.{name} must be 1 ms to 1 hour")
