"""Blocking calls run in a thread that a cancellation of their caller cannot outlive.

`asyncio.to_thread` lets a cancelled caller go on at once while its call still runs in
the thread (a thread cannot be stopped): a follower cancelled in the middle of
`store.flush` would then close the store under the flush, and a member cancelled in the
middle of `MessageStore.open` would leave a store open that nobody closes, its
directory unlocked for the next owner. `finish_in_thread` makes the cancellation wait
for the call to end first, and hands an unwanted result to `discard`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TypeVar

__all__ = ["finish_in_thread"]

T = TypeVar("T")


async def finish_in_thread(
    call: Callable[[], T], *, discard: Callable[[T], None] | None = None
) -> T:
    """`call()` in a thread. When the caller is cancelled meanwhile, the cancellation
    propagates only once `call` has returned or raised; a result it returned then goes
    to `discard` (to close what it opened), and an error it raised is dropped (the
    caller is going away; it wanted neither)."""
    done = asyncio.ensure_future(asyncio.to_thread(call))
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        await asyncio.wait([done])
        if not done.cancelled() and done.exception() is None and discard is not None:
            with contextlib.suppress(Exception):
                discard(done.result())
        raise
