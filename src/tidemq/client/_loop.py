"""One background event loop for the synchronous API.

Sync client objects run their asyncio twins on this loop from a daemon thread, so a sync
call is `run(coroutine)`: submit, then block until it finishes. Calls from inside that loop
would deadlock and are refused. `call_soon(callback, ...)` runs a plain function on the loop
instead, for calls that complete a future of their own without a task (`Producer.send`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["call_soon", "in_client_thread", "run", "submit"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (the `server` extra brings it), else asyncio's:
    a sync call makes two loop wake-ups, and uvloop's cost about half as much CPU."""
    try:
        uvloop: Any = importlib.import_module("uvloop")
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def _get_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread  # one loop per process, created on first use
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = _new_loop()
            thread = threading.Thread(target=loop.run_forever, name="tidemq-client", daemon=True)
            thread.start()
            _loop, _thread = loop, thread
        return _loop


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    loop = _get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("a sync tidemq call from the client loop itself would deadlock")
    return asyncio.run_coroutine_threadsafe(coro, loop)


def run(coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
    return submit(coro).result(timeout_s)


def call_soon(callback: Callable[..., object], *args: Any) -> None:
    """Run `callback(*args)` on the client loop, soon (one loop wake-up, no task)."""
    loop = _loop
    if loop is None or loop.is_closed():
        loop = _get_loop()
    if threading.current_thread() is _thread:
        raise RuntimeError("a sync tidemq call from the client loop itself would deadlock")
    loop.call_soon_threadsafe(callback, *args)


def in_client_thread() -> bool:
    """Whether the caller runs on the client loop's thread (where a blocking call would
    stall every client object of the process)."""
    return threading.current_thread() is _thread
