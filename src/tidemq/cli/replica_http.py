"""A replica group member with its HTTP listener (`tidemq broker --group NAME --etcd
URL`): the `ReplicaNode` and the `HttpListener` a plain broker's `Node` runs (schema
registry REST API, `/metrics`, web console), on the member's http port for its whole
life, whichever role it has (docs/guide/replication.md, "Monitoring a group").

* **Leading** (`node.broker` runs): `/metrics` is that broker's snapshot, which carries
  the leader's replication figures; the registry's schema check is installed on each
  new broker as it starts (`ReplicaNode(on_broker=...)`: a member that leads, follows
  and leads again runs a new broker each time).
* **Following**: `/metrics` reports the member's replication figures alone (role, epoch,
  log end, committed position, lag behind the leader), never a broker's counters.
* **The registry** reads and writes `_schemas` through the cluster (its client
  bootstraps from the name servers), so it serves in either role. It opens at its first
  request: the group may have no leader yet when the member starts, and `/metrics` must
  answer meanwhile.
* **Logins** (`broker.auth_enabled`). Leading, the broker checks passwords, as a plain
  broker's listener does. A follower cannot check them itself: users live in the store's
  metadata, not in the replicated log, and a follower does not pull them from the name
  servers (ADR 15), so its table is what it held when it last led (or nothing), with
  deleted users and old passwords still in it. A follower therefore checks a login by
  logging in with it to the group's leader (SCRAM on the leader's client listener, with
  the broker's TLS): the leader's answer decides, exactly as it would for a client.
  With no leader to ask (an election under way, the leader unreachable, this member
  between roles) the request gets 503 with the reason, never through unchecked.
  Failures count against the HTTP client's address here, as the broker's check does.
"""

from __future__ import annotations

import logging
import sys
from typing import Final

from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.broker.metrics import MetricsSnapshot
from tidemq.broker.replica_follower import ReplicaFaults
from tidemq.broker.replica_metrics import ReplicaMetrics
from tidemq.broker.replica_node import ReplicaNode
from tidemq.cli.node import listener_tls, registry_client_config
from tidemq.core.clock import Clock, SystemClock
from tidemq.core.errors import AuthenticationFailed, TidemqError
from tidemq.http.config import HttpConfig
from tidemq.http.listener import HttpListener
from tidemq.http.login import LoginUnavailable
from tidemq.net.client import ClientConnection
from tidemq.net.login import FAILED
from tidemq.net.login_limit import LoginLimit

__all__ = ["ReplicaHttpNode"]

log = logging.getLogger(__name__)

#: The longest a follower's check of a login at its leader may take (connect, TLS,
#: SCRAM; a refused login is answered after about a second).
_LEADER_LOGIN_TIMEOUT_S: Final = 10.0
#: Frames of a login exchange are small.
_LOGIN_FRAME_BYTES: Final = 1 << 20


class ReplicaHttpNode:
    def __init__(
        self,
        config: BrokerConfig,
        http: HttpConfig,
        *,
        cluster_secret: str | None = None,
        bootstrap_password: str | None = None,
        registry_login: tuple[str, str] | None = None,
        clock: Clock | None = None,
        faults: ReplicaFaults | None = None,
    ) -> None:
        """`registry_login`: (user, password) the registry logs in with on a broker that
        requires logins (without one, no listener runs, as for `Node`). The rest goes to
        the `ReplicaNode`."""
        self._http = http
        self._login = registry_login
        self.node = ReplicaNode(
            config,
            clock=clock,
            cluster_secret=cluster_secret,
            bootstrap_password=bootstrap_password,
            on_broker=self._on_broker,
            faults=faults,
        )
        self._client_config = registry_client_config(config, registry_login)
        #: How a follower dials its leader to check a login: as the registry's client.
        self._leader_tls = None if self._client_config is None else self._client_config.ssl_context
        self._limit = LoginLimit(clock or SystemClock())
        self.listener: HttpListener | None = None

    async def start(self) -> str:
        """Listen on the http port first (so `/metrics` answers from the start), then
        join the group; returns the address clients dial while this member leads."""
        cfg = self.node.config
        if self._http.enabled and cfg.auth_enabled and self._login is None:
            log.warning(
                "no HTTP listener (schema registry, metrics): the broker requires logins and "
                "the registry has none to log in with (set http.registry_user and "
                "TIDEMQ_REGISTRY_PASSWORD, or broker.bootstrap_user and "
                "TIDEMQ_BOOTSTRAP_PASSWORD; http.port=-1 silences this)"
            )
        elif self._http.enabled:
            listener = HttpListener(
                # The client bootstraps from one name server (it learns the cluster there).
                cfg.name_servers[0],
                host=self._http.host or cfg.host,
                port=self._http.port,
                metrics=self._metrics,
                client_config=self._client_config,
                login=self._check_password if cfg.auth_enabled else None,
                tls=listener_tls(cfg),
                lazy_registry=True,
            )
            http_address = await listener.start()
            self.listener = listener
            # A line of its own, like "serving on": scripts and tests read the port.
            sys.stderr.write(f"http on {http_address}\n")
            sys.stderr.flush()
        return await self.node.start()

    async def stop(self) -> None:
        listener, self.listener = self.listener, None  # no check for brokers from now on
        try:
            if listener is not None:
                broker = self.node.broker
                if broker is not None:
                    broker.set_schema_check(None)
                await listener.stop()
        finally:
            await self.node.stop()

    # ------------------------------------------------------------------ roles

    def _on_broker(self, broker: Broker) -> None:
        listener = self.listener
        if listener is not None:
            broker.set_schema_check(listener.registry.unregistered)

    def _metrics(self) -> MetricsSnapshot | ReplicaMetrics:
        broker = self.node.broker
        if broker is not None:
            return broker.metrics(per_queue=self._http.metrics_per_queue)
        return self.node.replica_metrics()

    # ------------------------------------------------------------------ logins

    async def _check_password(self, user: str, password: str, host: str) -> bool:
        broker = self.node.broker
        if broker is not None:
            return await broker.check_password(user, password, host)
        return await self._check_at_leader(user, password, host)

    async def _check_at_leader(self, user: str, password: str, host: str) -> bool:
        """Log in to the group's leader as `user`: its answer decides (module doc)."""
        if self._limit.refused_for_s(host) is not None:
            return False
        node = self.node
        where = f"member {node.member} of group {node.config.replication.group}"
        leader = node.leader_record()
        if leader is None or not leader.address:
            raise LoginUnavailable(f"{where} knows no leader to check logins with; retry")
        if leader.member == node.member:
            raise LoginUnavailable(f"{where} is between roles (its broker starts); retry")
        try:
            conn = await ClientConnection.open(
                leader.address,
                max_frame_bytes=_LOGIN_FRAME_BYTES,
                connect_timeout_s=_LEADER_LOGIN_TIMEOUT_S,
                ssl_context=self._leader_tls,
                username=user,
                password=password,
            )
        except AuthenticationFailed as exc:
            if FAILED not in str(exc):  # refused for another reason: not a verdict
                raise LoginUnavailable(
                    f"{where} follows; its leader {leader.member} did not check the login: {exc}"
                ) from None
            self._limit.failed(host)
            log.info("HTTP login of %r from %s failed (checked at %s)", user, host, leader.member)
            return False
        except TidemqError as exc:
            raise LoginUnavailable(
                f"{where} follows and cannot reach its leader {leader.member} at "
                f"{leader.address} to check the login: {exc}"
            ) from None
        conn.close()
        return True
