"""The epoch history: begun epochs survive a reopen, `end_of` answers where a member's
share of an epoch ends, truncation drops the epochs that began past the cut, and a
damaged file is an error rather than an empty history."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.core.errors import CorruptRecordError
from tidemq.store.epoch_file import EPOCH_FILE, EpochEntry, EpochHistory
from tidemq.store.files import OsFileSystem


def _history(tmp_path: Path) -> EpochHistory:
    return EpochHistory(OsFileSystem(), tmp_path)


def test_epochs_are_kept_in_order_and_survive_a_reopen(tmp_path: Path) -> None:
    h = _history(tmp_path)
    assert h.latest is None
    h.begin(1, 0)
    h.begin(1, 0)  # the same again: no change
    h.begin(3, 500)
    h.begin(4, 500)  # an epoch that wrote nothing, then the next at the same place
    with pytest.raises(CorruptRecordError, match="does not follow"):
        h.begin(2, 900)  # older epoch
    with pytest.raises(CorruptRecordError, match="does not follow"):
        h.begin(5, 400)  # before the latest start
    assert _history(tmp_path).entries == [EpochEntry(1, 0), EpochEntry(3, 500), EpochEntry(4, 500)]


def test_end_of_is_where_the_next_epoch_begins(tmp_path: Path) -> None:
    h = _history(tmp_path)
    h.begin(2, 100)
    h.begin(5, 700)
    log_end = 1000
    assert h.end_of(5, log_end) == (5, log_end)
    assert h.end_of(9, log_end) == (5, log_end)  # a newer epoch than any here
    assert h.end_of(2, log_end) == (2, 700)
    assert h.end_of(4, log_end) == (2, 700)  # epochs 3-4 never wrote here: 2's end
    assert h.end_of(1, log_end) == (-1, 0)  # older than everything here


def test_truncation_drops_the_epochs_that_began_past_the_cut(tmp_path: Path) -> None:
    h = _history(tmp_path)
    h.begin(1, 0)
    h.begin(2, 300)
    h.begin(3, 600)
    h.truncate_to(300)
    assert h.entries == [EpochEntry(1, 0), EpochEntry(2, 300)]
    assert _history(tmp_path).entries == h.entries
    h.replace([EpochEntry(1, 0), EpochEntry(4, 450)])
    assert _history(tmp_path).latest == EpochEntry(4, 450)
    with pytest.raises(CorruptRecordError):
        h.replace([EpochEntry(4, 450), EpochEntry(4, 460)])


@pytest.mark.parametrize("damage", ["flip", "cut", "magic"])
def test_a_damaged_file_is_an_error_not_an_empty_history(tmp_path: Path, damage: str) -> None:
    h = _history(tmp_path)
    h.begin(1, 0)
    h.begin(2, 64)
    path = tmp_path / EPOCH_FILE
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-10] ^= 1
    elif damage == "cut":
        del data[-3:]
    else:
        data[0:4] = b"XXXX"
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="epoch file"):
        _history(tmp_path)
