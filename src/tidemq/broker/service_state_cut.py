"""A replica group member's saved service states after its log is cut.

A leader saves its services' states (timers, transactions, pop) with the position its log
had reached, flushed but maybe not committed by the group. Deposed, it cuts the suffix
the next leader does not have, and copies that leader's records in its place, at other
record boundaries. A state saved past the cut then names a position inside some copied
record: elected later, the member's broker rescanned the log from there, read garbage
as a record header (CorruptRecordError), could not lead, and gave the group up again
and again (found by the partition check's "leader cut off from etcd" fault, under which
a deposed leader goes on writing until its lease ends). Such a state also counts records
that no longer exist. It is forgotten at the cut: the services rebuild from their topics
and the whole log, until the leader's own state reaches this member.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from tidemq.broker.pop_service import PopService
from tidemq.broker.timer_service import TimerService
from tidemq.broker.transaction_service import TransactionService
from tidemq.store.message_store import MessageStore

__all__ = ["drop_states_past"]

#: Each saved service state's name (`Metadata.service_state`) and where it rescans from.
_SCAN_POSITION: Final[dict[str, Callable[[bytes | None], int]]] = {
    "timer": TimerService.scan_position,
    "transactions": TransactionService.scan_position,
    "pop": PopService.scan_position,
}


def drop_states_past(store: MessageStore, cut: int) -> list[str]:
    """Forget the saved service states whose rescan starts past `cut` (the log's new end
    after a cut); their names."""
    meta = store.metadata
    stale = [
        name
        for name, scan_position in _SCAN_POSITION.items()
        if (saved := meta.service_state(name)) is not None and scan_position(saved) > cut
    ]
    if stale:
        meta.delete_service_state(stale)
    return stale
