"""`InFlightMoves`: a saved scan position never passes a move between its write and its
mark, on a real store."""

from __future__ import annotations

from pathlib import Path

from tidemq.broker.moves import InFlightMoves
from tidemq.core.batch import encode_values
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import MessageStore


def test_the_scan_position_stays_before_moves_in_flight(tmp_path: Path) -> None:
    store = MessageStore.open(StoreConfig(data_dir=tmp_path / "data", retention_ms=-1))
    try:
        store.create_topic("t", 1)
        store.append("t", 0, encode_values([b"before"], timestamp_ms=1))
        moves = InFlightMoves()
        assert moves.scan_position(store.end_position) == store.end_position
        start = store.end_position
        with moves.writing(store):
            store.append("t", 0, encode_values([b"moved"], timestamp_ms=1))
            store.flush()
            # Durable, not marked yet: a state saved now must scan from the move's start.
            assert store.flushed_position > start
            assert moves.scan_position(store.flushed_position) == start
            assert len(moves) == 1
            with moves.writing(store):  # a second one, later in the log
                assert moves.scan_position(store.end_position) == start
        assert len(moves) == 0
        assert moves.scan_position(store.flushed_position) == store.flushed_position
        try:
            with moves.writing(store):
                raise RuntimeError("the write failed")
        except RuntimeError:
            pass
        assert len(moves) == 0  # a failed move leaves nothing behind
    finally:
        store.close()
