"""`tidemq topic create --from-file FILE`: the topics to create, one per line.

    # name [queues]
    orders-eu 16
    orders-us
    clicks-0001 1

A line is a topic name, optionally followed by its queue count (default: `--queues`);
blank lines and lines starting with `#` are skipped. Every topic takes `--type` and
`--config`. "-" reads standard input.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from tidemq.cli.common import CliUsageError
from tidemq.client.results import NewTopic

__all__ = ["read_topic_file"]


def read_topic_file(
    path: str, *, queues: int, message_type: str, config: Mapping[str, str]
) -> list[NewTopic]:
    """The file's topics; CliUsageError naming the line of a bad one."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliUsageError(f"--from-file {path}: {exc}") from None
    topics = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
            raise CliUsageError(
                f"--from-file {path}, line {number}: {line[:80]!r} is not 'NAME [QUEUES]'"
            )
        count = int(parts[1]) if len(parts) == 2 else queues
        topics.append(NewTopic(parts[0], count, message_type, dict(config)))
    if not topics:
        raise CliUsageError(f"--from-file {path} names no topic")
    return topics
