"""A thin asyncio client for etcd v3: the few calls replica groups need (read, transaction,
lease grant/keep-alive/revoke, watch one event), over `aetcd`'s gRPC channel (ADR 0014).

This is the only module that imports `aetcd`; nothing of it leaks out. Every call is
bounded by `request_timeout_ms` (an outer `asyncio.timeout` as well as gRPC's deadline,
because aetcd does not pass its deadline to every step, such as creating a watch), and
every failure of etcd or of the connection to it becomes `EtcdUnavailable` naming the
operation, the endpoints and etcd's answer. No call retries: the caller decides, because
only it knows whether a retry is safe (a transaction that timed out may have been applied).

Endpoints: `http://HOST:PORT`, one or several. Several must be IPv4 addresses: they become
one gRPC target (`ipv4:A:P,B:Q`) whose channel moves to the next address when one fails.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

import aetcd
import aetcd.exceptions

from tidemq.core.errors import ConfigError, EtcdUnavailable

__all__ = [
    "ETCD_REQUEST_TIMEOUT_MS",
    "Compare",
    "CreatedAt",
    "Delete",
    "EtcdClient",
    "EventKind",
    "Get",
    "KeyValue",
    "Lease",
    "Op",
    "Put",
    "TxnResult",
    "ValueIs",
    "WatchEvent",
    "grpc_target",
]

#: Longest one etcd call may take. etcd answers in milliseconds when healthy; its own
#: leader election takes about one second (1 s election timeout), so 2 s lets a call ride
#: over a member change, and still fails well inside a 2 s lease's next keep-alive round.
ETCD_REQUEST_TIMEOUT_MS: Final = 2_000
#: gRPC reconnects with exponential backoff up to 120 s by default: after an etcd restart
#: a client would stay down for minutes. Capped at 1 s, a client is back within about a
#: second of etcd.
_RECONNECT_BACKOFF_MS_MAX: Final = 1_000
_RECONNECT_BACKOFF_MS_MIN: Final = 100
#: How long `close()` gives calls that timed out to wind down before closing the channel.
_CLOSE_WAIT_MS: Final = 1_000

_T = TypeVar("_T")


def grpc_target(endpoints: Sequence[str]) -> tuple[str, int]:
    """(host, port) for aetcd, whose target is f"{host}:{port}": for several IPv4 endpoints
    the host carries gRPC's `ipv4:` scheme and every address but the last port.
    ConfigError names a bad endpoint."""
    if not endpoints:
        raise ConfigError("etcd: no endpoints given")
    addresses: list[tuple[str, int]] = []
    for endpoint in endpoints:
        parts = urlsplit(endpoint)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ConfigError(f"etcd endpoint {endpoint!r}: expected http://HOST:PORT")
        addresses.append((parts.hostname, parts.port))
    if len(addresses) == 1:
        return addresses[0]
    try:
        for host, _ in addresses:
            IPv4Address(host)
    except ValueError:
        raise ConfigError(
            f"etcd endpoints {list(endpoints)}: several endpoints must be IPv4 addresses"
        ) from None
    listed = ",".join(f"{host}:{port}" for host, port in addresses[:-1])
    return f"ipv4:{listed},{addresses[-1][0]}", addresses[-1][1]


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    #: etcd's revision of the key's creation: it changes when the key is deleted and
    #: created again, so it names one incarnation of the key.
    create_revision: int
    mod_revision: int
    #: The lease the key is attached to (0: none).
    lease_id: int


@dataclass(frozen=True)
class Lease:
    id: int
    #: What etcd granted, which may be more than asked (etcd's minimum is about 2 s).
    ttl_s: int


class EventKind(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True)
class WatchEvent:
    kind: EventKind
    #: For a DELETE, only `key` and `mod_revision` are meaningful.
    kv: KeyValue


# Transaction conditions and operations: plain data, translated to aetcd's in `txn`.
@dataclass(frozen=True)
class ValueIs:
    key: bytes
    value: bytes


@dataclass(frozen=True)
class CreatedAt:
    """The key's create revision is `revision`; 0 means the key does not exist."""

    key: bytes
    revision: int


@dataclass(frozen=True)
class Put:
    key: bytes
    value: bytes
    lease_id: int = 0


@dataclass(frozen=True)
class Delete:
    key: bytes


@dataclass(frozen=True)
class Get:
    key: bytes


Compare = ValueIs | CreatedAt
Op = Put | Delete | Get


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    #: One entry per `Get` of the branch that ran, in order (None: no such key).
    gets: tuple[KeyValue | None, ...]
    #: The store revision the transaction wrote at (0 when its branch wrote nothing).
    revision: int


def _key_value(kv: Any) -> KeyValue:
    return KeyValue(
        key=bytes(kv.key),
        value=bytes(kv.value),
        create_revision=int(kv.create_revision),
        mod_revision=int(kv.mod_revision),
        lease_id=int(kv.lease),
    )


class EtcdClient:
    """One connection (gRPC channel) to an etcd cluster; owned by one event loop.
    `connect()` before use, `close()` after."""

    def __init__(
        self, endpoints: Sequence[str], *, request_timeout_ms: int = ETCD_REQUEST_TIMEOUT_MS
    ) -> None:
        host, port = grpc_target(endpoints)
        self.endpoints = tuple(endpoints)
        self._timeout_s = request_timeout_ms / 1000
        options = {
            "grpc.initial_reconnect_backoff_ms": _RECONNECT_BACKOFF_MS_MIN,
            "grpc.min_reconnect_backoff_ms": _RECONNECT_BACKOFF_MS_MIN,
            "grpc.max_reconnect_backoff_ms": _RECONNECT_BACKOFF_MS_MAX,
        }
        self._client = aetcd.Client(host=host, port=port, timeout=self._timeout_s, options=options)
        #: Calls that timed out, cancelled and still winding down (see `_call`).
        self._dropped: set[asyncio.Future[Any]] = set()

    async def _call(
        self,
        operation: str,
        call: Coroutine[Any, Any, _T],
        *,
        wait_s: float = 0.0,
        timeout_s: float | None = None,
    ) -> _T:
        """Run one aetcd call bounded in time (`timeout_s`, or the request timeout, plus
        `wait_s` for a call that waits on purpose) and map its failures to
        EtcdUnavailable.

        The call runs as its own task, and on timeout (or when the caller is cancelled)
        it is cancelled but not waited for: aetcd's clean-up of a stream (cancelling a
        watch, ending a keep-alive) can itself wait on a dead connection, and a bound
        that waited for it would be no bound. Such a task is kept until it ends."""
        bound_s = (self._timeout_s if timeout_s is None else timeout_s) + wait_s
        task = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait({task}, timeout=bound_s)
        except asyncio.CancelledError:
            self._drop(task)
            raise
        if not done:
            self._drop(task)
            raise EtcdUnavailable(
                f"etcd {operation}: no answer from {list(self.endpoints)} "
                f"within {bound_s * 1000:.0f} ms"
            )
        try:
            return task.result()
        except aetcd.exceptions.ClientError as error:
            raise EtcdUnavailable(
                f"etcd {operation} failed on {list(self.endpoints)}: {error}"
            ) from error

    def _drop(self, task: asyncio.Future[Any]) -> None:
        task.cancel()
        self._dropped.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Future[Any]) -> None:
        self._dropped.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its failure was reported as a timeout already

    async def connect(self) -> None:
        await self._call("connect", self._client.connect())

    async def close(self) -> None:
        """Close the channel; calls still winding down get `_CLOSE_WAIT_MS` to end."""
        if self._dropped:
            await asyncio.wait(set(self._dropped), timeout=_CLOSE_WAIT_MS / 1000)
        await self._client.close()

    async def get(self, key: bytes) -> KeyValue | None:
        """A linearizable read of one key (None: absent)."""
        found = await self._call(f"get {key!r}", self._client.get(key))
        return None if found is None else _key_value(found)

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """One etcd transaction: if every condition holds, `success` runs, else `failure`."""
        client = self._client
        conditions = [
            client.transactions.value(c.key) == c.value
            if isinstance(c, ValueIs)
            else client.transactions.create(c.key) == c.revision
            for c in compare
        ]
        succeeded, responses = await self._call(
            "transaction",
            client.transaction(
                compare=conditions,
                success=[self._op(op) for op in success],
                failure=[self._op(op) for op in failure],
            ),
        )
        return self._txn_result(bool(succeeded), responses)

    def _op(self, op: Op) -> Any:
        tx = self._client.transactions
        if isinstance(op, Put):
            return tx.put(op.key, op.value, lease=op.lease_id or None)
        if isinstance(op, Delete):
            return tx.delete(op.key)
        return tx.get(op.key)

    @staticmethod
    def _txn_result(succeeded: bool, responses: list[Any]) -> TxnResult:
        gets: list[KeyValue | None] = []
        revision = 0
        for response in responses:
            if isinstance(response, list):  # aetcd: a range answer is [(value, Get), ...]
                gets.append(_key_value(response[0][1]) if response else None)
            else:
                kind = response.WhichOneof("response")
                revision = max(revision, int(getattr(response, kind).header.revision))
        return TxnResult(succeeded, tuple(gets), revision)

    async def grant_lease(self, ttl_s: int) -> Lease:
        lease = await self._call(f"lease grant ({ttl_s} s)", self._client.lease(ttl_s))
        return Lease(int(lease.id), int(lease.ttl))

    async def keep_alive(self, lease_id: int, *, timeout_ms: int | None = None) -> int:
        """One keep-alive of the lease: its TTL from now in seconds, 0 if it expired.
        `timeout_ms` (default: the request timeout) lets a short lease give up on one
        try in time for the next."""
        timeout_s = None if timeout_ms is None else timeout_ms / 1000
        reply = await self._call(
            f"lease keep-alive {lease_id:x}",
            self._client.refresh_lease(lease_id),
            timeout_s=timeout_s,
        )
        return 0 if reply is None else max(0, int(reply.TTL))

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke the lease, deleting every key attached to it. A lease that already
        expired is not an error."""
        try:
            await self._call(f"lease revoke {lease_id:x}", self._client.revoke_lease(lease_id))
        except EtcdUnavailable as error:
            if "lease not found" not in str(error):
                raise

    async def watch_once(
        self, key: bytes, *, start_revision: int, timeout_ms: int
    ) -> WatchEvent | None:
        """The first change of `key` at or after `start_revision`, or None when nothing
        changed within `timeout_ms` (bounded by `timeout_ms` plus one request timeout)."""
        event = await self._call(
            f"watch {key!r}",
            self._watch_once(key, start_revision, timeout_ms / 1000),
            wait_s=timeout_ms / 1000,
        )
        if event is None:
            return None
        if isinstance(event, Exception):
            # aetcd hands a broken watch stream's error over as the "event".
            raise EtcdUnavailable(f"etcd watch {key!r} failed on {list(self.endpoints)}: {event}")
        if event.kv.key != key:
            # aetcd pairs a "watch created" answer with whichever watch waits for one: a
            # watch request that timed out (etcd stalled) and is answered late takes the
            # place of the next one, on another key. Never hand out another key's change.
            raise EtcdUnavailable(
                f"etcd watch {key!r}: got a change of {event.kv.key!r} (a late answer to an "
                "earlier watch); ask again"
            )
        kind = EventKind.DELETE if event.kind == aetcd.EventKind.DELETE else EventKind.PUT
        return WatchEvent(kind, _key_value(event.kv))

    async def _watch_once(self, key: bytes, start_revision: int, timeout_s: float) -> Any:
        try:
            return await self._client.watch_once(
                key, timeout=timeout_s, start_revision=start_revision
            )
        except aetcd.exceptions.WatchTimeoutError:
            return None
