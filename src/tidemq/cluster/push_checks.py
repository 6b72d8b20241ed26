"""What a name server checks before it keeps a SECURITY_PUSH (ADR 20, ADR 26).

* Every push: tables written under an older writer term than the tables held are a
  deposed writer's, and are refused (WriterFenced, both terms named).
* A writer's confirmation (`writer_term` set): accepted only from the broker holding that
  term here (a name server that has granted a newer term confirms nothing older:
  writer_terms.py `confirms`), of tables written under that term or before, not older
  than the tables held (a writer behind is told to catch up), and only while the live
  brokers list the same name servers (name_server_sets.py).

Not thread-safe. No I/O but the log line of a disagreement (once per change of it).
"""

from __future__ import annotations

import logging

from tidemq.cluster.name_server_sets import NameServerSets
from tidemq.cluster.nameserver import NameServer
from tidemq.cluster.security_holder import SecurityHolder
from tidemq.core.errors import BrokerNotAvailable, ConfigError, InvalidRequest, WriterFenced
from tidemq.protocol.security_messages import SecurityPushRequest, counter_text, term_of

__all__ = ["PushChecks"]

log = logging.getLogger(__name__)


class PushChecks:
    def __init__(self, nameserver: NameServer, security: SecurityHolder, sets: NameServerSets):
        self._nameserver = nameserver
        self._security = security
        self._sets = sets
        self._logged_disagreement = ""

    def check(self, header: SecurityPushRequest) -> None:
        """Raise what the push is refused with; return if it may be offered."""
        self._check_term(header)
        if header.writer_term:
            self._check_writer(header)

    def _check_term(self, header: SecurityPushRequest) -> None:
        """(Term 0, tables from before any term, are older than any held and simply not
        kept, as before ADR 20.)"""
        written = term_of(header.snapshot.counter)
        held = term_of(self._security.held[0])
        if 0 < written < held:
            raise WriterFenced(
                f"SECURITY_PUSH from {header.broker_name} refused: its users and ACL "
                f"entries were written under writer term {written}, and this name server "
                f"holds tables of term {held} (a newer writer's); pull those instead"
            )

    def _check_writer(self, header: SecurityPushRequest) -> None:
        snapshot = header.snapshot
        self._check_sets(header.broker_name)
        if term_of(snapshot.counter) > header.writer_term:
            raise InvalidRequest(
                f"SECURITY_PUSH from {header.broker_name}: tables of writer term "
                f"{term_of(snapshot.counter)} confirmed under term {header.writer_term}"
            )
        why = self._nameserver.confirms_writer(
            header.broker_name, header.writer_term, snapshot.counter
        )
        if why:
            raise WriterFenced(
                f"SECURITY_PUSH from {header.broker_name} under writer term "
                f"{header.writer_term} not confirmed: {why}"
            )
        held = self._security.held
        if (snapshot.counter, snapshot.digest) < held:
            raise BrokerNotAvailable(
                f"SECURITY_PUSH from {header.broker_name}: this name server holds users "
                f"and ACL entries version {counter_text(held[0])}, newer than "
                f"{counter_text(snapshot.counter)}; pull them and retry"
            )

    def registered(self, broker: str, list_digest: int) -> None:
        """A registration's name-server list (a warning if it disagrees with others')."""
        if self._sets.report(broker, list_digest):
            self._disagreement()

    def _disagreement(self) -> str:
        disagreement = self._sets.disagreement(self._nameserver.brokers())
        if disagreement != self._logged_disagreement:
            self._logged_disagreement = disagreement
            if disagreement:
                log.warning(
                    "changes of users and ACL entries will not be confirmed: %s", disagreement
                )
        return disagreement

    def _check_sets(self, broker: str) -> None:
        disagreement = self._disagreement()
        if disagreement:
            raise ConfigError(f"SECURITY_PUSH from {broker} not confirmed: {disagreement}")
