"""The transaction state machine, as a table.

Every request that touches a transaction (a send, a commit, a rollback, from the producer or
from a check-back answer) looks up `(state, event)` here; the service does what the row
says. Unlisted pairs cannot happen. Keeping it a table means the tests can check the
service against it row by row, and a reader can see every answer in one place.

======================  ==========  ======================================================
state                   event       answer
======================  ==========  ======================================================
OPEN                    SEND        accept: write a half batch
OPEN                    COMMIT      end: write the decision, publish, -> COMMITTED
OPEN                    ROLLBACK    end: write the decision, -> ROLLED_BACK
ENDING                  SEND        refuse: TransactionStateError (the end has begun)
ENDING                  COMMIT      wait for the end in progress, then answer again
ENDING                  ROLLBACK    wait for the end in progress, then answer again
COMMITTED               SEND        refuse: TransactionStateError
COMMITTED               COMMIT      already: answer as the first commit did
COMMITTED               ROLLBACK    refuse: TransactionStateError (it was committed)
ROLLED_BACK             SEND        refuse: TransactionStateError
ROLLED_BACK             COMMIT      refuse: TransactionStateError (it was rolled back)
ROLLED_BACK             ROLLBACK    already: nothing to do
======================  ==========  ======================================================

A check-back answer is a COMMIT or ROLLBACK event like the producer's own; because both
run on the broker's one event loop through this table, an end racing a check-back
(RocketMQ #8158) is decided once, by whichever came first.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["TRANSITIONS", "Answer", "TxnEvent", "TxnState"]


class TxnState(StrEnum):
    OPEN = "open"
    ENDING = "ending"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"


class TxnEvent(StrEnum):
    SEND = "send"
    COMMIT = "commit"
    ROLLBACK = "rollback"


class Answer(StrEnum):
    ACCEPT = "accept"
    END = "end"
    WAIT = "wait"
    ALREADY = "already"
    REFUSE = "refuse"


S, E, A = TxnState, TxnEvent, Answer

TRANSITIONS: Final[dict[tuple[TxnState, TxnEvent], Answer]] = {
    (S.OPEN, E.SEND): A.ACCEPT,
    (S.OPEN, E.COMMIT): A.END,
    (S.OPEN, E.ROLLBACK): A.END,
    (S.ENDING, E.SEND): A.REFUSE,
    (S.ENDING, E.COMMIT): A.WAIT,
    (S.ENDING, E.ROLLBACK): A.WAIT,
    (S.COMMITTED, E.SEND): A.REFUSE,
    (S.COMMITTED, E.COMMIT): A.ALREADY,
    (S.COMMITTED, E.ROLLBACK): A.REFUSE,
    (S.ROLLED_BACK, E.SEND): A.REFUSE,
    (S.ROLLED_BACK, E.COMMIT): A.REFUSE,
    (S.ROLLED_BACK, E.ROLLBACK): A.ALREADY,
}
