"""Reading the user's stored connection records back (`napllm.browser.stored`).

web/js/storage.js hands the runtime one text per stored record; each is read
on its own, so one bad record (over a limit, broken, outside the form's
bounds) is counted unreadable and never hides the others.
"""

from __future__ import annotations

import asyncio
import json
import sys
import types
from typing import Any

import pytest
from fake_js import browser_module
from test_connection_kinds import table


class Host:
    """The page's store: `loadConnections` as web/js/storage.js answers it."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    async def loadConnections(self) -> str:
        return json.dumps(self.texts)


def good(i: int, **extra: Any) -> dict[str, Any]:
    record = {
        "id": f"u-{i:012x}",
        "name": f"good {i}",
        "kind": "openai",
        "model": "m",
        "route": "r",
        "settings": {"baseUrl": "http://127.0.0.1:8080/v1", "userDefined": True},
    }
    return record | extra


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def _pyodide_stubs() -> dict[str, types.ModuleType]:
    stubs = {}
    for name in ("pyodide", "pyodide.ffi", "pyodide.http", "pyodide.code", "pyodide.webloop"):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__getattr__ = lambda attr: type(attr, (Exception,), {})  # type: ignore[method-assign]
            stubs[name] = module
    return stubs


def read(texts: list[str]) -> tuple[list[str], int]:
    """The ids read and the unreadable count for the stored `texts`."""
    stubs = _pyodide_stubs()
    sys.modules.update(stubs)
    before = set(sys.modules)
    try:
        with browser_module(
            "napllm.browser.stored",
            napllmHost=Host(texts),
            __getattr__=lambda name: type(name, (), {}),
        ) as stored:
            store = stored.ConnectionStore(
                registry=None,
                providers=types.SimpleNamespace(kinds=table()),
                publish_connections=lambda: None,
                publish_grants=lambda: None,
            )
            got = asyncio.run(store.read())
            return [c.id for c in got], store.unreadable
    finally:
        for name in set(sys.modules) - before:  # page modules imported with the stand-in
            sys.modules.pop(name, None)
        for name in stubs:
            sys.modules.pop(name, None)


SCRIPT = json.dumps([{"text": "x" * 999_000}])
BAD = {
    "an integer over the safe range": json.dumps(good(2, revision=2**60)),
    "nesting 45 deep": json.dumps(good(2, settings=good(2)["settings"] | {"x": nested(45)})),
    "a lone surrogate": json.dumps(good(2)).replace('"good 2"', '"\\ud800"'),
    "broken text": '{"id": "u-2", ',
    "not an object": "[1, 2]",
    "a 20 MB name": json.dumps(good(2, name="n" * 20_000_000)),
    "a name over the form's 200": json.dumps(good(2, name="n" * 201)),
    "an empty name": json.dumps(good(2, name="")),
    "a model over the form's 500": json.dumps(good(2, model="m" * 501)),
    "an empty model": json.dumps(good(2, model="")),
}


@pytest.mark.parametrize("bad", sorted(BAD))
def test_one_bad_record_is_counted_and_the_others_are_read(bad: str) -> None:
    texts = [json.dumps(good(1)), BAD[bad], json.dumps(good(3))]
    assert read(texts) == ([good(1)["id"], good(3)["id"]], 1)


def test_records_whose_total_passes_one_text_limit_are_all_read() -> None:
    scripted = [
        json.dumps(
            {
                "id": f"u-s{i}",
                "name": f"s{i}",
                "kind": "scripted",
                "model": "m",
                "route": "r",
                "settings": {"userDefined": True, "script": SCRIPT},
            }
        )
        for i in range(17)
    ]
    ids, unreadable = read([json.dumps(good(0)), *scripted])
    assert (len(ids), unreadable) == (18, 0)


def test_the_form_bounds_are_accepted_at_their_ends() -> None:
    texts = [json.dumps(good(1, name="n" * 200, model="m" * 500)), json.dumps(good(2, name="n"))]
    assert read(texts) == ([good(1)["id"], good(2)["id"]], 0)
