"""`tidemq server`, `tidemq namesrv`, `tidemq broker`: run the servers in this process."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from tidemq.broker.broker import Broker, listener_ssl_context
from tidemq.broker.config import BrokerConfig
from tidemq.cli.common import CliUsageError, command
from tidemq.cli.config import load_configs
from tidemq.cli.node import Node
from tidemq.cli.replica_http import ReplicaHttpNode
from tidemq.cli.server import Service, configure_logging, serve
from tidemq.cluster.membership import CLUSTER_SECRET_ENV, check_secret
from tidemq.cluster.service import NameServerService
from tidemq.core.errors import ConfigError
from tidemq.http.config import HttpConfig
from tidemq.store.config import FlushMode

log = logging.getLogger(__name__)

__all__ = ["register"]

NAMESRV_PORT = 9876

ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        metavar="FILE",
        help="A tidemq.toml with broker and store sections.",
        show_default=False,
    ),
]
Sets = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="SECTION.KEY=VALUE",
        help="Override one setting, e.g. store.flush_mode=async (repeatable).",
        show_default=False,
    ),
]
Host = Annotated[
    str | None,
    typer.Option("--host", help="Address to listen on.", show_default="127.0.0.1"),
]
HttpPort = Annotated[
    int | None,
    typer.Option(
        "--http-port",
        help="Port of the HTTP listener (schema registry REST); 0: any free port; -1: none.",
        show_default="8085",
    ),
]
DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Where the store keeps its files.",
        show_default="./data",
    ),
]
Flush = Annotated[
    FlushMode | None,
    typer.Option(
        "--flush",
        case_sensitive=False,
        help="sync: acknowledge after fdatasync; async: sync every flush_interval_ms.",
        show_default=False,
    ),
]
LogLevel = Annotated[
    str,
    typer.Option("--log-level", help="debug, info, warning or error."),
]

_LEVELS = ("debug", "info", "warning", "error")

#: The password of broker.bootstrap_user (the first user, created when the broker has
#: none and broker.auth_enabled is set): read from the environment only.
BOOTSTRAP_PASSWORD_ENV = "TIDEMQ_BOOTSTRAP_PASSWORD"


def _bootstrap_password() -> str | None:
    return os.environ.get(BOOTSTRAP_PASSWORD_ENV) or None


#: The password of http.registry_user (environment only).
REGISTRY_PASSWORD_ENV = "TIDEMQ_REGISTRY_PASSWORD"


def _registry_login(cfg: BrokerConfig, http: HttpConfig) -> tuple[str, str] | None:
    """Who the node's schema registry logs in as on a broker that requires logins:
    http.registry_user with TIDEMQ_REGISTRY_PASSWORD, else the bootstrap user with
    TIDEMQ_BOOTSTRAP_PASSWORD (None: neither is set)."""
    if http.registry_user:
        password = os.environ.get(REGISTRY_PASSWORD_ENV) or ""
        if not password:
            raise CliUsageError(
                f"http.registry_user={http.registry_user} needs {REGISTRY_PASSWORD_ENV}"
            )
        return http.registry_user, password
    bootstrap_password = _bootstrap_password()
    if cfg.bootstrap_user and bootstrap_password:
        return cfg.bootstrap_user, bootstrap_password
    return None


def _cluster_secret() -> str | None:
    """TIDEMQ_CLUSTER_SECRET (environment only: a flag would show in `ps`), checked."""
    secret = os.environ.get(CLUSTER_SECRET_ENV) or None
    if secret is not None:
        try:
            check_secret(secret)
        except ConfigError as exc:
            raise CliUsageError(str(exc)) from None
    return secret


def _logging(level: str) -> None:
    if level.lower() not in _LEVELS:
        raise CliUsageError(f"--log-level must be one of {', '.join(_LEVELS)}, got {level!r}")
    configure_logging(level)


def _load(
    *,
    defaults: dict[str, dict[str, Any]],
    config: Path | None,
    sets: list[str] | None,
    flags: dict[str, dict[str, Any]],
) -> tuple[BrokerConfig, HttpConfig]:
    return load_configs(
        defaults=defaults,
        config_file=config,
        environ=os.environ,
        sets=sets or (),
        flags=flags,
    )


def server(
    *,
    data_dir: DataDir = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            "-p",
            help="Port for clients (0: any free port).",
            show_default="9876",
        ),
    ] = None,
    host: Host = None,
    http_port: HttpPort = None,
    config: ConfigFile = None,
    sets: Sets = None,
    flush: Flush = None,
    log_level: LogLevel = "info",
) -> None:
    """Run a name server and a broker in one process, on one port (and the schema
    registry's REST API on --http-port, 8085).

    TLS: --set broker.tls_cert_file=FILE --set broker.tls_key_file=FILE (and
    broker.tls_ca_file to require client certificates). Passwords: --set
    broker.auth_enabled=true --set broker.bootstrap_user=NAME with the password in
    TIDEMQ_BOOTSTRAP_PASSWORD; see docs/guide/security.md.
    """
    _logging(log_level)
    cfg, http = _load(
        defaults={"broker": {"port": NAMESRV_PORT}, "store": {"data_dir": "data"}},
        config=config,
        sets=sets,
        flags={
            "broker": {"port": port, "host": host},
            "store": {"data_dir": data_dir, "flush_mode": flush},
            "http": {"port": http_port},
        },
    )
    password, login = _bootstrap_password(), _registry_login(cfg, http)
    serve(
        lambda: Node(
            Broker(cfg, embedded_nameserver=True, bootstrap_password=password),
            http,
            registry_login=login,
        )
    )


def namesrv(
    *,
    port: Annotated[
        int | None,
        typer.Option("--port", "-p", help="Port to listen on.", show_default="9876"),
    ] = None,
    host: Host = None,
    config: ConfigFile = None,
    sets: Sets = None,
    log_level: LogLevel = "info",
) -> None:
    """Run a name server alone; brokers register with it (`tidemq broker --namesrv`).

    TLS: --set broker.tls_cert_file=FILE --set broker.tls_key_file=FILE (and
    broker.tls_ca_file to require client certificates). With TIDEMQ_CLUSTER_SECRET set,
    only brokers that sign their registrations with the same secret may register; with
    it and --set broker.auth_enabled=true, clients log in as the cluster's users, which
    the name server learns from the brokers; with --set broker.authorization_enabled=true
    too, a user learns only the routes of the topics the cluster's ACL entries let it
    describe (super users: broker.super_users and broker.bootstrap_user); see
    docs/guide/security.md.
    """
    _logging(log_level)
    cfg, _ = _load(
        defaults={"broker": {"port": NAMESRV_PORT}},
        config=config,
        sets=sets,
        flags={"broker": {"port": port, "host": host}},
    )
    secret = _cluster_secret()

    def make() -> Service:
        return NameServerService(
            host=cfg.host,
            port=cfg.port,
            broker_ttl_ms=cfg.broker_ttl_ms,
            heartbeat_interval_ms=cfg.broker_heartbeat_interval_ms,
            stale_topic_ms=cfg.stale_topic_ms,
            ssl_context=listener_ssl_context(cfg),
            cluster_secret=secret,
            auth_enabled=cfg.auth_enabled,
            authorization_enabled=cfg.authorization_enabled,
            super_users=[u for u in (*cfg.super_users, cfg.bootstrap_user) if u],
        )

    serve(make)


def broker(
    *,
    namesrv: Annotated[
        str | None,
        typer.Option(
            "--namesrv",
            "-n",
            metavar="HOST:PORT,...",
            help="Name servers to register with.",
            show_default="127.0.0.1:9876",
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            "-p",
            help="Port for clients (0: any free port).",
            show_default="10911",
        ),
    ] = None,
    broker_name: Annotated[
        str | None,
        typer.Option("--broker-name", help="This broker's name.", show_default="broker-0"),
    ] = None,
    data_dir: DataDir = None,
    host: Host = None,
    http_port: HttpPort = None,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            help="Join this replica group (with --etcd): its elected leader serves the "
            "group's queues under the group's name; the others copy its log.",
        ),
    ] = None,
    etcd: Annotated[
        str | None,
        typer.Option(
            "--etcd",
            metavar="URL,...",
            help="etcd endpoints of the replica group's controller.",
        ),
    ] = None,
    config: ConfigFile = None,
    sets: Sets = None,
    flush: Flush = None,
    log_level: LogLevel = "info",
) -> None:
    """Run a broker that registers with separate name servers (and serves the schema
    registry's REST API on --http-port, 8085). With --group and --etcd it is a member
    of a replica group (docs/guide/replication.md).

    TLS: --set broker.tls_cert_file=FILE --set broker.tls_key_file=FILE (and
    broker.tls_ca_file to require client certificates). Passwords: --set
    broker.auth_enabled=true --set broker.bootstrap_user=NAME with the password in
    TIDEMQ_BOOTSTRAP_PASSWORD. With TIDEMQ_CLUSTER_SECRET set, registrations are signed
    with it (name servers that know it refuse unsigned ones); see docs/guide/security.md.
    """
    _logging(log_level)
    cfg, http = _load(
        defaults={"broker": {"name_servers": "127.0.0.1:9876"}, "store": {"data_dir": "data"}},
        config=config,
        sets=sets,
        flags={
            "broker": {
                "port": port,
                "host": host,
                "broker_name": broker_name,
                "name_servers": namesrv,
            },
            "store": {"data_dir": data_dir, "flush_mode": flush},
            "http": {"port": http_port},
            "replication": {"group": group, "etcd": etcd},
        },
    )
    if not cfg.name_servers:
        raise CliUsageError(
            "broker.name_servers is empty: pass --namesrv HOST:PORT "
            "(or run `tidemq server` for a broker with its own name server)"
        )
    password, secret = _bootstrap_password(), _cluster_secret()
    login = _registry_login(cfg, http)
    if cfg.replication.enabled:
        serve(
            lambda: ReplicaHttpNode(
                cfg,
                http,
                cluster_secret=secret,
                bootstrap_password=password,
                registry_login=login,
            )
        )
        return
    serve(
        lambda: Node(
            Broker(
                cfg, embedded_nameserver=False, bootstrap_password=password, cluster_secret=secret
            ),
            http,
            # The client bootstraps from one name server (it learns the cluster there).
            bootstrap=cfg.name_servers[0],
            registry_login=login,
        )
    )


def register(app: typer.Typer) -> None:
    command(app)(server)
    command(app)(namesrv)
    command(app)(broker)
