"""The sink id's owner in the checkpoint (issue 21): a new query reusing another
checkpoint's sinkId, or a query whose sinkId changed, is refused before anything is
published; a resumed query, and a checkpoint from before the check, go on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.spark.options import OptionError
from tidemq.spark.sink_owner import OWNER_FILE, check_owner


def test_a_new_query_records_its_sink_id_and_resumes(tmp_path: Path) -> None:
    cp = tmp_path / "cp"
    check_owner(str(cp), "orders-copy", lambda: -1)
    assert (cp / OWNER_FILE).read_text().strip() == "orders-copy"
    # resumed (marker moved on meanwhile): the same id, fine; the marker is not asked
    check_owner(f"file://{cp}", "orders-copy", lambda: pytest.fail("not asked"))


def test_a_new_query_reusing_a_published_sink_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="has published batches up to 41 from another"):
        check_owner(str(tmp_path / "new"), "orders-copy", lambda: 41)
    assert not (tmp_path / "new" / OWNER_FILE).exists()


def test_a_changed_sink_id_is_refused(tmp_path: Path) -> None:
    check_owner(str(tmp_path), "first", lambda: -1)
    with pytest.raises(OptionError, match="belongs to sinkId 'first', not 'second'"):
        check_owner(str(tmp_path), "second", lambda: -1)


def test_a_checkpoint_from_before_the_check_is_adopted(tmp_path: Path) -> None:
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "0").write_text("v1\n{}")
    check_owner(str(tmp_path), "old-sink", lambda: 7)  # its own marker: batches 0..7
    assert (tmp_path / OWNER_FILE).read_text().strip() == "old-sink"


def test_remote_checkpoints_and_none_are_not_checked(tmp_path: Path) -> None:
    check_owner(None, "s", lambda: 5)
    check_owner("s3a://bucket/cp", "s", lambda: 5)
