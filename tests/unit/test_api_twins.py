"""The sync API (`tidemq`) and the asyncio API (`tidemq.aio`) are twins: the same classes,
the same methods, the same parameters (names, kinds, defaults), in the same order. A
method or argument added to one face and forgotten on the other fails here."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import tidemq
from tidemq import aio

CLASSES = [
    "Admin",
    "BroadcastConsumer",
    "GroupConsumer",
    "Producer",
    "PushConsumer",
    "ReceivedMessage",
    "SimpleConsumer",
    "StreamConsumer",
    "Transaction",
    "TransactionProducer",
]

#: Sync method -> its asyncio twin, where the names must differ: the asyncio face's
#: `*_nowait` return an asyncio future, the sync face's `*_async` a concurrent one.
RENAMED = {"send_async": "send_nowait", "send_batch_async": "send_batch_nowait"}
#: Only on the asyncio face, each with the reason.
ASYNC_ONLY = {
    "cluster",  # the shared ClusterClient, for composing asyncio clients on one loop
    "config",  # the producer's checked settings
    "window_for",  # a producer diagnostic
    "producer",  # the transaction producer's plain producer (staging, in send order)
    # The asyncio producer's plumbing for the sync face (checked input, no task):
    "check_batch",
    "send_nowait_checked",
    "send_special",
    "start_send",
    "start_send_batch",
    # ... and for the sync `send` written on the caller's thread (blocking_send.py):
    "broker_at",
    "direct_target",
    "resend_stamped_threadsafe",
}
#: Per class: TransactionProducer.start, which the sync constructor calls itself.
ASYNC_ONLY_IN = {"TransactionProducer": {"start"}}
#: Constructor parameters only the asyncio face has: an existing ClusterClient to share.
ASYNC_ONLY_PARAMS = {"cluster"}
#: Constructors that wrap an asyncio object rather than take user arguments.
WRAPPERS = {"Transaction", "ReceivedMessage"}


def _params(func: Any) -> list[tuple[str, Any, Any]]:
    return [
        (p.name, p.kind, p.default)
        for p in inspect.signature(func).parameters.values()
        if p.name not in ASYNC_ONLY_PARAMS
    ]


def _methods(cls: type) -> set[str]:
    return {n for n, v in vars_of(cls).items() if not n.startswith("_") and callable(v)}


def vars_of(cls: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__[:-1]):
        out.update(vars(klass))
    return out


@pytest.mark.parametrize("name", CLASSES)
def test_sync_and_asyncio_faces_have_the_same_methods_and_arguments(name: str) -> None:
    sync_cls, async_cls = getattr(tidemq, name), getattr(aio, name)
    sync_methods = {RENAMED.get(m, m) for m in _methods(sync_cls)}
    async_methods = _methods(async_cls) - ASYNC_ONLY - ASYNC_ONLY_IN.get(name, set())
    assert sync_methods == async_methods, (
        f"only sync: {sorted(sync_methods - async_methods)}, "
        f"only asyncio: {sorted(async_methods - sync_methods)}"
    )
    for method in sorted(_methods(sync_cls)):
        twin = RENAMED.get(method, method)
        assert _params(getattr(sync_cls, method)) == _params(getattr(async_cls, twin)), method
    if name not in WRAPPERS:
        assert _params(sync_cls.__init__) == _params(async_cls.__init__), "__init__"


@pytest.mark.parametrize("name", CLASSES)
def test_no_catch_all_keyword_arguments(name: str) -> None:
    """Typed arguments, never `**options: Any`: a misspelt option must fail at the call."""
    for face in (tidemq, aio):
        cls = getattr(face, name)
        for member in ["__init__", *_methods(cls)]:
            params = inspect.signature(getattr(cls, member)).parameters.values()
            assert all(p.kind is not p.VAR_KEYWORD for p in params), (
                f"{face.__name__}.{name}.{member}"
            )
