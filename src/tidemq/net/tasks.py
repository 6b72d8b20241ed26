"""Stopping background tasks without swallowing the caller's own cancellation.

The usual idiom, `task.cancel()` then `with suppress(CancelledError): await task`, has a
trap: if the *caller* is cancelled while it waits (a timeout around `close()`, a shutdown
that cancels everything), the CancelledError it gets is its own, and the `suppress`
swallows it. The caller then carries on as if nothing happened: its timeout never fires,
and a test bounded by one passes after the bound instead of failing. `cancel_and_wait`
tells the two apart with `Task.cancelling()` (Python 3.11): the stopped task's
cancellation is expected; the caller's is re-raised. It compares the count with the one
at the call, not with zero: cleanup code that runs in a task cancelled earlier (in a
`finally`, or after catching CancelledError) still has a count above zero, and its waits
must not end early on a cancellation already delivered.

Re-raising has its own trap: a `stop()` cancelled in the middle skips the rest of its
cleanup (a store left open and locked, sockets never closed). Methods that clean up are
decorated with `completes_when_cancelled`: their body runs to its end in a task of its
own, and the caller's cancellation propagates once it has.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


async def cancel_and_wait(
    *tasks: asyncio.Future[Any] | None,
    ignore: tuple[type[Exception], ...] = (),
) -> None:
    """Cancel `tasks` (None entries skipped) and wait until each has ended.

    A task that ends with one of `ignore` is taken as ended; any other exception from it
    propagates after every task has been waited for. The caller's own cancellation
    propagates at once."""
    live = [t for t in tasks if t is not None]
    before = _cancel_requests()
    for task in live:
        task.cancel()
    error: BaseException | None = None
    for task in live:
        try:
            await task
        except asyncio.CancelledError:
            if _cancel_requests() > before:
                raise
        except ignore:
            pass
        except Exception as exc:
            error = error or exc
    if error is not None:
        raise error


def _cancel_requests() -> int:
    current = asyncio.current_task()
    return 0 if current is None else current.cancelling()


def completes_when_cancelled(
    fn: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """Decorate a cleanup coroutine (stop, close): a cancellation of its caller waits for
    the body to finish, then propagates. A second cancellation while it waits leaves the
    body running to its end in the background."""

    @functools.wraps(fn)
    async def run_to_the_end(*args: P.args, **kwargs: P.kwargs) -> R:
        body = asyncio.ensure_future(fn(*args, **kwargs))
        try:
            return await asyncio.shield(body)
        except asyncio.CancelledError:
            await asyncio.wait([body])
            if not body.cancelled():
                body.exception()  # retrieved: the caller's cancellation is what it gets
            raise

    return run_to_the_end
