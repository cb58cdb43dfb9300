"""Shared pytest configuration: `runtime/` and the shared test helpers in `tests/` importable."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
for folder in (ROOT / "runtime", ROOT / "tests"):  # tests/: shared helpers (envelope_rules)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run tests/browser/ last (stable order otherwise).

    Playwright's sync API keeps an event loop running on the main thread from
    the first browser test to the end of the session; asyncio tests collected
    after it could not start their own loop there.
    """
    browser = ROOT / "tests" / "browser"
    items.sort(key=lambda item: browser in Path(str(item.path)).parents)
