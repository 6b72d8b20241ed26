"""Running a server process: event loop choice, signals, the readiness line, shutdown.

`serve()` starts a service (a broker, with or without its name server, or a name server
alone), prints `serving on HOST:PORT` on stderr once it listens (scripts and tests wait for
that line; with `--port 0` it carries the port the kernel chose), and runs until SIGTERM or
SIGINT. The first signal stops it gracefully (`stop()`: stop accepting, finish in-flight
requests, flush and close the store); a second one exits at once, leaving recovery to the
next start, like kill -9.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Service", "configure_logging", "loop_factory", "serve"]

log = logging.getLogger("tidemq.cli.server")

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: Exit status after a second signal cut the graceful shutdown short.
_FORCED_EXIT = 130


class Service(Protocol):
    async def start(self) -> str: ...

    async def stop(self) -> None: ...


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when it is installed (`pip install 'tidemq[server]'`), else asyncio's."""
    try:
        uvloop: Any = importlib.import_module("uvloop")
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def serve(make: Callable[[], Service]) -> None:
    """Run the service `make()` builds until a signal stops it."""
    factory = loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_serve(make))


async def _serve(make: Callable[[], Service]) -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if stopping.is_set():
            log.warning("%s again: exiting without a graceful shutdown", name)
            os._exit(_FORCED_EXIT)
        log.info("%s: shutting down (send it again to exit at once)", name)
        stopping.set()

    for sig in _SIGNALS:
        with contextlib.suppress(NotImplementedError):  # not on Windows' proactor loop
            loop.add_signal_handler(sig, on_signal, sig)
    service = make()
    try:
        address = await service.start()
    except BaseException:
        # Half-started (the port is taken, the store failed to open): release what started.
        with contextlib.suppress(Exception):
            await service.stop()
        raise
    sys.stderr.write(f"serving on {address}\n")
    sys.stderr.flush()
    try:
        await stopping.wait()
    finally:
        await service.stop()
        log.info("stopped")
