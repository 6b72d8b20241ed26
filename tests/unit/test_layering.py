"""The pure layers never touch the network or an event loop (import-linter cannot see the
standard library, so this reads the imports from the source)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "tidemq"
PURE = ("core", "protocol", "store")
FORBIDDEN = {"asyncio", "socket", "selectors", "ssl", "uvloop", "tidemq.testing"}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("package", PURE)
def test_pure_layers_import_no_network_or_event_loop(package: str) -> None:
    offenders = []
    for path in sorted((SRC / package).rglob("*.py")):
        for name in _imports(path):
            if name.split(".")[0] in FORBIDDEN or name in FORBIDDEN:
                offenders.append(f"{path.relative_to(SRC)} imports {name}")
    assert offenders == []
