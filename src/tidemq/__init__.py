"""tidemq: stream storage for Python data teams.

The synchronous client API; `tidemq.aio` has the asyncio twins with the same names.
"""

from __future__ import annotations

from tidemq.client.sync import Admin, GroupConsumer, Producer, StreamConsumer
from tidemq.core.errors import TidemqError
from tidemq.core.message import Message, Receipt
from tidemq.core.version import __version__

__all__ = [
    "Admin",
    "GroupConsumer",
    "Message",
    "Producer",
    "Receipt",
    "StreamConsumer",
    "TidemqError",
    "__version__",
]
