"""The HTTP listener's settings (`[http]` in tidemq.toml, `--http-port`)."""

from __future__ import annotations

from dataclasses import dataclass

from tidemq.core.errors import ConfigError

__all__ = ["DEFAULT_HTTP_PORT", "HttpConfig"]

#: The schema registry's REST port (conventions.md: Confluent's 8081 is RocketMQ's gRPC).
DEFAULT_HTTP_PORT = 8085


@dataclass(frozen=True, slots=True)
class HttpConfig:
    #: -1: no HTTP listener; 0: any free port.
    port: int = DEFAULT_HTTP_PORT
    #: Address to bind; empty: the broker's (`broker.host`, 127.0.0.1 by default).
    host: str = ""
    #: The user the schema registry logs in as, on a broker with `broker.auth_enabled`
    #: (its password: TIDEMQ_REGISTRY_PASSWORD); empty: the broker's bootstrap user,
    #: with TIDEMQ_BOOTSTRAP_PASSWORD.
    registry_user: str = ""
    #: `/metrics` with a series per queue (label `queue_id`) for consumer lag and queue end
    #: offsets, instead of per topic: opt-in, as a topic of 100,000 queues would make
    #: 100,000 series per metric (at most `MAX_QUEUE_SERIES` queues are reported).
    metrics_per_queue: bool = False

    def __post_init__(self) -> None:
        if not -1 <= self.port <= 65535:
            raise ConfigError(
                f"http.port must be -1 (no listener), 0 (any free port) or 1..65535, "
                f"got {self.port}"
            )

    @property
    def enabled(self) -> bool:
        return self.port >= 0
