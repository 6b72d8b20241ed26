"""Broker metadata in SQLite (WAL mode): topics, queue state, consumer offsets, producer state.

Each change is one small transaction (`synchronous=FULL`: durable when `commit` returns),
instead of rewriting a whole JSON file on every change as RocketMQ does. Data never lives
here; only what describes it.

A full disk: every write maps SQLite's "database or disk is full" (SQLITE_FULL) and
ENOSPC/EDQUOT to DiskFull (retriable), rolls its transaction back, and leaves the
database usable; the first such failure is logged, and the first write that succeeds
after it, not every failed write.

Tables::

    topics(id PK AUTOINCREMENT, name, queues, message_type, cleanup_policy, retention_ms,
           retention_bytes, config JSON, created_ms, deleted_ms)   ids are never reused
    queue_state(topic_id, queue_id, min_offset)                    retention's low mark
    queue_index_end(topic_id, queue_id, next_offset)               each index's end at a
                                                                   checkpoint (recovery's
                                                                   check for lost entries)
    consumer_offsets(group_name, topic, queue_id, next_offset, updated_ms)
    compacted_logs(topic_id, queue_id, generation, start_offset,   each compact queue's
                   end_offset)                                     compacted log (switched
                                                                   with queue_state's min)
    producer_state(topic_id, queue_id, producer_id, epoch, window JSON, position)
    counters(name, value)                                          producer id allocation;
                                                                   offsets_applied: where
                                                                   consumer_offsets stands
                                                                   in the offset book;
                                                                   tables_applied: where
                                                                   remote_ranges and
                                                                   static_chains stand in
                                                                   %SYS%TABLES
    users(name, salt, iterations, stored_key, server_key)          SCRAM credentials
    acls(principal, resource_type, resource_name, pattern_type,    ACL entries (core/acl.py),
         operation, permission, host)                              as their enum values
    service_state['security.counter']                              users' and ACLs' version
                                                                   counter (ADR 15)
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import re
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from tidemq.core import limits
from tidemq.core.errors import (
    ConfigError,
    DiskFull,
    InvalidTopicName,
    TopicAlreadyExists,
    TopicNotFound,
)
from tidemq.core.names import NAME_RULE

__all__ = ["CleanupPolicy", "MessageType", "Metadata", "TopicInfo", "validate_topic_name"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    queues INTEGER NOT NULL,
    message_type TEXT NOT NULL,
    cleanup_policy TEXT NOT NULL,
    retention_ms INTEGER,
    retention_bytes INTEGER,
    config TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    deleted_ms INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS topics_live_name ON topics(name) WHERE deleted_ms IS NULL;
CREATE TABLE IF NOT EXISTS queue_state (
    topic_id INTEGER NOT NULL, queue_id INTEGER NOT NULL, min_offset INTEGER NOT NULL,
    PRIMARY KEY (topic_id, queue_id)
);
CREATE TABLE IF NOT EXISTS queue_index_end (
    topic_id INTEGER NOT NULL, queue_id INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (topic_id, queue_id)
);
CREATE TABLE IF NOT EXISTS compacted_logs (
    topic_id INTEGER NOT NULL, queue_id INTEGER NOT NULL, generation INTEGER NOT NULL,
    start_offset INTEGER NOT NULL, end_offset INTEGER NOT NULL,
    PRIMARY KEY (topic_id, queue_id)
);
CREATE TABLE IF NOT EXISTS static_chains (
    topic_id INTEGER NOT NULL, queue_id INTEGER NOT NULL, writable INTEGER NOT NULL,
    chain BLOB NOT NULL,
    PRIMARY KEY (topic_id, queue_id)
);
CREATE TABLE IF NOT EXISTS remote_ranges (
    topic_id INTEGER NOT NULL, queue_id INTEGER NOT NULL, log_start INTEGER NOT NULL,
    remote_end INTEGER NOT NULL,
    PRIMARY KEY (topic_id, queue_id)
);
CREATE TABLE IF NOT EXISTS consumer_offsets (
    group_name TEXT NOT NULL, topic TEXT NOT NULL, queue_id INTEGER NOT NULL,
    next_offset INTEGER NOT NULL, updated_ms INTEGER NOT NULL,
    PRIMARY KEY (group_name, topic, queue_id)
);
CREATE TABLE IF NOT EXISTS producer_state (
    topic_id INTEGER NOT NULL, queue_id INTEGER NOT NULL, producer_id INTEGER NOT NULL,
    epoch INTEGER NOT NULL, window TEXT NOT NULL,
    PRIMARY KEY (topic_id, queue_id, producer_id)
);
-- Read only: producer ids' owners as versions before PRODUCERS_TOPIC kept them.
CREATE TABLE IF NOT EXISTS producer_owners (
    producer_id INTEGER PRIMARY KEY, principal TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS service_state (name TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY, salt BLOB NOT NULL, iterations INTEGER NOT NULL,
    stored_key BLOB NOT NULL, server_key BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS acls (
    principal TEXT NOT NULL, resource_type TEXT NOT NULL, resource_name TEXT NOT NULL,
    pattern_type TEXT NOT NULL, operation TEXT NOT NULL, permission TEXT NOT NULL,
    host TEXT NOT NULL,
    PRIMARY KEY (principal, resource_type, resource_name, pattern_type, operation,
                 permission, host)
);
"""

_NAME = re.compile(limits.TOPIC_NAME_PATTERN)

log = logging.getLogger(__name__)

#: service_state key of the users' and ACL entries' version counter (8 bytes, big-endian).
_SECURITY_COUNTER = "security.counter"
#: SQLite's primary result code for "database or disk is full".
_SQLITE_FULL = 13
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == _SQLITE_FULL:
            return True
        return "database or disk is full" in str(exc)
    return False


def _writes(
    method: Callable[Concatenate[Metadata, _P], _R],
) -> Callable[Concatenate[Metadata, _P], _R]:
    """A metadata write: a full disk raises DiskFull (see the module doc)."""

    @functools.wraps(method)
    def write(self: Metadata, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            result = method(self, *args, **kwargs)
        except (sqlite3.Error, OSError) as exc:
            if not _is_disk_full(exc):
                raise
            self._disk_full_now(method.__name__, exc)
            raise DiskFull(
                f"metadata write ({method.__name__}) failed: the disk is full ({exc}); "
                "retry when space is freed"
            ) from None
        if self.disk_full:
            self.disk_full = False
            log.warning("metadata writes succeed again (disk space was freed)")
        return result

    return write


class MessageType(StrEnum):
    #: Accepts every kind of message: the default for topics that declare nothing.
    MIXED = "MIXED"
    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"


class CleanupPolicy(StrEnum):
    DELETE = "delete"
    COMPACT = "compact"
    COMPACT_DELETE = "compact,delete"


@dataclass(frozen=True, slots=True)
class TopicInfo:
    id: int
    name: str
    queues: int
    message_type: MessageType = MessageType.MIXED
    cleanup_policy: CleanupPolicy = CleanupPolicy.DELETE
    #: None: the store's default. -1: keep forever.
    retention_ms: int | None = None
    retention_bytes: int | None = None
    config: Mapping[str, str] = field(default_factory=dict)
    created_ms: int = 0


def validate_topic_name(name: str) -> None:
    """A user topic name or one of the broker's internal names (`tidemq.core.names`)."""
    if not _NAME.match(name):
        raise InvalidTopicName(f"invalid topic name {name[:140]!r}: use {NAME_RULE}")


def _check_retention(key: str, value: int | None) -> None:
    if value is not None and value < -1:
        raise ConfigError(f"topic {key} must be -1 (keep forever) or >= 0, got {value}")


class Metadata:
    """The metadata database of one broker. Single writer."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        #: The last write failed for want of disk space (logged once per change).
        self.disk_full = False

    def _disk_full_now(self, what: str, exc: BaseException) -> None:
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
        if not self.disk_full:
            self.disk_full = True
            log.warning(
                "metadata writes fail: the disk is full (%s: %s); they are refused with "
                "DiskFull until space is freed",
                what,
                exc,
            )

    def close(self) -> None:
        self._db.close()

    # ------------------------------------------------------------------ topics

    @_writes
    def create_topic(self, info: TopicInfo) -> TopicInfo:
        return self.topic_by_id(self._insert_topic(info))

    @_writes
    def create_topics(self, infos: list[TopicInfo], *, keep_ids: bool = False) -> list[TopicInfo]:
        """Several topics in one transaction (one fsync, not one per topic: creating
        100,000 topics is a few such calls). All or none: TopicAlreadyExists names the
        first that exists. `keep_ids`: under the ids given (a replica mirroring its
        leader's topics), else new ones."""
        with self._tx():
            ids = [self._insert_topic(info, keep_id=keep_ids) for info in infos]
        return [self.topic_by_id(i) for i in ids]

    def max_topic_id(self) -> int:
        """The highest topic id ever given here, deleted topics included (0: none)."""
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'topics'").fetchone()
        return 0 if row is None else int(row[0])

    @_writes
    def note_topic_id(self, topic_id: int) -> None:
        """Never give an id at or below `topic_id` (a replica's leader gave it: ids stay
        unique across the group when this member leads)."""
        with self._tx():
            if (
                self._db.execute(
                    "UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'topics'",
                    (topic_id,),
                ).rowcount
                == 0
            ):
                self._db.execute(
                    "INSERT INTO sqlite_sequence (name, seq) VALUES ('topics', ?)", (topic_id,)
                )

    def _insert_topic(self, info: TopicInfo, *, keep_id: bool = False) -> int:
        validate_topic_name(info.name)
        if not 1 <= info.queues <= limits.MAX_QUEUES_PER_TOPIC:
            raise ConfigError(
                f"topic {info.name!r}: queues must be 1..{limits.MAX_QUEUES_PER_TOPIC}, "
                f"got {info.queues}"
            )
        _check_retention("retention.ms", info.retention_ms)
        _check_retention("retention.bytes", info.retention_bytes)
        try:
            cur = self._db.execute(
                "INSERT INTO topics (id, name, queues, message_type, cleanup_policy, "
                "retention_ms, retention_bytes, config, created_ms) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    info.id if keep_id else None,
                    info.name,
                    info.queues,
                    info.message_type.value,
                    info.cleanup_policy.value,
                    info.retention_ms,
                    info.retention_bytes,
                    json.dumps(dict(info.config)),
                    info.created_ms,
                ),
            )
        except sqlite3.IntegrityError:
            raise TopicAlreadyExists(f"topic {info.name!r} already exists") from None
        assert cur.lastrowid is not None
        return cur.lastrowid

    def _row_to_topic(self, row: tuple[Any, ...]) -> TopicInfo:
        tid, name, queues, mtype, policy, rms, rbytes, config, created = row
        return TopicInfo(
            id=int(tid),
            name=str(name),
            queues=int(queues),
            message_type=MessageType(mtype),
            cleanup_policy=CleanupPolicy(policy),
            retention_ms=None if rms is None else int(rms),
            retention_bytes=None if rbytes is None else int(rbytes),
            config=json.loads(str(config)),
            created_ms=int(created),
        )

    _COLS = (
        "id, name, queues, message_type, cleanup_policy, retention_ms, retention_bytes, "
        "config, created_ms"
    )

    def topic_by_id(self, topic_id: int) -> TopicInfo:
        row = self._db.execute(
            f"SELECT {self._COLS} FROM topics WHERE id = ?", (topic_id,)
        ).fetchone()
        if row is None:
            raise TopicNotFound(f"topic id {topic_id} does not exist")
        return self._row_to_topic(row)

    def live_topics(self) -> list[TopicInfo]:
        rows = self._db.execute(
            f"SELECT {self._COLS} FROM topics WHERE deleted_ms IS NULL ORDER BY name"
        ).fetchall()
        return [self._row_to_topic(r) for r in rows]

    @_writes
    def update_topic(self, info: TopicInfo) -> None:
        _check_retention("retention.ms", info.retention_ms)
        _check_retention("retention.bytes", info.retention_bytes)
        self._db.execute(
            "UPDATE topics SET queues = ?, cleanup_policy = ?, retention_ms = ?,"
            " retention_bytes = ?, config = ? WHERE id = ? AND deleted_ms IS NULL",
            (
                info.queues,
                info.cleanup_policy.value,
                info.retention_ms,
                info.retention_bytes,
                json.dumps(dict(info.config)),
                info.id,
            ),
        )

    @_writes
    def mark_deleted(self, topic_id: int, now_ms: int) -> None:
        with self._tx():
            self._db.execute("UPDATE topics SET deleted_ms = ? WHERE id = ?", (now_ms, topic_id))
            # Offsets are kept by topic name: left behind, a group would resume a topic
            # created later under the same name at offsets that mean nothing there.
            self._db.execute(
                "DELETE FROM consumer_offsets WHERE topic = (SELECT name FROM topics WHERE id = ?)",
                (topic_id,),
            )
            self._db.execute("DELETE FROM queue_state WHERE topic_id = ?", (topic_id,))
            self._db.execute("DELETE FROM queue_index_end WHERE topic_id = ?", (topic_id,))
            self._db.execute("DELETE FROM compacted_logs WHERE topic_id = ?", (topic_id,))
            self._db.execute("DELETE FROM static_chains WHERE topic_id = ?", (topic_id,))
            self._db.execute("DELETE FROM remote_ranges WHERE topic_id = ?", (topic_id,))
            self._db.execute("DELETE FROM producer_state WHERE topic_id = ?", (topic_id,))

    # ------------------------------------------------------------------ queue state

    def queue_min_offsets(self) -> dict[tuple[int, int], int]:
        rows = self._db.execute("SELECT topic_id, queue_id, min_offset FROM queue_state")
        return {(t, q): m for t, q, m in rows}

    @_writes
    def set_queue_min_offsets(self, values: Mapping[tuple[int, int], int]) -> None:
        with self._tx():
            self._db.executemany(
                "INSERT OR REPLACE INTO queue_state VALUES (?, ?, ?)",
                [(t, q, m) for (t, q), m in values.items()],
            )

    def queue_index_ends(self) -> dict[tuple[int, int], int]:
        """Each queue's next offset as of a checkpoint: its index files, once recovery has
        cut them at the checkpoint, must reach at least this far."""
        rows = self._db.execute("SELECT topic_id, queue_id, next_offset FROM queue_index_end")
        return {(t, q): n for t, q, n in rows}

    @_writes
    def set_queue_index_ends(self, values: Mapping[tuple[int, int], int]) -> None:
        with self._tx():
            self._db.executemany(
                "INSERT OR REPLACE INTO queue_index_end VALUES (?, ?, ?)",
                [(t, q, n) for (t, q), n in values.items()],
            )

    def compacted_logs(self) -> dict[tuple[int, int], tuple[int, int, int]]:
        """(generation, start offset, end offset) of each queue's current compacted log."""
        rows = self._db.execute(
            "SELECT topic_id, queue_id, generation, start_offset, end_offset FROM compacted_logs"
        )
        return {(t, q): (g, s, e) for t, q, g, s, e in rows}

    @_writes
    def set_compacted_log(
        self, topic_id: int, queue_id: int, generation: int, start: int, end: int
    ) -> None:
        """Switch a queue to a compacted-log generation: with the commit-log index's min
        offset, in one transaction (the switch compaction's crash safety rests on)."""
        with self._tx():
            self._db.execute(
                "INSERT OR REPLACE INTO compacted_logs VALUES (?, ?, ?, ?, ?)",
                (topic_id, queue_id, generation, start, end),
            )
            self._db.execute(
                "INSERT INTO queue_state VALUES (?, ?, ?) ON CONFLICT (topic_id, queue_id)"
                " DO UPDATE SET min_offset = MAX(min_offset, excluded.min_offset)",
                (topic_id, queue_id, end),
            )

    def static_chains(self) -> dict[tuple[int, int], tuple[bool, bytes]]:
        """(writable here, encoded chain) of each static queue this broker holds links of."""
        rows = self._db.execute("SELECT topic_id, queue_id, writable, chain FROM static_chains")
        return {(t, q): (bool(w), bytes(c)) for t, q, w, c in rows}

    @_writes
    def set_static_chain(self, topic_id: int, queue_id: int, writable: bool, chain: bytes) -> None:
        with self._tx():
            self._db.execute(
                "INSERT OR REPLACE INTO static_chains VALUES (?, ?, ?, ?)",
                (topic_id, queue_id, int(writable), chain),
            )

    def remote_ranges(self) -> dict[tuple[int, int], tuple[int, int]]:
        """(log start, remote end) of each queue with offloaded data (tiered storage)."""
        rows = self._db.execute(
            "SELECT topic_id, queue_id, log_start, remote_end FROM remote_ranges"
        )
        return {(t, q): (s, e) for t, q, s, e in rows}

    @_writes
    def set_remote_range(self, topic_id: int, queue_id: int, log_start: int, end: int) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO remote_ranges VALUES (?, ?, ?, ?)",
            (topic_id, queue_id, log_start, end),
        )

    # ------------------------------------------------------------------ consumer offsets

    @_writes
    def commit_offsets(
        self, group: str, offsets: Mapping[tuple[str, int], int], now_ms: int
    ) -> None:
        with self._tx():
            self._db.executemany(
                "INSERT OR REPLACE INTO consumer_offsets VALUES (?, ?, ?, ?, ?)",
                [(group, t, q, o, now_ms) for (t, q), o in offsets.items()],
            )

    def committed_offsets(self, group: str) -> dict[tuple[str, int], int]:
        rows = self._db.execute(
            "SELECT topic, queue_id, next_offset FROM consumer_offsets WHERE group_name = ?",
            (group,),
        )
        return {(t, q): o for t, q, o in rows}

    def committed_offsets_with_time(self, group: str) -> dict[tuple[str, int], tuple[int, int]]:
        """(topic, queue) -> (next offset, when it was committed, epoch ms)."""
        rows = self._db.execute(
            "SELECT topic, queue_id, next_offset, updated_ms FROM consumer_offsets"
            " WHERE group_name = ?",
            (group,),
        )
        return {(t, q): (o, ms) for t, q, o, ms in rows}

    def groups(self) -> list[str]:
        rows = self._db.execute("SELECT DISTINCT group_name FROM consumer_offsets ORDER BY 1")
        return [r[0] for r in rows]

    @_writes
    def delete_group(self, group: str) -> None:
        self._db.execute("DELETE FROM consumer_offsets WHERE group_name = ?", (group,))

    # The broker's offset book (`broker/offset_book.py`) keeps committed offsets as records
    # of a compact internal topic, which replicates with the log; `consumer_offsets` is
    # then its view, and the counter `offsets_applied` the topic's offset the view has
    # reached. Both change in one transaction, so the view is never ahead or behind it.

    def offsets_applied(self) -> int | None:
        """Where the offset book's view stands in its topic; None: no book yet (a data
        directory of a version that kept offsets here only)."""
        row = self._db.execute(
            "SELECT value FROM counters WHERE name = 'offsets_applied'"
        ).fetchone()
        return None if row is None else int(row[0])

    @_writes
    def apply_offsets(
        self, rows: Iterable[tuple[str, str, int, int | None, int]], applied: int
    ) -> None:
        """(group, topic, queue, offset, commit ms) rows into the view, offset None
        removing the row; the view then stands at `applied`."""
        with self._tx():
            for group, topic, queue, offset, ms in rows:
                if offset is None:
                    self._db.execute(
                        "DELETE FROM consumer_offsets "
                        "WHERE group_name = ? AND topic = ? AND queue_id = ?",
                        (group, topic, queue),
                    )
                else:
                    self._db.execute(
                        "INSERT OR REPLACE INTO consumer_offsets VALUES (?, ?, ?, ?, ?)",
                        (group, topic, queue, offset, ms),
                    )
            self._db.execute(
                "INSERT OR REPLACE INTO counters VALUES ('offsets_applied', ?)", (applied,)
            )

    def tables_applied(self) -> int | None:
        """Where the tier ranges and static chains stand in their replicated topic
        (`broker/member_tables.py`); None: never read from it."""
        row = self._db.execute("SELECT value FROM counters WHERE name = 'tables_applied'")
        found = row.fetchone()
        return None if found is None else int(found[0])

    @_writes
    def set_tables_applied(self, applied: int) -> None:
        with self._tx():
            self._db.execute(
                "INSERT OR REPLACE INTO counters VALUES ('tables_applied', ?)", (applied,)
            )

    @_writes
    def forget_log_state(self) -> None:
        """Drop every row derived from the commit log (a replica starting over at its
        leader's log start, `start_over.py`): queue bounds, index ends, compacted logs,
        producer windows, the offset book's view (and where the tables' topic was read to).
        Topics, other counters, users, ACLs, service state, static chains and remote
        ranges stay."""
        with self._tx():
            for table in (
                "queue_state",
                "queue_index_end",
                "compacted_logs",
                "producer_state",
                "consumer_offsets",
            ):
                self._db.execute(f"DELETE FROM {table}")
            self._db.execute("INSERT OR REPLACE INTO counters VALUES ('offsets_applied', 0)")
            self._db.execute("DELETE FROM counters WHERE name = 'tables_applied'")

    @_writes
    def clear_offsets_view(self) -> None:
        """Empty the view, to rebuild it from the topic's start."""
        with self._tx():
            self._db.execute("DELETE FROM consumer_offsets")
            self._db.execute("INSERT OR REPLACE INTO counters VALUES ('offsets_applied', 0)")
            self._db.execute("DELETE FROM counters WHERE name = 'tables_applied'")

    def all_offsets(self) -> list[tuple[str, str, int, int, int]]:
        """Every (group, topic, queue, offset, commit ms) of the view."""
        return list(self._db.execute("SELECT * FROM consumer_offsets ORDER BY 1, 2, 3"))

    # ------------------------------------------------------------------ producers

    @_writes
    def last_producer_id(self) -> int:
        """The newest producer id handed out (0: none yet)."""
        row = self._db.execute("SELECT value FROM counters WHERE name = 'producer_id'").fetchone()
        return 0 if row is None else int(row[0])

    @_writes
    def note_producer_id(self, producer_id: int) -> None:
        """Never hand out an id at or below `producer_id` (a replica's leader issued it)."""
        self._db.execute(
            "INSERT INTO counters VALUES ('producer_id', ?) "
            "ON CONFLICT(name) DO UPDATE SET value = max(value, excluded.value)",
            (producer_id,),
        )

    @_writes
    def next_producer_id(self) -> int:
        with self._tx():
            self._db.execute(
                "INSERT INTO counters VALUES ('producer_id', 1) "
                "ON CONFLICT(name) DO UPDATE SET value = value + 1"
            )
            row = self._db.execute(
                "SELECT value FROM counters WHERE name = 'producer_id'"
            ).fetchone()
        return int(row[0])

    def load_producer_state(self) -> Iterable[tuple[int, int, int, int, list[list[int]]]]:
        rows = self._db.execute(
            "SELECT topic_id, queue_id, producer_id, epoch, window FROM producer_state"
        ).fetchall()
        return [(t, q, p, e, json.loads(w)) for t, q, p, e, w in rows]

    @_writes
    def save_producer_state(
        self, rows: Iterable[tuple[int, int, int, int, list[list[int]]]]
    ) -> None:
        with self._tx():
            self._db.executemany(
                "INSERT OR REPLACE INTO producer_state VALUES (?, ?, ?, ?, ?)",
                [(t, q, p, e, json.dumps(w)) for t, q, p, e, w in rows],
            )

    # ------------------------------------------------------------------ broker services

    def service_state(self, name: str) -> bytes | None:
        """The last state a broker service (timers, transactions) saved, or None."""
        row = self._db.execute("SELECT value FROM service_state WHERE name = ?", (name,)).fetchone()
        return None if row is None else bytes(row[0])

    @_writes
    def save_service_state(self, values: Mapping[str, bytes]) -> None:
        """Replace several services' states in one transaction."""
        with self._tx():
            self._db.executemany(
                "INSERT OR REPLACE INTO service_state VALUES (?, ?)", list(values.items())
            )

    @_writes
    def delete_service_state(self, names: Iterable[str]) -> None:
        """Forget the states of these services (their next start rebuilds from scratch)."""
        with self._tx():
            self._db.executemany(
                "DELETE FROM service_state WHERE name = ?", [(name,) for name in names]
            )

    def producer_owner(self, producer_id: int) -> str | None:
        """The user a producer id was issued to, as versions before the compact topic of
        owners (`broker/producer_owner_topic.py`) kept it; read only, for those ids."""
        row = self._db.execute(
            "SELECT principal FROM producer_owners WHERE producer_id = ?", (producer_id,)
        ).fetchone()
        return None if row is None else str(row[0])

    # ------------------------------------------------------------------ users (SCRAM)
    # Users and ACL entries are the cluster's (docs/adr/0015): each write may carry the
    # new version counter, kept in `service_state` in the same transaction, and a newer
    # version pulled from a name server replaces both tables at once.

    def users(self) -> list[tuple[str, bytes, int, bytes, bytes]]:
        """Every user's SCRAM credentials: (name, salt, iterations, stored key, server
        key), by name. Never a password: none is stored."""
        rows = self._db.execute(
            "SELECT name, salt, iterations, stored_key, server_key FROM users ORDER BY name"
        ).fetchall()
        return [(n, bytes(s), int(i), bytes(k), bytes(v)) for n, s, i, k, v in rows]

    @_writes
    def upsert_user(
        self,
        name: str,
        salt: bytes,
        iterations: int,
        stored_key: bytes,
        server_key: bytes,
        *,
        counter: int | None = None,
    ) -> None:
        """Create or replace a user; `counter`: the tables' new version counter."""
        with self._tx():
            self._db.execute(
                "INSERT OR REPLACE INTO users VALUES (?, ?, ?, ?, ?)",
                (name, salt, iterations, stored_key, server_key),
            )
            self._set_security_counter(counter)

    @_writes
    def delete_user(self, name: str, *, counter: int | None = None) -> bool:
        """Remove a user; False if there was none of that name."""
        with self._tx():
            gone = self._db.execute("DELETE FROM users WHERE name = ?", (name,)).rowcount > 0
            self._set_security_counter(counter if gone else None)
            return gone

    # ------------------------------------------------------------------ ACL entries

    def acls(self) -> list[tuple[str, str, str, str, str, str, str]]:
        """Every ACL entry: (principal, resource type, resource name, pattern type,
        operation, permission, host), as stored (the broker validates them)."""
        rows = self._db.execute(
            "SELECT principal, resource_type, resource_name, pattern_type, operation,"
            " permission, host FROM acls ORDER BY 1, 2, 3, 4, 5, 6, 7"
        ).fetchall()
        return [tuple(str(v) for v in row) for row in rows]  # type: ignore[misc]

    @_writes
    def add_acls(
        self,
        entries: Iterable[tuple[str, str, str, str, str, str, str]],
        *,
        counter: int | None = None,
    ) -> int:
        """Add entries (one transaction); the count that were not there already."""
        with self._tx():
            before = self._db.total_changes
            self._db.executemany("INSERT OR IGNORE INTO acls VALUES (?, ?, ?, ?, ?, ?, ?)", entries)
            added = self._db.total_changes - before
            self._set_security_counter(counter if added else None)
            return added

    @_writes
    def delete_acls(
        self,
        entries: Iterable[tuple[str, str, str, str, str, str, str]],
        *,
        counter: int | None = None,
    ) -> int:
        """Remove entries (one transaction); the count that were there."""
        with self._tx():
            before = self._db.total_changes
            self._db.executemany(
                "DELETE FROM acls WHERE principal = ? AND resource_type = ? AND"
                " resource_name = ? AND pattern_type = ? AND operation = ? AND"
                " permission = ? AND host = ?",
                entries,
            )
            removed = self._db.total_changes - before
            self._set_security_counter(counter if removed else None)
            return removed

    def security_counter(self) -> int:
        """The version counter of the users and ACL entries (0: never changed through the
        cluster's writer, nor replaced by a pulled version)."""
        value = self.service_state(_SECURITY_COUNTER)
        return 0 if value is None else int.from_bytes(value, "big")

    @_writes
    def replace_security(
        self,
        users: Iterable[tuple[str, bytes, int, bytes, bytes]],
        acls: Iterable[tuple[str, str, str, str, str, str, str]],
        *,
        counter: int,
    ) -> None:
        """Replace every user and ACL entry, and the version counter, in one transaction:
        a crash leaves the old version or the new one, never a mix."""
        with self._tx():
            self._db.execute("DELETE FROM users")
            self._db.execute("DELETE FROM acls")
            self._db.executemany("INSERT INTO users VALUES (?, ?, ?, ?, ?)", users)
            self._db.executemany("INSERT INTO acls VALUES (?, ?, ?, ?, ?, ?, ?)", acls)
            self._set_security_counter(counter)

    def _set_security_counter(self, counter: int | None) -> None:
        if counter is not None:
            self._db.execute(
                "INSERT OR REPLACE INTO service_state VALUES (?, ?)",
                (_SECURITY_COUNTER, counter.to_bytes(8, "big")),
            )

    # ------------------------------------------------------------------ helpers

    def _tx(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error:
                if self._db.in_transaction:  # else the next BEGIN would fail too
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise
        elif self._db.in_transaction:
            # SQLite may have rolled back already (SQLITE_FULL can); a failing ROLLBACK
            # must not hide the error that got here.
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
