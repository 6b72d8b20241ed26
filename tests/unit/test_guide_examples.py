"""Every Python block in docs/guide runs as written, two ways:

* each page on its own, against a fresh server (a broker on its own thread, on a random
  port; the page's 127.0.0.1:9876 is rewritten);
* every page in the order of README's "Documentation" list, one after the other, against
  ONE `tidemq server` process (what `make run` starts), each page in a fresh namespace:
  what a newcomer does who follows the guide from the top. So pages must not step on each
  other (each creates topics and groups of its own).

A block fenced ```python no-run is shown, not run (it needs Spark or a cluster).
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.server_process import server_process as running_server

from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.cli.node import Node
from tidemq.http.config import HttpConfig
from tidemq.store.config import StoreConfig
from tidemq.tiered.config import TieredConfig

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide"
README = ROOT / "README.md"
BLOCK = re.compile(r"```python([ \t][^\n]*)?\n(.*?)```", re.DOTALL)
DEFAULT_ADDRESS = "127.0.0.1:9876"
#: The HTTP listener's address in the pages (the schema registry's URL).
DEFAULT_HTTP = "127.0.0.1:8085"
SERVER = [sys.executable, "-m", "tidemq.cli.main", "server"]
_SERVING = re.compile(r"^serving on (\S+:\d+)$", re.MULTILINE)
START_TIMEOUT_S = 30.0


def runnable_blocks(page: Path) -> list[str]:
    """The page's python blocks that are not fenced `no-run`, in order."""
    text = page.read_text()
    return [code for info, code in BLOCK.findall(text) if "no-run" not in (info or "").split()]


def readme_order() -> list[Path]:
    """The guide pages in the order README's "Documentation" section lists them."""
    text = README.read_text()
    start = text.index("## Documentation")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end >= 0 else len(text)]
    names = re.findall(r"\(docs/guide/([^)#]+\.md)\)", section)
    return [GUIDE / name for name in dict.fromkeys(names)]


def run_page(page: Path, address: str, http: str = DEFAULT_HTTP) -> str:
    """Run the page's blocks in one fresh namespace, with `address` for 127.0.0.1:9876
    and `http` for 127.0.0.1:8085."""
    # A real module, as a script's __main__ would be: dataclasses and typing look their
    # class's module up in sys.modules.
    module = types.ModuleType("__guide__")
    sys.modules["__guide__"] = module
    try:
        for block in runnable_blocks(page):
            code = block.replace(DEFAULT_ADDRESS, address).replace(DEFAULT_HTTP, http)
            exec(compile(code, str(page), "exec"), module.__dict__)
    finally:
        del sys.modules["__guide__"]
    return page.name


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A broker with its name server and HTTP listener, on its own loop thread:
    (broker address, HTTP address)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    broker = Broker(
        BrokerConfig(
            port=0,
            store=StoreConfig(data_dir=tmp_path / "data"),
            # As `make run` starts it: a local-directory tier (docs/guide/tiered-storage.md).
            tiered=TieredConfig(url=f"file://{tmp_path / 'tier'}"),
        ),
        embedded_nameserver=True,
    )
    # What `tidemq server` runs: the broker and its HTTP listener, wired by the node.
    node = Node(broker, HttpConfig(port=0))
    address = asyncio.run_coroutine_threadsafe(node.start(), loop).result(30)
    assert node.listener is not None
    try:
        yield address, node.listener.address
    finally:
        asyncio.run_coroutine_threadsafe(node.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`tidemq server --data-dir DIR --set tiered.url=...` as `make run` starts it, on free
    ports:
    (broker address, HTTP address)."""
    tier = ["--set", f"tiered.url=file://{tmp_path / 'tier'}"]  # as `make run` does
    with running_server(tmp_path, tier, start_timeout_s=START_TIMEOUT_S) as server:
        yield server.address, server.http_address


def test_readme_lists_every_page_with_examples() -> None:
    """The order the newcomer follows must cover every page that has examples to run."""
    listed = {p.name for p in readme_order()}
    assert all((GUIDE / name).exists() for name in listed)
    with_examples = {p.name for p in GUIDE.glob("*.md") if runnable_blocks(p)}
    assert with_examples <= listed, f"add {sorted(with_examples - listed)} to README's list"


@pytest.mark.parametrize("page", sorted(GUIDE.glob("*.md")), ids=lambda p: p.name)
def test_guide_page_examples_run(
    page: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    blocks = runnable_blocks(page)
    if not blocks:
        pytest.skip("no runnable python examples on this page")
    address, http = DEFAULT_ADDRESS, DEFAULT_HTTP
    joined = "".join(blocks)
    if DEFAULT_ADDRESS in joined or DEFAULT_HTTP in joined:
        address, http = request.getfixturevalue("server")
    run_page(page, address, http)
    assert capsys.readouterr().out  # the examples print what they show


@pytest.mark.timeout(300)
def test_guide_pages_run_in_readme_order_on_one_server(
    server_process: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    done: list[str] = []
    for page in readme_order():
        try:
            done.append(run_page(page, *server_process))
        except Exception as exc:
            after = ", ".join(done) or "nothing"
            raise AssertionError(
                f"{page.name} failed on a server that has run {after}: {exc!r}"
            ) from exc
        assert capsys.readouterr().out or not runnable_blocks(page), page.name
