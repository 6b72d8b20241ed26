"""Sink ids of a pipeline run, tied to its checkpoint.

A pipeline's exactly-once topic sink skips a batch when the broker's marker for its sink
id says that batch was already published. Sink ids made from the pipeline's name alone
(``<name>-<kind>``) were shared by every run with that name: a second run with another
input and another checkpoint found the first run's markers, took its own batches 0, 1, ...
for replays and published nothing, and exited 0 (issue 21).

So a run's sink ids carry a token made when its checkpoint is first used and kept in it
(``<checkpoint>/tidemq-sink-token``): the run resumed from that checkpoint finds the same
token, hence the same ids and markers; any other checkpoint gets another token. A
checkpoint that already holds query state but no token file was made before tokens
existed: it keeps the old ids (``<name>-<kind>``), so that resuming it cannot publish a
replayed batch twice.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path
from typing import Final

__all__ = ["SINK_TOKEN_FILE", "sink_id", "sink_token"]

SINK_TOKEN_FILE: Final = "tidemq-sink-token"
_TOKEN: Final = re.compile(r"[0-9a-f]{12}")


def sink_token(checkpoint: Path) -> str:
    """The checkpoint's token, made (and stored, atomically) on its first use; "" for a
    checkpoint made before tokens (it holds query state and no token file)."""
    path = checkpoint / SINK_TOKEN_FILE
    try:
        token = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        if checkpoint.is_dir() and any(p.is_dir() for p in checkpoint.iterdir()):
            return ""
    else:
        if not _TOKEN.fullmatch(token):
            raise ValueError(
                f"{path} does not hold a tidemq sink token (12 hex digits): {token[:40]!r}; "
                "it belongs to the pipeline's checkpoint, restore it or use a new checkpoint"
            )
        return token
    token = uuid.uuid4().hex[:12]
    checkpoint.mkdir(parents=True, exist_ok=True)
    temporary = checkpoint / f".{SINK_TOKEN_FILE}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="ascii") as out:
        out.write(token + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    return token


def sink_id(name: str, kind: str, token: str) -> str:
    """``<name>-<kind>-<token>`` (``<name>-<kind>`` for a checkpoint without a token)."""
    return f"{name}-{kind}-{token}" if token else f"{name}-{kind}"
