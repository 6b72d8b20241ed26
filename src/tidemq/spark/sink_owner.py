"""Which sink a streaming query's checkpoint belongs to (issue 21: a sink id reused by
another checkpoint must be an error, not silently skipped batches).

The sink's marker (the last batch id a sink id published) lives on the brokers; Spark's
batch ids live in the checkpoint. A new query (a new checkpoint) that reuses a sinkId
already used by another query starts at batch 0, finds the marker at, say, 41, and would
take batches 0..41 for replays and publish nothing. A query whose sinkId is changed
would publish its replayed batch again under the new id. So the driver records the sink
id in the checkpoint (`<checkpointLocation>/tidemq-sink-id`) before it first publishes,
and checks it on every start:

* recorded, the same id: the query's own checkpoint, go on;
* recorded, another id: refused (the sinkId of a query must not change);
* not recorded, and the checkpoint has no committed batch yet (a new query): refused if
  the sink id's marker shows batches published already (from another checkpoint);
* not recorded, with committed batches: a checkpoint made before this check existed;
  recorded now.

Only a checkpoint on the driver's file system (a path or a ``file:`` URL) can be checked;
elsewhere (``hdfs://``, ``s3a://``) the check is skipped, with a log line.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final
from urllib.parse import urlparse

from tidemq.spark.options import OptionError

__all__ = ["OWNER_FILE", "check_owner"]

log = logging.getLogger(__name__)

OWNER_FILE: Final = "tidemq-sink-id"


def _local(checkpoint: str) -> Path | None:
    if checkpoint.startswith("file:"):
        return Path(urlparse(checkpoint).path)
    if "://" in checkpoint:
        return None
    return Path(checkpoint)


def check_owner(checkpoint: str | None, sink_id: str, marker: Callable[[], int]) -> None:
    """Refuse (OptionError) a sink id that does not belong to this checkpoint; record it
    in a checkpoint that has none. `marker()`: the sink id's last published batch (-1:
    none)."""
    if checkpoint is None:
        return
    root = _local(checkpoint)
    if root is None:
        log.info("checkpoint %s is not local: the sink id's owner is not checked", checkpoint)
        return
    path = root / OWNER_FILE
    try:
        recorded: str | None = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        recorded = None
    if recorded is not None:
        if recorded != sink_id:
            raise OptionError(
                f"the checkpoint {root} belongs to sinkId {recorded!r}, not {sink_id!r}: the "
                "sinkId of a query must not change (its replayed batch would be published "
                "again under the new id)"
            )
        return
    commits = root / "commits"
    new_query = not commits.is_dir() or not any(commits.iterdir())
    if new_query:
        last = marker()
        if last >= 0:
            raise OptionError(
                f"sinkId {sink_id!r} has published batches up to {last} from another "
                f"checkpoint; this query's checkpoint {root} is new, so its batches 0 to "
                f"{last} would be taken for those and skipped: give it a sinkId of its own"
            )
    root.mkdir(parents=True, exist_ok=True)
    temporary = root / f".{OWNER_FILE}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as out:
        out.write(sink_id + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
