"""The broker's access control, made from its store at start: logins (`auth`), the owners
of producer ids, and the ACL entries (`authorization`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tidemq.broker.auth import Authenticator
from tidemq.broker.authorization import Authorization
from tidemq.broker.config import BrokerConfig
from tidemq.broker.producer_owner_topic import ProducerOwnerTopic
from tidemq.broker.producer_owners import MAX_PRODUCER_OWNERS, ProducerOwners
from tidemq.broker.store_gateway import StoreGateway
from tidemq.cluster.security_link import check_cluster_login
from tidemq.core.clock import Clock
from tidemq.store.message_store import MessageStore

__all__ = ["AccessControl", "open_access_control"]


@dataclass(frozen=True, slots=True)
class AccessControl:
    """The three parts, as the broker's dispatcher and security sync use them."""

    auth: Authenticator
    producer_owners: ProducerOwners
    authz: Authorization


def open_access_control(
    cfg: BrokerConfig,
    gateway: StoreGateway,
    store: MessageStore,
    clock: Clock,
    *,
    cluster_key: bytes | None,
    bootstrap_password: str | None,
    txn_groups: Callable[[Sequence[str]], list[str]],
) -> AccessControl:
    """Logins, producer-id owners and ACLs, from the store."""
    key = cluster_key
    auth = Authenticator(
        cfg,
        gateway,
        clock,
        # Other brokers log in with the cluster secret to fetch a group's offsets.
        cluster_login=None if key is None else lambda m: check_cluster_login(key, m, clock),
    )
    auth.bootstrap(cfg.bootstrap_user, bootstrap_password)
    durable = ProducerOwnerTopic(gateway, keep=MAX_PRODUCER_OWNERS)
    producer_owners = ProducerOwners(save=durable.save, load=durable.load)
    authz = Authorization(
        enabled=cfg.authorization_enabled,
        super_users=auth.super_users,
        rows=store.metadata.acls(),
        save=lambda rows, counter: store.metadata.add_acls(rows, counter=counter),
        remove=lambda rows, counter: store.metadata.delete_acls(rows, counter=counter),
        txn_groups=txn_groups,
        clock=clock,
    )
    return AccessControl(auth, producer_owners, authz)
