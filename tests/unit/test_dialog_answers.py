"""The dialogs' answers as the runtime reads them (napllm.browser.bridge).

A chooser's pick counts only with the revision of the list it was made on;
a consent's Allow only with the digest of the disclosure it showed. Any
other answer is a cancel or a denial (NAP-LLM, Shell Behavior).
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from napllm.shell import ChoicePick, ConsentDecision


@pytest.fixture
def bridge(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """napllm.browser.bridge imported against a stand-in `js` module."""
    js = types.ModuleType("js")
    js.napllmHost = types.SimpleNamespace()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "js", js)
    monkeypatch.delitem(sys.modules, "napllm.browser.bridge", raising=False)
    yield importlib.import_module("napllm.browser.bridge")
    sys.modules.pop("napllm.browser.bridge", None)


def test_a_pick_names_its_candidate_and_the_list_it_was_made_on(bridge: Any) -> None:
    assert bridge.pick_from_json('{"id": "u-1", "revision": 3}') == ChoicePick("u-1", 3)


@pytest.mark.parametrize(
    "answer",
    [
        None,
        "",
        "u-1",  # a bare id (an older page): no list revision, so no pick
        '{"id": "u-1"}',
        '{"id": "u-1", "revision": -1}',
        '{"id": "u-1", "revision": true}',
        '{"id": "u-1", "revision": 1.5}',
        '{"id": "u-1", "revision": "1"}',
        '{"id": "", "revision": 0}',
        '{"id": 7, "revision": 0}',
        '["u-1", 0]',
        '{"id": "u-1", "revision": 0',
    ],
)
def test_anything_but_a_pick_with_its_revision_is_a_cancel(bridge: Any, answer: object) -> None:
    assert bridge.pick_from_json(answer) is None


def test_allow_counts_only_for_the_disclosure_shown(bridge: Any) -> None:
    digest = "ab" * 32
    allow = {"allow": True, "remember": True, "digest": digest}
    assert bridge.consent_from_json(allow, digest) == ConsentDecision(allow=True, remember=True)
    assert bridge.consent_from_json(allow, "cd" * 32) == ConsentDecision(allow=False)
    assert bridge.consent_from_json({"allow": True}, digest) == ConsentDecision(allow=False)
    deny = {"allow": False, "remember": True, "digest": digest}
    assert bridge.consent_from_json(deny, digest) == ConsentDecision(allow=False, remember=False)
    assert bridge.consent_from_json(json.dumps(allow), digest) == ConsentDecision(allow=False)
