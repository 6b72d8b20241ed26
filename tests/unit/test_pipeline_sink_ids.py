"""A pipeline's sink ids carry its checkpoint's token (issue 21): made once, kept, never
shared between checkpoints; a checkpoint from before tokens keeps the old ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.spark.pipelines.sink_ids import SINK_TOKEN_FILE, sink_id, sink_token


def test_token_is_made_once_per_checkpoint(tmp_path: Path) -> None:
    first = sink_token(tmp_path / "cp1")
    assert len(first) == 12
    assert sink_token(tmp_path / "cp1") == first  # a resumed run: the same ids
    assert sink_token(tmp_path / "cp2") != first  # another checkpoint: other ids
    assert sink_id("analytics", "session", first) == f"analytics-session-{first}"
    assert not [p for p in (tmp_path / "cp1").iterdir() if p.name != SINK_TOKEN_FILE]


def test_checkpoint_from_before_tokens_keeps_the_old_ids(tmp_path: Path) -> None:
    (tmp_path / "cp" / "session" / "offsets").mkdir(parents=True)
    token = sink_token(tmp_path / "cp")
    assert token == ""
    assert sink_id("analytics", "session", token) == "analytics-session"
    assert not (tmp_path / "cp" / SINK_TOKEN_FILE).exists()


def test_a_damaged_token_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / SINK_TOKEN_FILE).write_text("not a token")
    with pytest.raises(ValueError, match="does not hold a tidemq sink token"):
        sink_token(tmp_path)
