"""Importing a page-only module (`napllm.browser.*`) under CPython with a stand-in `js`."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def browser_module(name: str, **js: Any) -> Iterator[types.ModuleType]:
    """`name` imported afresh with a `js` module holding `js`'s attributes.

    Both `js` and the module are put back as they were on exit, so other
    tests import the real ones.
    """
    saved = {key: sys.modules.get(key) for key in ("js", name)}
    fake = types.ModuleType("js")
    for attr, value in js.items():
        setattr(fake, attr, value)
    sys.modules["js"] = fake
    sys.modules.pop(name, None)
    try:
        yield importlib.import_module(name)
    finally:
        for key, module in saved.items():
            if module is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = module
