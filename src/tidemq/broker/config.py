"""BrokerConfig: the broker's settings (it nests the store's), validated once, frozen.

Only `tidemq.cli` reads files and the environment; everything else receives one of these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from tidemq.broker.replication_config import ReplicationConfig
from tidemq.cluster.nameserver import DEFAULT_STALE_TOPIC_MS
from tidemq.core.errors import ConfigError
from tidemq.core.limits import (
    NET_FRAME_READ_TIMEOUT_MS,
    NET_IDLE_TIMEOUT_MS,
    NET_LOGIN_TIMEOUT_MS,
    NET_MAX_CONNECTIONS_PER_ADDRESS,
    NET_MAX_INBOUND_BYTES,
    NET_MAX_RESPONSE_BYTES,
    NET_MAX_RESPONSE_BYTES_PER_ADDRESS,
    NET_MAX_RESPONSE_BYTES_PER_CONNECTION,
    NET_REQUESTS_PER_TURN,
    NET_WRITE_BUFFER_HIGH_BYTES,
    NET_WRITE_STALL_TIMEOUT_MS,
)
from tidemq.net.tls import TlsClientAuth
from tidemq.store.config import StoreConfig
from tidemq.tiered.config import TieredConfig

__all__ = ["FRAME_OVERHEAD_BYTES", "BrokerConfig"]

#: Room for a frame's prefix and header on top of the largest batch.
FRAME_OVERHEAD_BYTES = 64 << 10
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _default_store() -> StoreConfig:
    return StoreConfig(data_dir=Path("data"))


@dataclass(frozen=True, kw_only=True)
class BrokerConfig:
    broker_name: str = "broker-0"
    host: str = "127.0.0.1"
    #: 10911 for a broker alone (RocketMQ's listenPort); `tidemq server` uses 9876.
    port: int = 10911
    #: What clients should dial; defaults to host:port as bound.
    advertised_address: str | None = None
    #: Name servers to register with; empty when the name server runs in this process.
    name_servers: tuple[str, ...] = ()
    auto_create_topics: bool = False
    default_queues: int = 8
    #: Largest batch a producer may send (Kafka's message.max.bytes).
    max_message_bytes: int = 4 << 20
    #: Largest fetch answer.
    max_fetch_bytes: int = 16 << 20
    #: Longest a fetch may park waiting for data.
    max_fetch_wait_ms: int = 30_000
    #: Parked fetches over all connections.
    max_parked_fetches: int = 100_000
    max_in_flight_requests: int = 32
    max_connections: int = 1024
    #: Connection limits (the table is in docs/design/protocol.md, "Connection limits";
    #: tidemq.core.limits gives the reason for each default). Connections from one IP address
    #: (at most max_connections).
    max_connections_per_address: int = NET_MAX_CONNECTIONS_PER_ADDRESS
    #: A frame begun must be complete within this; nothing in flight for this long closes
    #: a connection (a parked fetch is in flight); a write buffer that does not shrink
    #: for this long closes it.
    frame_read_timeout_ms: int = NET_FRAME_READ_TIMEOUT_MS
    connection_idle_timeout_ms: int = NET_IDLE_TIMEOUT_MS
    #: With auth_enabled: a connection not logged in this long after it opened is closed.
    login_timeout_ms: int = NET_LOGIN_TIMEOUT_MS
    write_stall_timeout_ms: int = NET_WRITE_STALL_TIMEOUT_MS
    #: Above this a connection's write buffer stops it reading requests.
    write_buffer_high_bytes: int = NET_WRITE_BUFFER_HIGH_BYTES
    #: Bytes of answers being built or unsent, in total and per connection (a fetch gets
    #: less than its max_bytes, or waits, when they are spent).
    max_response_bytes: int = NET_MAX_RESPONSE_BYTES
    max_response_bytes_per_connection: int = NET_MAX_RESPONSE_BYTES_PER_CONNECTION
    #: ... and of the connections from one IP address together (at most the total).
    max_response_bytes_per_address: int = NET_MAX_RESPONSE_BYTES_PER_ADDRESS
    #: Bytes of requests received and not yet answered, over all connections.
    max_inbound_bytes: int = NET_MAX_INBOUND_BYTES
    #: Requests one connection starts per event-loop turn (fairness).
    requests_per_turn: int = NET_REQUESTS_PER_TURN
    #: How long shutdown waits for in-flight requests.
    shutdown_timeout_ms: int = 10_000
    #: Consumer-group session bounds.
    group_session_timeout_ms_min: int = 1_000
    group_session_timeout_ms_max: int = 300_000
    #: Name server: a broker silent this long drops out of routes (a dead broker is out
    #: within 5 s); brokers heartbeat this often (at least twice per TTL).
    broker_ttl_ms: int = 4_000
    broker_heartbeat_interval_ms: int = 1_000
    #: Name server: how long a topic whose brokers all went away is answered as "no route
    #: right now" (BrokerNotAvailable, retriable) before it is forgotten (TopicNotFound).
    stale_topic_ms: int = DEFAULT_STALE_TOPIC_MS
    #: Delay/timer messages: delivery is late by at most this (plus recovery after a
    #: restart), never early. RocketMQ's timer uses 1000 ms.
    timer_precision_ms: int = 100
    #: The one maximum delay, for every way of sending a delayed message; a later time is
    #: refused (DelayTooLong), never clamped.
    max_delay_ms: int = 7 * 24 * 3600 * 1000
    #: Slots of the in-memory timer wheel; its window is slots x precision (1 h by
    #: default). Later timers wait outside the wheel and roll in as their time nears.
    timer_wheel_slots: int = 36_000
    #: Transactions: an undecided transaction is first checked with its producer group
    #: this long after its first half message, then every `txn_check_interval_ms`, at most
    #: `txn_max_checks` times; after that the broker rolls it back and lists it.
    txn_check_delay_ms: int = 6_000
    txn_check_interval_ms: int = 30_000
    txn_max_checks: int = 15
    #: How long the broker waits for one checker's answer.
    txn_check_timeout_ms: int = 5_000
    #: Limits: open transactions on the broker, half batches in one transaction.
    max_open_transactions: int = 100_000
    max_batches_per_transaction: int = 10_000
    #: How often the timer and transaction services save their state (their restart
    #: rescans the commit log written since).
    service_checkpoint_interval_ms: int = 5_000
    #: How often compact topics' queues are checked for a compaction run (each topic's
    #: min.cleanable.dirty.ratio, max.compaction.lag.ms and delete.retention.ms decide).
    compaction_check_interval_ms: int = 15_000
    #: Pop consumption: bounds of a lease (invisible duration), messages per receive, and
    #: deliveries before a message goes to its group's dead-letter topic.
    pop_min_invisible_ms: int = 1_000
    pop_max_invisible_ms: int = 12 * 3600 * 1000
    pop_max_messages: int = 1_024
    pop_max_attempts_limit: int = 1_000
    #: TLS on the listener (docs/guide/security.md): the server's PEM certificate (chain)
    #: and its private key. Unset: plaintext (warned about unless bound to loopback).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    #: The CA that signs client certificates; when set, clients are asked for one.
    tls_ca_file: Path | None = None
    #: none, optional or required; unset: required when tls_ca_file is set, else none.
    tls_client_auth: TlsClientAuth | None = None
    #: TLS on this broker's connections to its name servers (verified against
    #: tls_ca_file, or the system's CAs; presenting tls_cert_file); unset: the same as
    #: the listener (TLS when tls_cert_file is set).
    name_server_tls: bool | None = None
    #: SCRAM-SHA-256 authentication on the listener (docs/guide/security.md, "Users and
    #: passwords"): every connection must log in as a user of this broker before any
    #: other request. Off by default: then nothing asks for or checks a user.
    auth_enabled: bool = False
    #: User names that may manage users (USER_UPSERT, USER_DELETE, USER_LIST) when
    #: auth_enabled; `bootstrap_user` is one too.
    super_users: tuple[str, ...] = ()
    #: With auth_enabled: when the broker starts with no user at all, it creates this one
    #: (a super user), with the password the `tidemq server`/`tidemq broker` process reads
    #: from the environment variable TIDEMQ_BOOTSTRAP_PASSWORD (never from a file or flag).
    bootstrap_user: str | None = None
    #: ACLs (docs/guide/security.md, "Who may do what"): every request must be allowed
    #: by an ACL entry (or come from a super user); what is not allowed is refused.
    #: Needs auth_enabled (an ACL names users). Off by default.
    authorization_enabled: bool = False
    store: StoreConfig = field(default_factory=_default_store)
    #: Tiered storage (`[tiered]`): off unless its url is set.
    tiered: TieredConfig = field(default_factory=TieredConfig)
    #: Membership of a replica group (`[replication]`): off unless its group is set.
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)

    def __post_init__(self) -> None:
        if not _NAME.match(self.broker_name):
            raise ConfigError(
                f"broker.broker_name {self.broker_name!r}: use 1-64 of A-Z a-z 0-9 _ . -"
            )
        if not 0 <= self.port < 65536:
            raise ConfigError(f"broker.port must be 0..65535, got {self.port}")
        for name in (
            "default_queues",
            "max_message_bytes",
            "max_fetch_bytes",
            "max_fetch_wait_ms",
            "max_parked_fetches",
            "max_in_flight_requests",
            "max_connections",
            "max_connections_per_address",
            "frame_read_timeout_ms",
            "connection_idle_timeout_ms",
            "login_timeout_ms",
            "write_stall_timeout_ms",
            "write_buffer_high_bytes",
            "max_response_bytes",
            "max_response_bytes_per_connection",
            "max_response_bytes_per_address",
            "max_inbound_bytes",
            "requests_per_turn",
            "broker_ttl_ms",
            "broker_heartbeat_interval_ms",
            "timer_precision_ms",
            "max_delay_ms",
            "timer_wheel_slots",
            "txn_check_delay_ms",
            "txn_check_interval_ms",
            "txn_max_checks",
            "txn_check_timeout_ms",
            "max_open_transactions",
            "max_batches_per_transaction",
            "service_checkpoint_interval_ms",
            "compaction_check_interval_ms",
            "pop_min_invisible_ms",
            "pop_max_invisible_ms",
            "pop_max_messages",
            "pop_max_attempts_limit",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"broker.{name} must be positive, got {getattr(self, name)}")
        if self.max_message_bytes > self.store.max_batch_bytes:
            raise ConfigError(
                f"broker.max_message_bytes ({self.max_message_bytes}) exceeds "
                f"store.max_batch_bytes ({self.store.max_batch_bytes})"
            )
        if self.max_response_bytes_per_connection > self.max_response_bytes:
            raise ConfigError(
                "broker.max_response_bytes_per_connection exceeds broker.max_response_bytes"
            )
        if self.max_inbound_bytes < self.max_frame_bytes:
            raise ConfigError(
                f"broker.max_inbound_bytes ({self.max_inbound_bytes}) is below the largest "
                f"frame ({self.max_frame_bytes}: max_message_bytes/max_fetch_bytes + 64 KiB)"
            )
        if self.broker_heartbeat_interval_ms * 2 > self.broker_ttl_ms:
            raise ConfigError("broker.broker_ttl_ms must be at least twice the heartbeat interval")
        if self.stale_topic_ms < 0:
            raise ConfigError(f"broker.stale_topic_ms must be >= 0, got {self.stale_topic_ms}")
        if self.authorization_enabled and not self.auth_enabled:
            raise ConfigError(
                "broker.authorization_enabled needs broker.auth_enabled: ACL entries name "
                "users, and without login every client is anonymous"
            )
        self._check_tls()

    def _check_tls(self) -> None:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError("broker.tls_cert_file and broker.tls_key_file go together")
        if self.tls_cert_file is None:
            if self.tls_client_auth is not None:
                raise ConfigError(
                    "broker.tls_client_auth needs broker.tls_cert_file and broker.tls_key_file "
                    "(TLS on the listener)"
                )
            if self.tls_ca_file is not None and not self.name_server_tls:
                raise ConfigError(
                    "broker.tls_ca_file needs broker.tls_cert_file and broker.tls_key_file "
                    "(TLS on the listener) or broker.name_server_tls"
                )
            return
        auth = self.tls_client_auth
        if auth is not None and auth is not TlsClientAuth.NONE and self.tls_ca_file is None:
            raise ConfigError(
                f"broker.tls_client_auth={auth.value} needs broker.tls_ca_file "
                "(the CA that signs the client certificates)"
            )

    @property
    def tls(self) -> bool:
        """Whether the listener speaks TLS."""
        return self.tls_cert_file is not None

    @property
    def name_server_tls_on(self) -> bool:
        """Whether connections to the name servers use TLS."""
        return self.tls if self.name_server_tls is None else self.name_server_tls

    @property
    def max_frame_bytes(self) -> int:
        return max(self.max_message_bytes, self.max_fetch_bytes) + FRAME_OVERHEAD_BYTES
