"""Every Python block in docs/guide runs as written. Pages that talk to a server get a
fresh one (a real broker on a random port; the page's 127.0.0.1:9876 is rewritten).
A block fenced ```python no-run is shown, not run (it needs Spark or a cluster)."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.store.config import StoreConfig

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide"
BLOCK = re.compile(r"```python([ \t][^\n]*)?\n(.*?)```", re.DOTALL)
DEFAULT_ADDRESS = "127.0.0.1:9876"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """A broker with its name server, on its own loop thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    broker = Broker(
        BrokerConfig(port=0, store=StoreConfig(data_dir=tmp_path / "data")),
        embedded_nameserver=True,
    )
    address = asyncio.run_coroutine_threadsafe(broker.start(), loop).result(30)
    try:
        yield address
    finally:
        asyncio.run_coroutine_threadsafe(broker.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.mark.parametrize("page", sorted(GUIDE.glob("*.md")), ids=lambda p: p.name)
def test_guide_page_examples_run(
    page: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    text = page.read_text()
    blocks = [code for info, code in BLOCK.findall(text) if "no-run" not in info.split()]
    if not blocks:
        pytest.skip("no runnable python examples on this page")
    if DEFAULT_ADDRESS in "".join(blocks):
        address = request.getfixturevalue("server")
        blocks = [b.replace(DEFAULT_ADDRESS, address) for b in blocks]
    namespace: dict[str, object] = {"__name__": "__guide__"}
    for block in blocks:
        exec(compile(block, str(page), "exec"), namespace)
    assert capsys.readouterr().out  # the examples print what they show
