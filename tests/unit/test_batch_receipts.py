"""BatchReceipts: the receipts of one batch, built when read, equal to the list."""

from __future__ import annotations

import pytest

from tidemq.core.message import BatchReceipts, Receipt


def test_reads_like_the_list_of_receipts() -> None:
    receipts = BatchReceipts("orders", 2, 100, 4)
    expected = [Receipt("orders", 2, o) for o in range(100, 104)]
    assert len(receipts) == 4
    assert list(receipts) == expected
    assert receipts == expected
    assert expected == receipts
    assert receipts == tuple(expected)
    assert receipts[0] == expected[0]
    assert receipts[-1] == Receipt("orders", 2, 103)
    assert receipts[1:3] == expected[1:3]
    assert receipts[::-1] == expected[::-1]
    assert receipts[3].message_id == expected[3].message_id
    assert Receipt("orders", 2, 101) in receipts
    assert receipts.index(Receipt("orders", 2, 102)) == 2
    assert receipts == BatchReceipts("orders", 2, 100, 4)
    assert receipts != BatchReceipts("orders", 2, 101, 4)
    assert receipts != expected[:3]
    assert receipts != [*expected[:3], Receipt("orders", 2, 7)]
    assert "offset=103" in repr(receipts)


def test_bounds_and_bad_input() -> None:
    receipts = BatchReceipts("t", 0, 5, 2)
    with pytest.raises(IndexError):
        _ = receipts[2]
    with pytest.raises(IndexError):
        _ = receipts[-3]
    with pytest.raises(TypeError):
        _ = receipts["0"]  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="unhashable"):
        hash(receipts)
    with pytest.raises(ValueError, match="count"):
        BatchReceipts("t", 0, 0, -1)
    assert BatchReceipts("t", 0, 0, 0) == [] == BatchReceipts("u", 1, 9, 0)
