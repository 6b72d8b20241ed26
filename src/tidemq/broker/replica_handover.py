"""A replica group's leader handing leadership over by hand (`tidemq cluster elect GROUP
--broker M`; docs/design/replication.md, "Handover"): refuse new writes, wait until M
holds the whole log durably (every waiting append is then committed and answered), then
name M the next leader and step down. Nothing acknowledged is lost, and the answer says
how long writes were refused."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from tidemq.core.errors import InvalidRequest, NotLeader, RequestTimeout
from tidemq.protocol.replica_messages import ElectLeaderRequest, ElectLeaderResponse

__all__ = ["Handover"]


class Handover:
    """One term's handover (at most one at a time). Runs on the loop."""

    def __init__(
        self, group: str, me: str, epoch: int, hand_over: Callable[[str], Awaitable[None]] | None
    ) -> None:
        """`hand_over(member)`: make `member` the next leader and step down (the node's
        part); None: this term cannot hand over."""
        self._group, self._me, self._epoch = group, me, epoch
        self._hand_over = hand_over
        #: The member leadership is being handed to ("" none): new writes are refused.
        self.member = ""

    def check_writable(self) -> None:
        """NotLeader (retriable) while leadership moves."""
        if self.member:
            raise NotLeader(
                f"group {self._group}: leadership is moving to {self.member}; retry at the "
                "group's new leader",
                group=self._group,
                current_epoch=self._epoch,
            )

    async def run(
        self,
        req: ElectLeaderRequest,
        *,
        in_sync: set[str],
        behind: Callable[[str], bool],
        reported: Callable[[], asyncio.Event],
    ) -> ElectLeaderResponse:
        """Hand leadership to `req.member`, an in-sync follower. `behind(member)`: the
        member does not hold the leader's whole log durably yet; `reported()`: an event
        set at the next follower report."""
        member = req.member
        if req.group != self._group:
            raise InvalidRequest(f"group {req.group!r}: this broker leads {self._group!r}")
        if member == self._me:
            raise InvalidRequest(f"{member} already leads group {self._group}")
        if member not in in_sync:
            raise InvalidRequest(
                f"{member} is not in sync (in sync: {', '.join(sorted(in_sync))}): only "
                "an in-sync member can lead without losing acknowledged messages"
            )
        if self.member or self._hand_over is None:
            raise InvalidRequest(f"group {self._group}: a handover is under way")
        self.member = member
        started = time.monotonic()
        try:
            async with asyncio.timeout(req.timeout_ms / 1000):
                while behind(member):
                    await reported().wait()
            paused_ms = (time.monotonic() - started) * 1000
            await self._hand_over(member)
        except TimeoutError:
            self.member = ""
            raise RequestTimeout(
                f"{member} did not reach the leader's log end in {req.timeout_ms} ms; "
                f"leadership stays with {self._me}"
            ) from None
        except BaseException:
            self.member = ""
            raise
        return ElectLeaderResponse(previous=self._me, epoch=self._epoch, paused_ms=paused_ms)
