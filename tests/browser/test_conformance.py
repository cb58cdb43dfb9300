"""NAP-LLM conformance cases LLM-C01..LLM-C23 in Chromium against the real shell.

The shell page (web/ with napllm in Pyodide, ``?test=1``) runs the fixture
connections ``fx-*``; napplet frames run ``napplets/probe.html``, which posts
envelopes from inside the sandboxed frame and records what the shell
delivers. The chooser and consent dialogs are answered with real clicks (and
Esc); provider submissions are counted with ``napllmTest.stats``. Each test
asserts the *required observation* of its row in the NAP-LLM Conformance
Cases table; names follow tests/unit/test_conformance_core.py.

One page is booted per module and reused: every test opens its own napplet
tabs (fresh endpoints) and closes them, and the shared state (deadline,
profile, standing permissions) is reset after each test.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shellpage import (
    POLL_MS,
    Napplet,
    ShellPage,
    check_generation,
    code,
    deltas_of,
    generate,
    install_napplets,
    terminal,
    user,
    wait_deltas,
)

from napllm.errors import SAFE_MESSAGES, ErrorCode
from napllm.lmsp import LmspEvent
from napllm.providers.fixture import (
    Crash,
    Fail,
    Stall,
    call_events,
    completed,
    incomplete,
    text_events,
    text_script,
    tool_call_script,
)

pytestmark = pytest.mark.browser

FULL = "Fixture (all capabilities)"
TEXT = "Fixture (text only)"
JSON_ONLY = "Fixture (JSON only)"
AUTO = "Fixture (tools, auto/none)"
REASONING = "Fixture (opaque reasoning)"
PAID = "Fixture (may charge)"

CREATED = LmspEvent(
    event="response.created", data={"response_id": "resp_fixture", "status": "in_progress"}
)
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(16)).decode()
# 25 bytes, so the standard encoding ends in "==" padding
PADDED_PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(17)).decode()
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Look up current weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = {
    "type": "toolCall",
    "toolCallId": "call_1",
    "name": "get_weather",
    "arguments": {"city": "B"},
}
CALL_2 = {**CALL, "toolCallId": "call_2", "arguments": {"city": "P"}}
FORCED = {"type": "tool", "name": "get_weather"}
OTHER_TOOL = {"name": "get_time", "parameters": {"type": "object"}}


def result_msg(call_id: str, text: str = "18 C", **extra: Any) -> dict[str, Any]:
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": "get_weather",
        "content": [{"type": "text", "text": text}],
        **extra,
    }


def assistant(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(parts)}


def safe(envelope: dict[str, Any], expected: ErrorCode) -> None:
    """The envelope is an error of `expected` code with the runtime's fixed sentence."""
    assert envelope.get("error") == {"code": expected.value, "message": SAFE_MESSAGES[expected]}, (
        envelope
    )


def ready(shell: ShellPage, connection: str = FULL) -> tuple[Napplet, str]:
    """A fresh napplet tab with a live handle for `connection` (chosen by click)."""
    app = shell.open_napplet()
    return app, app.select(connection)


def rejected(
    shell: ShellPage, app: Napplet, cases: dict[str, dict[str, Any]], expected: str, cid: str
) -> None:
    """Each envelope gets `expected` with no consent dialog and no provider submission."""
    before = shell.submissions(cid)
    for envelope in cases.values():
        app.post(envelope)
    for case, envelope in cases.items():
        answer = app.wait_for(envelope["id"], envelope["type"] + ".result")
        assert code(answer) == expected, (case, answer)
    assert shell.open_dialogs() == 0
    assert shell.submissions(cid) == before


def last_request(shell: ShellPage, cid: str) -> dict[str, Any]:
    """The LMSP request of the latest submission to fixture `cid`."""
    request: dict[str, Any] = shell.stats(cid)["requests"][-1]
    return request


def items(request: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The input items of an LMSP request of one `type`."""
    return [i for i in request["input"] if i["type"] == kind]


@pytest.fixture(scope="module")
def context(browser: Any) -> Iterator[Any]:
    """One browser context for the module (the shell page is booted once)."""
    ctx = browser.new_context()
    yield ctx
    ctx.close()


@pytest.fixture(scope="module")
def booted(context: Any, dist_url: str, test_pages_dir: Path) -> ShellPage:
    shell = ShellPage(context.new_page(), dist_url, install_napplets(test_pages_dir, dist_url))
    shell.boot()
    return shell


@pytest.fixture
def shell(booted: ShellPage, request_log: Any) -> Iterator[ShellPage]:
    """The shared shell page, reset after the test; requests stay on 127.0.0.1."""
    yield booted
    booted.reset()


# --------------------------------------------------------------------------
# LLM-C01: select, describe, generate; also omit the optional domain


def test_llm_c01_select_describe_generate_correlate(shell: ShellPage) -> None:
    app = shell.open_napplet()
    # no `shell` handshake: the first message is llm.select
    app.post({"type": "llm.select", "id": "s1", "requirements": {"json": True}})
    assert JSON_ONLY in shell.candidates() and TEXT not in shell.candidates()
    shell.choose(FULL)
    model = app.wait_for("s1", "llm.select.result")["model"]
    assert model["model"] == "fixture-full" and model["json"] is True
    assert set(model) == {
        "handle",
        "name",
        "model",
        "route",
        "images",
        "json",
        "tools",
        "toolChoiceModes",
    }
    app.post({"type": "llm.describe", "id": "d1", "handle": model["handle"]})
    assert app.wait_for("d1", "llm.describe.result")["model"] == model
    before = shell.submissions("fx-full")
    shell.queue("fx-full", text_script(['{"greeting"', ':"Hello"}']))
    result = app.run(generate("g1", model["handle"], format="json", maxTokens=128))
    assert result["result"]["finish"] == "stop"
    assert json.loads(result["result"]["content"][0]["text"]) == {"greeting": "Hello"}
    assert shell.submissions("fx-full") == before + 1
    request = last_request(shell, "fx-full")
    assert request["model"] == "fixture-full" and request["max_output_tokens"] == 128
    ids = [e.get("id", e.get("requestId")) for e in app.envelopes()]
    assert ids[:2] == ["s1", "d1"] and set(ids[2:]) == {"g1"}


def test_llm_c01_binding_select_describe_generate(shell: ShellPage) -> None:
    app = shell.open_napplet()
    assert app.evaluate("() => Object.keys(window.napplet)") == ["llm"]
    selecting = app.call("select", {"tools": True})
    assert TEXT not in shell.candidates()
    shell.choose(FULL)
    selected = app.outcome(selecting)
    assert selected["state"] == "ok"
    model = selected["value"]
    describing = app.call("describe", model["handle"])
    assert app.outcome(describing) == {"method": "describe", "state": "ok", "value": model}
    shell.queue("fx-full", text_script(["Hi ", "there"]))
    generating = app.call_generate({"handle": model["handle"], "messages": [user("Hello!")]})
    shell.allow()
    outcome = app.outcome(generating)
    assert outcome["state"] == "ok", outcome
    assert outcome["value"]["content"] == [{"type": "text", "text": "Hi there"}]
    assert [d["sequence"] for d in outcome["deltas"]] == list(range(len(outcome["deltas"])))
    assert "".join(d.get("text", "") for d in outcome["deltas"]) == "Hi there"
    check_generation(app.quiet(), outcome["id"])


def test_llm_c01_absent_domain_gets_no_replies_and_no_dialogs(shell: ShellPage) -> None:
    plain = shell.open_napplet()
    plain.set_llm(False)
    with_llm = shell.open_napplet()
    # absence is discoverable without a handshake: no `llm` in the namespace
    assert plain.evaluate("() => Object.keys(window.napplet)") == []
    assert plain.evaluate("() => 'llm' in window.napplet") is False
    before = shell.submissions("fx-full")
    plain.post({"type": "llm.select", "id": "s1"})
    plain.post(generate("g1", "h-guess"))
    plain.post({"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    # the other napplet's llm domain still works
    handle = with_llm.select(FULL)
    assert handle
    assert plain.quiet() == []
    assert shell.open_dialogs() == 0 and shell.submissions("fx-full") == before
    # the napplet's own (non-llm) functionality is unaffected
    assert plain.evaluate("() => document.querySelector('h1').textContent") == "Probe napplet"


# --------------------------------------------------------------------------
# LLM-C02: malformed record, base64, enum or explicit null -> invalid-request


def _image(data: str, mime: str = "image/png") -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "image", "mimeType": mime, "data": data}]}


MALFORMED_REQUESTS: dict[str, dict[str, Any]] = {
    "unknown request field": {"stream": True},
    "explicit null temperature": {"temperature": None},
    "explicit null format": {"format": None},
    "enum format": {"format": "xml"},
    "wrong type maxTokens": {"maxTokens": "128"},
    "float maxTokens": {"maxTokens": 1.5},
    "bool temperature": {"temperature": True},
    "role enum": {"messages": [{"role": "robot", "content": [{"type": "text", "text": "x"}]}]},
    "unknown part type": {"messages": [{"role": "user", "content": [{"type": "audio"}]}]},
    "null part text": {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
    "empty messages": {"messages": []},
    "empty content": {"messages": [{"role": "user", "content": []}]},
    "base64 unpadded": {"messages": [_image(PADDED_PNG.rstrip("="))]},
    "base64 whitespace": {"messages": [_image(PNG[:8] + "\n" + PNG[8:])]},
    "base64 data uri": {"messages": [_image("data:image/png;base64," + PNG)]},
    "base64 urlsafe": {"messages": [_image("_-__")]},
    "image mime enum": {"messages": [_image(PNG, "image/gif")]},
}


def test_llm_c02_malformed_request_is_invalid_without_generation(shell: ShellPage) -> None:
    app, handle = ready(shell)
    cases = {}
    for index, (case, fields) in enumerate(sorted(MALFORMED_REQUESTS.items())):
        envelope = generate(f"g{index}", handle)
        envelope["request"].update(fields)
        cases[case] = envelope
    rejected(shell, app, cases, "invalid-request", "fx-full")


def test_llm_c02_malformed_envelope_is_invalid(shell: ShellPage) -> None:
    app, _ = ready(shell)
    envelopes = [
        {"type": "llm.generate", "request": None},
        {"type": "llm.generate", "request": "text"},
        {"type": "llm.generate", "request": {"handle": None, "messages": []}},
        {"type": "llm.generate", "request": {}, "extra": 1},
        {"type": "llm.select", "requirements": None},
        {"type": "llm.select", "requirements": {"images": "yes"}},
        {"type": "llm.select", "requirements": {"vision": True}},
        {"type": "llm.describe", "handle": None},
        {"type": "llm.cancel", "requestId": 7},
    ]
    cases = {f"e{i}": {**e, "id": f"e{i}"} for i, e in enumerate(envelopes)}
    rejected(shell, app, cases, "invalid-request", "fx-full")


# --------------------------------------------------------------------------
# LLM-C03: unsupported images/JSON/tools/exact model or provider-specific input


def test_llm_c03_select_unmet_requirement_is_unsupported(shell: ShellPage) -> None:
    app = shell.open_napplet()
    app.post({"type": "llm.select", "id": "s1", "requirements": {"model": "no-such-model"}})
    assert code(app.wait_for("s1", "llm.select.result")) == "unsupported"
    assert shell.open_dialogs() == 0


def test_llm_c03_select_offers_only_exact_model_no_substitution(shell: ShellPage) -> None:
    app = shell.open_napplet()
    app.post({"type": "llm.select", "id": "s1", "requirements": {"model": "fixture-json"}})
    assert shell.candidates() == [JSON_ONLY]
    shell.choose(JSON_ONLY)
    assert app.wait_for("s1", "llm.select.result")["model"]["model"] == "fixture-json"
    app.post({"type": "llm.select", "id": "s2", "requirements": {"tools": True}})
    offered = shell.candidates()
    assert TEXT not in offered and JSON_ONLY not in offered and FULL in offered
    shell.cancel_chooser()
    assert code(app.wait_for("s2", "llm.select.result")) == "user-cancelled"


def test_llm_c03_generate_unsupported_input_before_submission(shell: ShellPage) -> None:
    app, handle = ready(shell, TEXT)
    inputs: dict[str, dict[str, Any]] = {
        "image": {"messages": [_image(PNG)]},
        "json": {"format": "json"},
        "tools": {"tools": [WEATHER_TOOL]},
        "tool history": {
            "messages": [user("weather?"), assistant(CALL), result_msg("call_1"), user("thanks")]
        },
        "temperature out of range": {"temperature": 7.5},
    }
    cases = {}
    for index, (case, fields) in enumerate(sorted(inputs.items())):
        envelope = generate(f"g{index}", handle)
        envelope["request"].update(fields)
        cases[case] = envelope
    rejected(shell, app, cases, "unsupported", "fx-text")


# --------------------------------------------------------------------------
# LLM-C04: decline consent after selecting a valid model


def test_llm_c04_declined_consent_is_user_cancelled_without_generation(shell: ShellPage) -> None:
    app, handle = ready(shell)
    before = shell.submissions("fx-full")
    app.post(generate("g1", handle))
    shell.deny()
    safe(app.wait_for("g1"), ErrorCode.USER_CANCELLED)
    # Esc in the consent dialog denies too
    app.post(generate("g2", handle))
    shell.escape("consent")
    safe(app.wait_for("g2"), ErrorCode.USER_CANCELLED)
    assert shell.submissions("fx-full") == before
    assert deltas_of(app.quiet(), "g1") == [] and deltas_of(app.envelopes(), "g2") == []


def test_llm_c04_declined_selection_is_user_cancelled(shell: ShellPage) -> None:
    app = shell.open_napplet()
    app.post({"type": "llm.select", "id": "s1"})
    shell.cancel_chooser()
    assert code(app.wait_for("s1", "llm.select.result")) == "user-cancelled"
    app.post({"type": "llm.select", "id": "s2"})
    shell.escape("chooser")
    assert code(app.wait_for("s2", "llm.select.result")) == "user-cancelled"


# --------------------------------------------------------------------------
# LLM-C05: two endpoints reuse ids and attempt each other's handles/cancel


def test_llm_c05_foreign_handles_rejected_and_ids_scoped(shell: ShellPage) -> None:
    alpha, handle_a = ready(shell)
    beta, handle_b = ready(shell)
    assert handle_a != handle_b
    before = shell.submissions("fx-full")
    beta.post({"type": "llm.describe", "id": "d1", "handle": handle_a})
    beta.post(generate("g1", handle_a, user("beta steals")))
    assert code(beta.wait_for("d1", "llm.describe.result")) == "selection-expired"
    assert code(beta.wait_for("g1")) == "selection-expired"
    assert shell.open_dialogs() == 0 and shell.submissions("fx-full") == before
    # the same ids on each endpoint are independent
    alpha.post(generate("g2", handle_a, user("alpha words")))
    shell.allow()
    beta.post(generate("g2", handle_b, user("beta words")))
    shell.allow()
    alpha.wait_for("g2")
    beta.wait_for("g2")
    result_a = json.dumps(check_generation(alpha.quiet(), "g2"))
    result_b = json.dumps(check_generation(beta.envelopes(), "g2"))
    assert "alpha" in result_a and "beta" not in result_a
    assert "beta" in result_b and "alpha" not in result_b
    assert "alpha" not in json.dumps(beta.envelopes())
    assert shell.submissions("fx-full") == before + 2


def test_llm_c05_foreign_cancel_is_false_and_original_continues(shell: ShellPage) -> None:
    alpha, handle_a = ready(shell)
    beta, _ = ready(shell)
    shell.queue("fx-full", [CREATED, *text_events(["alpha ", "done"]), Stall(0.5), completed()])
    alpha.post(generate("g1", handle_a, user("alpha secret prompt")))
    shell.allow()
    wait_deltas(alpha, "g1")
    beta.post({"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    assert beta.wait_for("c1", "llm.cancel.result")["cancelled"] is False
    assert alpha.wait_for("g1")["result"]["finish"] == "stop"
    check_generation(alpha.quiet(), "g1")
    # nothing of alpha's generation reached beta, nothing of beta's cancel reached alpha
    assert [e["type"] for e in beta.envelopes()] == ["llm.select.result", "llm.cancel.result"]
    assert "alpha" not in json.dumps(beta.envelopes())
    assert not any(e.get("id") == "c1" for e in alpha.envelopes())


# --------------------------------------------------------------------------
# LLM-C06: duplicate an active generation id


def _results(app: Napplet, rid: str) -> list[dict[str, Any]]:
    return [
        e for e in app.envelopes() if e.get("type") == "llm.generate.result" and e.get("id") == rid
    ]


def test_llm_c06_duplicate_active_id_during_provider_run(shell: ShellPage) -> None:
    app, handle = ready(shell)
    before = shell.submissions("fx-full")
    shell.queue("fx-full", [CREATED, *text_events("first"), Stall(0.5), completed()])
    app.post(generate("g1", handle, user("one")))
    shell.allow()
    wait_deltas(app, "g1")
    app.post(generate("g1", handle, user("two")))
    app.frame.wait_for_function(
        "() => window.probe.envelopes()"
        ".filter((e) => e.type === 'llm.generate.result').length >= 2",
        polling=POLL_MS,
    )
    results = _results(app, "g1")
    assert [code(r) for r in results] == ["invalid-request", None]
    assert results[1]["result"]["content"] == [{"type": "text", "text": "first"}]
    assert shell.submissions("fx-full") == before + 1 and shell.open_dialogs() == 0


def test_llm_c06_duplicate_active_id_during_consent(shell: ShellPage) -> None:
    app, handle = ready(shell)
    before = shell.submissions("fx-full")
    app.post(generate("g1", handle))
    shell.consent()
    app.post(generate("g1", handle))
    assert code(app.wait_for("g1")) == "invalid-request"
    assert shell.open_dialogs() == 1
    shell.queue("fx-full", text_script("ok"))
    shell.allow()
    app.frame.wait_for_function(
        "() => window.probe.envelopes()"
        ".filter((e) => e.type === 'llm.generate.result').length >= 2",
        polling=POLL_MS,
    )
    assert [code(r) for r in _results(app, "g1")] == ["invalid-request", None]
    assert shell.submissions("fx-full") == before + 1


# --------------------------------------------------------------------------
# LLM-C07: cancel or time out during revalidation, consent or a stalled provider


def test_llm_c07_cancel_during_consent_prevents_submission(shell: ShellPage) -> None:
    app, handle = ready(shell)
    before = shell.submissions("fx-full")
    app.post(generate("g1", handle))
    dialog = shell.consent()
    app.post({"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    assert app.wait_for("c1", "llm.cancel.result")["cancelled"] is True
    safe(app.wait_for("g1"), ErrorCode.CANCELLED)
    dialog.wait_for(state="detached")  # no later submission from the pending consent
    assert len(_results(app, "g1")) == 1 and shell.submissions("fx-full") == before


def test_llm_c07_timeout_during_consent_prevents_submission(shell: ShellPage) -> None:
    app, handle = ready(shell)
    before = shell.submissions("fx-full")
    shell.set_deadline(0.8)
    app.post(generate("g1", handle))
    dialog = shell.consent()
    safe(app.wait_for("g1", timeout_ms=5_000), ErrorCode.TIMEOUT)
    dialog.wait_for(state="detached")
    assert len(_results(app, "g1")) == 1 and shell.submissions("fx-full") == before


def test_llm_c07_cancel_stalled_provider_settles_and_suppresses_late_output(
    shell: ShellPage,
) -> None:
    app, handle = ready(shell)
    stats = shell.stats("fx-full")
    shell.queue(
        "fx-full",
        [CREATED, *text_events(["early "]), Stall(None), *text_events("late"), completed()],
    )
    app.post(generate("g1", handle))
    shell.allow()
    wait_deltas(app, "g1", 2)
    app.post({"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    assert app.wait_for("c1", "llm.cancel.result")["cancelled"] is True
    safe(app.wait_for("g1"), ErrorCode.CANCELLED)
    envelopes = app.quiet()
    check_generation(envelopes, "g1")
    assert "late" not in json.dumps(envelopes)
    after = shell.stats("fx-full")
    assert after["submissions"] == stats["submissions"] + 1
    assert after["closedEarly"] == stats["closedEarly"] + 1


def test_llm_c07_timeout_stalled_provider(shell: ShellPage) -> None:
    app, handle = ready(shell)
    stats = shell.stats("fx-full")
    shell.queue("fx-full", [CREATED, *text_events("early"), Stall(None), completed()])
    app.post(generate("g1", handle))
    shell.allow()
    wait_deltas(app, "g1")
    # Applies to generations started afterwards; longer than the time Allow
    # stays disabled after the dialog appears (web/js/dialogs.js, 500 ms).
    shell.set_deadline(2.0)
    app.post({"type": "llm.cancel", "id": "c0", "requestId": "g1"})
    safe(app.wait_for("g1"), ErrorCode.CANCELLED)
    shell.queue("fx-full", [CREATED, *text_events("early"), Stall(None), completed()])
    app.post(generate("g2", handle))
    shell.allow()
    safe(app.wait_for("g2", timeout_ms=5_000), ErrorCode.TIMEOUT)
    check_generation(app.quiet(), "g2")
    after = shell.stats("fx-full")
    assert after["submissions"] == stats["submissions"] + 2
    assert after["closedEarly"] == stats["closedEarly"] + 2


def test_llm_c07_revalidation_refuses_connection_edited_during_consent(shell: ShellPage) -> None:
    app, handle = ready(shell, JSON_ONLY)
    before = shell.submissions("fx-json")
    app.post(generate("g1", handle))
    dialog = shell.consent()
    shell.rename_connection("fx-json", "Fixture (JSON only, renamed)")
    try:
        assert code(app.wait_for("g1")) == "selection-expired"
        dialog.wait_for(state="detached")
        app.post({"type": "llm.describe", "id": "d1", "handle": handle})
        assert code(app.wait_for("d1", "llm.describe.result")) == "selection-expired"
    finally:
        shell.rename_connection("fx-json", JSON_ONLY)
    assert shell.submissions("fx-json") == before


# --------------------------------------------------------------------------
# LLM-C08: switch account, revoke endpoint or change connection during consent


def test_llm_c08_account_switch_during_consent(shell: ShellPage) -> None:
    shell.add_profile("Second")  # before selecting: a switch invalidates handles
    shell.switch_account("Default")
    app, handle = ready(shell)
    before = shell.submissions("fx-full")
    app.post(generate("g1", handle))
    dialog = shell.consent()
    shell.switch_account("Second")
    safe(app.wait_for("g1"), ErrorCode.CANCELLED)
    dialog.wait_for(state="detached")
    app.post({"type": "llm.describe", "id": "d1", "handle": handle})
    app.post(generate("g2", handle))
    assert code(app.wait_for("d1", "llm.describe.result")) == "selection-expired"
    assert code(app.wait_for("g2")) == "selection-expired"
    assert shell.submissions("fx-full") == before and shell.open_dialogs() == 0


def test_llm_c08_account_switch_during_generation_and_select(shell: ShellPage) -> None:
    shell.add_profile("Third")  # before selecting: a switch invalidates handles
    shell.switch_account("Default")
    app, handle = ready(shell)
    stats = shell.stats("fx-full")
    shell.queue("fx-full", [CREATED, *text_events("first account"), Stall(None), completed()])
    app.post(generate("g1", handle))
    shell.allow()
    wait_deltas(app, "g1")
    app.post({"type": "llm.select", "id": "s2"})
    chooser = shell.chooser()
    shell.switch_account("Third")
    safe(app.wait_for("g1"), ErrorCode.CANCELLED)
    assert code(app.wait_for("s2", "llm.select.result")) == "cancelled"
    chooser.wait_for(state="detached")
    check_generation(app.quiet(), "g1")
    assert shell.stats("fx-full")["closedEarly"] == stats["closedEarly"] + 1
    # a fresh selection under the new account is a new handle; nothing of the old
    # account's generation is delivered afterwards
    fresh = app.select(FULL, rid="s3")
    assert fresh != handle
    assert "first account" not in json.dumps(app.envelopes()[-1])


def test_llm_c08_endpoint_closed_during_consent(shell: ShellPage) -> None:
    app, handle = ready(shell)
    other = shell.open_napplet()
    before = shell.submissions("fx-full")
    app.post(generate("g1", handle))
    dialog = shell.consent()
    app.close()
    dialog.wait_for(state="detached")
    other.post({"type": "llm.describe", "id": "d1", "handle": handle})
    assert code(other.wait_for("d1", "llm.describe.result")) == "selection-expired"
    assert shell.submissions("fx-full") == before


def test_llm_c08_llm_access_revoked_during_consent(shell: ShellPage) -> None:
    app, handle = ready(shell)
    before = shell.submissions("fx-full")
    app.post(generate("g1", handle))
    dialog = shell.consent()
    app.set_llm(False)  # the endpoint is revoked: a fresh frame without the domain
    dialog.wait_for(state="detached")
    assert app.quiet() == [] and shell.submissions("fx-full") == before


def test_llm_c08_connection_changed_during_consent(shell: ShellPage) -> None:
    app, handle = ready(shell, PAID)
    before = shell.submissions("fx-paid")
    app.post(generate("g1", handle))
    dialog = shell.consent()
    assert "may charge" in dialog.inner_text()
    shell.rename_connection("fx-paid", "Fixture (replacement)")
    try:
        assert code(app.wait_for("g1")) == "selection-expired"
        dialog.wait_for(state="detached")
        # a new select offers the changed connection under its new name only
        app.post({"type": "llm.select", "id": "s2", "requirements": {"model": "fixture-paid"}})
        assert shell.candidates() == ["Fixture (replacement)"]
        shell.cancel_chooser()
    finally:
        shell.rename_connection("fx-paid", PAID)
    assert shell.submissions("fx-paid") == before


# --------------------------------------------------------------------------
# LLM-C09: buffered and streamed responses; cancellation/completion race


def test_llm_c09_streamed_deltas_are_ordered_and_match_result(shell: ShellPage) -> None:
    app, handle = ready(shell)
    shell.queue(
        "fx-full",
        [
            CREATED,
            *text_events(["Hel", "lo, "])[:-1],
            Stall(0.05),
            *text_events(["Hel", "lo, ", "wor", "ld"])[3:],
            completed(),
        ],
    )
    result = app.run(generate("g1", handle))
    deltas = deltas_of(app.envelopes(), "g1")
    assert deltas[0]["event"] == "start" and deltas[-1]["event"] == "end"
    assert {d["event"] for d in deltas[1:-1]} == {"delta"} and len(deltas) >= 4
    assert result["result"]["content"] == [{"type": "text", "text": "Hello, world"}]
    assert app.envelopes()[-1] == result


def test_llm_c09_buffered_provider_output(shell: ShellPage) -> None:
    app, handle = ready(shell)
    done = text_events("all at once")[-1]
    shell.queue("fx-full", [CREATED, done, completed()])
    result = app.run(generate("g1", handle))
    assert result["result"]["content"] == [{"type": "text", "text": "all at once"}]


def test_llm_c09_completion_wins_then_cancel_is_false(shell: ShellPage) -> None:
    app, handle = ready(shell)
    shell.queue("fx-full", text_script("done"))
    app.run(generate("g1", handle))
    app.post({"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    assert app.wait_for("c1", "llm.cancel.result")["cancelled"] is False
    assert code(terminal(app.envelopes(), "g1")) is None


def test_llm_c09_cancel_completion_race(shell: ShellPage) -> None:
    app, handle = ready(shell)
    # a standing grant first, so that the rounds below race the provider, not the dialog
    shell.queue("fx-full", text_script("granted"))
    app.post(generate("g-grant", handle))
    shell.remember()
    app.wait_for("g-grant")
    before = shell.submissions("fx-full")
    delays = (0, 0, 20, 40, 60, 80, 120, 400)
    outcomes = []
    for round_, delay_ms in enumerate(delays):
        rid = f"g{round_}"
        shell.queue("fx-full", [CREATED, *text_events(["a", "b"]), Stall(0.05), completed()])
        app.evaluate(
            "([envelope, ms]) => { window.probe.post(envelope); setTimeout(() =>"
            " window.probe.post({type: 'llm.cancel', id: 'c-' + envelope.id,"
            " requestId: envelope.id}), ms); }",
            [generate(rid, handle), delay_ms],
        )
        cancelled = app.wait_for("c-" + rid, "llm.cancel.result")["cancelled"]
        app.wait_for(rid)
        result = check_generation(app.quiet(), rid)
        if cancelled:
            safe(result, ErrorCode.CANCELLED)
        else:
            assert result["result"]["content"] == [{"type": "text", "text": "ab"}]
        outcomes.append(cancelled)
    assert shell.open_dialogs() == 0
    assert set(outcomes) == {True, False}, outcomes
    # a generation cancelled before the provider started leaves its script queued:
    # consume the rest so that later tests start from an empty queue
    for extra in range(len(delays) - (shell.submissions("fx-full") - before)):
        app.post(generate(f"drain{extra}", handle))
        app.wait_for(f"drain{extra}")
    assert shell.submissions("fx-full") - before == len(delays)


# --------------------------------------------------------------------------
# LLM-C10: limit/refusal, missing finish marker or invalid JSON-object completion


def test_llm_c10_partial_results_remain_partial(shell: ShellPage) -> None:
    app, handle = ready(shell)
    shell.queue(
        "fx-full",
        [CREATED, *text_events(["Incomplete ", "answer"]), incomplete("max_output_tokens")],
    )
    app.post(generate("g1", handle, maxTokens=3))
    shell.remember()
    app.wait_for("g1")
    result = check_generation(app.quiet(), "g1")
    assert result["result"] == {
        "content": [{"type": "text", "text": "Incomplete answer"}],
        "finish": "length",
        "usage": {"inputTokens": 12, "outputTokens": 3},
    }
    assert last_request(shell, "fx-full")["max_output_tokens"] == 3
    shell.queue("fx-full", [CREATED, *text_events("I can"), incomplete("content_filter")])
    assert app.run(generate("g2", handle), allow=None)["result"]["finish"] == "refusal"
    # a truncated JSON answer stays partial: it is not validated as a completed object
    shell.queue("fx-full", [CREATED, *text_events('{"a": '), incomplete("max_output_tokens")])
    result = app.run(generate("g3", handle, format="json"), allow=None)
    assert result["result"]["finish"] == "length"


def test_llm_c10_malformed_completion_is_provider_error(shell: ShellPage) -> None:
    app, handle = ready(shell)
    added = text_events("x")[0]
    scripts: list[tuple[list[Any], dict[str, Any]]] = [
        ([CREATED, *text_events("no marker")], {}),
        ([CREATED, added, completed()], {}),
        (text_script("[1, 2]"), {"format": "json"}),
        (text_script('"scalar"'), {"format": "json"}),
        (text_script("not json"), {"format": "json"}),
        (text_script('{"a": 1} trailing'), {"format": "json"}),
    ]
    for index, (script, fields) in enumerate(scripts):
        shell.queue("fx-full", script)
        app.post(generate(f"g{index}", handle, **fields))
        if index == 0:
            shell.remember()
        result = app.wait_for(f"g{index}")
        safe(result, ErrorCode.PROVIDER_ERROR)
    envelopes = app.quiet()
    for index in range(len(scripts)):
        check_generation(envelopes, f"g{index}")
    shown = json.dumps([e for e in envelopes if e.get("type") == "llm.generate.result"])
    assert "scalar" not in shown and "trailing" not in shown


# --------------------------------------------------------------------------
# LLM-C11: provider failure containing input or credentials


SECRET_KEY = "sk-live-4f9a8b7c6d5e4f3a2b1c"
CREDENTIAL = "cred-3e1f-very-private-token"
OTHER_PROMPT = "the other napplet's confidential diary"

FAILURES: list[Any] = [
    Fail(detail=f"401 body: invalid key {SECRET_KEY} for {CREDENTIAL}: {OTHER_PROMPT}"),
    Crash(f"Traceback ... Authorization: Bearer {CREDENTIAL} {SECRET_KEY} {OTHER_PROMPT}"),
    LmspEvent(
        event="response.failed",
        data={
            "response_id": "resp_fixture",
            "status": "failed",
            "error": {
                "type": "about:blank",
                "title": f"bad key {SECRET_KEY}",
                "status": 500,
                "detail": f"{CREDENTIAL} {OTHER_PROMPT}",
            },
        },
    ),
    LmspEvent(event="error", data={"message": f"{SECRET_KEY} {OTHER_PROMPT}"}),
]


def test_llm_c11_provider_failure_leaks_nothing(shell: ShellPage) -> None:
    victim, victim_handle = ready(shell)
    attacker, attacker_handle = ready(shell)
    shell.queue("fx-full", [CREATED, Stall(0.05), *text_events("fine"), completed()])
    victim.post(generate("v1", victim_handle, user(OTHER_PROMPT)))
    shell.allow()
    for index, failure in enumerate(FAILURES):
        shell.queue("fx-full", [CREATED, *text_events("half"), failure])
        attacker.post(generate(f"g{index}", attacker_handle, user("hello")))
        if index == 0:
            shell.remember()
        safe(attacker.wait_for(f"g{index}"), ErrorCode.PROVIDER_ERROR)
    assert code(victim.wait_for("v1")) is None
    seen_attacker = attacker.quiet()
    for index in range(len(FAILURES)):
        check_generation(seen_attacker, f"g{index}")
    check_generation(victim.envelopes(), "v1")
    everything = json.dumps([seen_attacker, victim.envelopes(), shell.notices()])
    for secret in (SECRET_KEY, CREDENTIAL):
        assert secret not in everything
    assert OTHER_PROMPT not in json.dumps(seen_attacker)
    assert OTHER_PROMPT not in json.dumps(shell.notices())


# --------------------------------------------------------------------------
# LLM-C12: assistant turn with multiple toolCall parts; next request omits one result


def test_llm_c12_missing_result_of_parallel_calls_is_invalid(shell: ShellPage) -> None:
    app, handle = ready(shell)
    messages = [user("weather in B and P?"), assistant(CALL, CALL_2), result_msg("call_2")]
    cases = {
        "last turn": generate("g1", handle, *messages, tools=[WEATHER_TOOL]),
        "earlier turn": generate("g2", handle, *messages, user("and now?"), tools=[WEATHER_TOOL]),
    }
    rejected(shell, app, cases, "invalid-request", "fx-full")


def test_llm_c12_all_results_in_any_order_are_accepted(shell: ShellPage) -> None:
    app, handle = ready(shell)
    messages = [
        user("weather in B and P?"),
        assistant(CALL, CALL_2),
        result_msg("call_2", "sunny"),
        result_msg("call_1", "rain"),
    ]
    shell.queue("fx-full", text_script("Rain in B, sun in P."))
    result = app.run(generate("g1", handle, *messages, tools=[WEATHER_TOOL]))
    assert result["result"]["finish"] == "stop"
    outputs = items(last_request(shell, "fx-full"), "function_call_output")
    assert [(o["call_id"], o["output"]) for o in outputs] == [
        ("call_2", "sunny"),
        ("call_1", "rain"),
    ]


# --------------------------------------------------------------------------
# LLM-C13: toolChoice forcing a named tool; provider ignores it


def test_llm_c13_ignored_forced_tool_is_provider_error(shell: ShellPage) -> None:
    app, handle = ready(shell)
    scripts = [
        text_script("I'd rather just chat."),
        tool_call_script([("get_time", {}, "call_9")]),
        tool_call_script([("get_weather", {"city": "B"}, "c1"), ("get_time", {}, "c2")]),
    ]
    for index, script in enumerate(scripts):
        shell.queue("fx-full", script)
        app.post(generate(f"g{index}", handle, tools=[WEATHER_TOOL, OTHER_TOOL], toolChoice=FORCED))
        if index == 0:
            shell.remember()
        safe(app.wait_for(f"g{index}"), ErrorCode.PROVIDER_ERROR)
        choice = last_request(shell, "fx-full")["tool_choice"]
        assert choice == {"type": "function", "name": "get_weather"}
    # violated modes are failures too, never a fallback
    for rid, choice_mode, script in (
        ("r1", "required", text_script("no call")),
        ("r2", "none", tool_call_script([("get_weather", {"city": "B"}, "c1")])),
    ):
        shell.queue("fx-full", script)
        app.post(generate(rid, handle, tools=[WEATHER_TOOL], toolChoice=choice_mode))
        safe(app.wait_for(rid), ErrorCode.PROVIDER_ERROR)
    # obeyed: the forced call is returned
    shell.queue("fx-full", tool_call_script([("get_weather", {"city": "B"}, "c1")]))
    envelope = generate("ok", handle, tools=[WEATHER_TOOL, OTHER_TOOL], toolChoice=FORCED)
    assert app.run(envelope, allow=None)["result"]["finish"] == "toolUse"


# --------------------------------------------------------------------------
# LLM-C14: provider returns no tool call id


def test_llm_c14_synthesized_call_id_is_stable_and_round_trips(shell: ShellPage) -> None:
    app, handle = ready(shell)
    before = shell.submissions("fx-full")
    shell.queue("fx-full", tool_call_script([("get_weather", {"city": "B"}, None)]))
    result = app.run(generate("g1", handle, user("w?"), tools=[WEATHER_TOOL]))
    assert result["result"]["finish"] == "toolUse"
    call = result["result"]["content"][0]
    call_id = call["toolCallId"]
    assert call_id
    start = deltas_of(app.envelopes(), "g1")[0]
    assert start["event"] == "start" and start["toolCallId"] == call_id
    history = [user("w?"), assistant(call), result_msg(call_id, "18 C")]
    shell.queue("fx-full", text_script("It is 18 C."))
    second = app.run(generate("g2", handle, *history, tools=[WEATHER_TOOL]))
    assert second["result"]["finish"] == "stop"
    request = last_request(shell, "fx-full")
    assert [c["call_id"] for c in items(request, "function_call")] == [call_id]
    assert [o["call_id"] for o in items(request, "function_call_output")] == [call_id]
    # parallel calls without ids get distinct ids
    shell.queue("fx-full", tool_call_script([("get_weather", {"city": "B"}, None)] * 2))
    third = app.run(generate("g3", handle, tools=[WEATHER_TOOL]))
    ids = [p["toolCallId"] for p in third["result"]["content"]]
    assert len(ids) == 2 and len(set(ids)) == 2 and call_id not in ids
    assert shell.submissions("fx-full") == before + 3


# --------------------------------------------------------------------------
# LLM-C15: completed calls with different stop labels; truncated parallel turn


def test_llm_c15_completed_calls_normalize_to_tool_use(shell: ShellPage) -> None:
    app, handle = ready(shell)
    for index, label in enumerate((None, "stop", "end_turn", "tool_calls", "tool_use")):
        final = completed()
        if label is not None:
            final = LmspEvent(event=final.event, data={**final.data, "stop_reason": label})
        script = [*tool_call_script([("get_weather", {"city": "B"}, "c1")])[:-1], final]
        shell.queue("fx-full", script)
        app.post(generate(f"g{index}", handle, tools=[WEATHER_TOOL]))
        if index == 0:
            shell.remember()
        result = app.wait_for(f"g{index}")
        assert result["result"]["finish"] == "toolUse", (label, result)
    for index in range(5):
        check_generation(app.quiet(), f"g{index}")


def test_llm_c15_truncated_parallel_turn_keeps_finish_without_calls(shell: ShellPage) -> None:
    app, handle = ready(shell)
    for index, (reason, finish) in enumerate(
        (("max_output_tokens", "length"), ("content_filter", "refusal"))
    ):
        shell.queue(
            "fx-full",
            [
                CREATED,
                *text_events("Checking both.", output_index=0),
                *call_events("get_weather", {"city": "B"}, call_id="c1", output_index=1),
                *call_events("get_weather", '{"city": "P"}', call_id="c2", output_index=2)[:1],
                LmspEvent(
                    event="response.function_call_arguments.delta",
                    data={"item_id": "fc_2", "output_index": 2, "delta": '{"city": "P'},
                ),
                incomplete(reason),
            ],
        )
        rid = f"g{index}"
        app.post(generate(rid, handle, tools=[WEATHER_TOOL]))
        if index == 0:
            shell.remember()
        app.wait_for(rid)
        result = check_generation(app.quiet(), rid)
        assert result["result"]["finish"] == finish
        assert result["result"]["content"] == [{"type": "text", "text": "Checking both."}]
        # the provisional call blocks were streamed but are not executable content
        assert "toolCall" in {d["block"] for d in deltas_of(app.envelopes(), rid)}


# --------------------------------------------------------------------------
# LLM-C16: completed arguments malformed or not an object; unknown tool name


def test_llm_c16_invalid_completed_call_is_provider_error(shell: ShellPage) -> None:
    app, handle = ready(shell)
    calls = [
        ("get_weather", '{"city": "B"'),
        ("get_weather", "{'city': 'B'}"),
        ("get_weather", '["B"]'),
        ("get_weather", '"B"'),
        ("get_weather", '{"city": "B"}} extra'),
        ("launch_missiles", '{"city": "B"}'),
    ]
    for index, (name, arguments) in enumerate(calls):
        shell.queue("fx-full", tool_call_script([(name, arguments, "c1")], stream_arguments=False))
        app.post(generate(f"g{index}", handle, tools=[WEATHER_TOOL]))
        if index == 0:
            shell.remember()
        result = app.wait_for(f"g{index}")
        safe(result, ErrorCode.PROVIDER_ERROR)
        assert arguments not in json.dumps(result)


# --------------------------------------------------------------------------
# LLM-C17: replay thinking; connection requires opaque reasoning state


THINKING_HISTORY = [
    user("2+2?"),
    assistant(
        {"type": "thinking", "text": "PRIVATE-CHAIN add two and two"}, {"type": "text", "text": "4"}
    ),
    user("and 3+3?"),
]


def test_llm_c17_thinking_omitted_from_provider_input(shell: ShellPage) -> None:
    app, handle = ready(shell)
    shell.queue("fx-full", text_script("6"))
    result = app.run(generate("g1", handle, *THINKING_HISTORY))
    assert result["result"]["finish"] == "stop"
    request = last_request(shell, "fx-full")
    assert "PRIVATE-CHAIN" not in json.dumps(request)
    replies = [i for i in items(request, "message") if i["role"] == "assistant"]
    assert [[c["text"] for c in i["content"]] for i in replies] == [["4"]]


def test_llm_c17_required_reasoning_state_is_unsupported(shell: ShellPage) -> None:
    app, handle = ready(shell, REASONING)
    rejected(
        shell,
        app,
        {"thinking": generate("g1", handle, *THINKING_HISTORY)},
        "unsupported",
        "fx-reasoning",
    )
    # the same connection without replayed thinking works
    before = shell.submissions("fx-reasoning")
    shell.queue("fx-reasoning", text_script("fine"))
    assert app.run(generate("g2", handle))["result"]["finish"] == "stop"
    assert shell.submissions("fx-reasoning") == before + 1


# --------------------------------------------------------------------------
# LLM-C18: stream interleaved tool-call blocks


def interleaved_calls() -> list[Any]:
    a = call_events("get_weather", '{"city": "Berlin"}', call_id="ca", output_index=0)
    b = call_events("get_weather", '{"city": "Paris"}', call_id="cb", output_index=1)

    def frag(index: int, text: str) -> LmspEvent:
        return LmspEvent(
            event="response.function_call_arguments.delta",
            data={"item_id": f"fc_{index}", "output_index": index, "delta": text},
        )

    # stalls keep the delta coalescing of the runtime from merging the fragments
    return [
        CREATED,
        a[0],
        frag(0, '{"ci'),
        Stall(0.03),
        b[0],
        frag(1, '{"city": '),
        Stall(0.03),
        frag(0, 'ty": "Ber'),
        Stall(0.03),
        frag(1, '"Paris"}'),
        Stall(0.03),
        frag(0, 'lin"}'),
        Stall(0.03),
        b[-1],
        a[-1],
        completed(),
    ]


def test_llm_c18_interleaved_tool_call_blocks(shell: ShellPage) -> None:
    app, handle = ready(shell)
    before = shell.submissions("fx-full")
    shell.queue("fx-full", interleaved_calls())
    result = app.run(generate("g1", handle, tools=[WEATHER_TOOL]))
    assert result["result"]["finish"] == "toolUse"
    assert [(p["toolCallId"], p["arguments"]) for p in result["result"]["content"]] == [
        ("ca", {"city": "Berlin"}),
        ("cb", {"city": "Paris"}),
    ]
    deltas = deltas_of(app.envelopes(), "g1")
    for index, call_id in ((0, "ca"), (1, "cb")):
        events = [d for d in deltas if d["blockIndex"] == index]
        assert events[0]["event"] == "start"
        assert (events[0]["toolCallId"], events[0]["name"]) == (call_id, "get_weather")
        assert events[-1]["event"] == "end"
        assert {e["event"] for e in events[1:-1]} == {"delta"}
    order = [d["blockIndex"] for d in deltas]
    assert order != sorted(order), "the blocks interleave on the wire"
    # the runtime executes nothing: one submission, no further requests
    assert shell.submissions("fx-full") == before + 1


def test_llm_c18_provisional_block_then_failure_is_not_executable(shell: ShellPage) -> None:
    app, handle = ready(shell)
    shell.queue("fx-full", [*interleaved_calls()[:-3], Fail(detail="stream reset")])
    result = app.run(generate("g1", handle, tools=[WEATHER_TOOL]))
    safe(result, ErrorCode.PROVIDER_ERROR)
    assert any(d["block"] == "toolCall" for d in deltas_of(app.envelopes(), "g1"))


# --------------------------------------------------------------------------
# LLM-C19: request an unlisted tool-choice mode


def test_llm_c19_unlisted_mode_is_unsupported(shell: ShellPage) -> None:
    app = shell.open_napplet()
    app.post({"type": "llm.select", "id": "s1", "requirements": {"tools": True}})
    shell.choose(AUTO)
    model = app.wait_for("s1", "llm.select.result")["model"]
    assert model["toolChoiceModes"] == ["auto", "none"]
    handle = model["handle"]
    cases = {
        "required": generate("g1", handle, tools=[WEATHER_TOOL], toolChoice="required"),
        "named": generate("g2", handle, tools=[WEATHER_TOOL], toolChoice=FORCED),
    }
    rejected(shell, app, cases, "unsupported", "fx-auto")
    # listed modes pass through unchanged
    for rid, mode in (("g3", "auto"), ("g4", "none")):
        shell.queue("fx-auto", text_script("ok"))
        app.run(generate(rid, handle, tools=[WEATHER_TOOL], toolChoice=mode))
        assert last_request(shell, "fx-auto")["tool_choice"] == mode


# --------------------------------------------------------------------------
# LLM-C20: duplicate/invalid tool names, missing tools, unknown forced name,
# non-object schema, zero maxTokens


INVALID_TOOLS: dict[str, dict[str, Any]] = {
    "duplicate names": {"tools": [WEATHER_TOOL, WEATHER_TOOL]},
    "invalid name": {"tools": [{**WEATHER_TOOL, "name": "get weather"}]},
    "long name": {"tools": [{**WEATHER_TOOL, "name": "x" * 65}]},
    "choice without tools": {"toolChoice": "auto"},
    "choice with empty tools": {"tools": [], "toolChoice": "required"},
    "unknown forced name": {"tools": [WEATHER_TOOL], "toolChoice": {"type": "tool", "name": "x"}},
    "non-object schema": {"tools": [{**WEATHER_TOOL, "parameters": {"type": "array"}}]},
    "malformed schema": {
        "tools": [{**WEATHER_TOOL, "parameters": {"type": "object", "properties": 3}}]
    },
    "zero maxTokens": {"maxTokens": 0},
    "negative maxTokens": {"maxTokens": -5},
}


def test_llm_c20_invalid_tools_and_limits(shell: ShellPage) -> None:
    app, handle = ready(shell)
    cases = {}
    for index, (case, fields) in enumerate(sorted(INVALID_TOOLS.items())):
        envelope = generate(f"g{index}", handle)
        envelope["request"].update(fields)
        cases[case] = envelope
    rejected(shell, app, cases, "invalid-request", "fx-full")


# --------------------------------------------------------------------------
# LLM-C21: misplaced/duplicate/orphaned results; history without current tools


INVALID_HISTORIES: dict[str, list[dict[str, Any]]] = {
    "orphaned": [user("q"), result_msg("call_1")],
    "misplaced after user": [user("q"), assistant(CALL), user("wait"), result_msg("call_1")],
    "duplicate": [user("q"), assistant(CALL), result_msg("call_1"), result_msg("call_1")],
    "name mismatch": [user("q"), assistant(CALL), {**result_msg("call_1"), "toolName": "get_time"}],
    "duplicate call ids": [
        user("q"),
        assistant(CALL),
        result_msg("call_1"),
        assistant(CALL),
        result_msg("call_1"),
    ],
    "call outside assistant": [{"role": "user", "content": [CALL]}],
    "isError on user": [{**user("q"), "isError": False}],
}
HISTORY = [user("weather?"), assistant(CALL), result_msg("call_1"), user("thanks, summarize")]


def test_llm_c21_invalid_histories_rejected(shell: ShellPage) -> None:
    app, handle = ready(shell)
    cases = {
        case: generate(f"g{index}", handle, *messages, tools=[WEATHER_TOOL])
        for index, (case, messages) in enumerate(sorted(INVALID_HISTORIES.items()))
    }
    rejected(shell, app, cases, "invalid-request", "fx-full")


def test_llm_c21_history_without_current_tools(shell: ShellPage) -> None:
    app, handle = ready(shell)
    shell.queue("fx-full", text_script("It was 18 C."))
    assert app.run(generate("g1", handle, *HISTORY))["result"]["finish"] == "stop"
    request = last_request(shell, "fx-full")
    assert "tools" not in request and "tool_choice" not in request
    assert [i["type"] for i in request["input"]] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    # without current tools, a new provider call is not accepted
    shell.queue("fx-full", tool_call_script([("get_weather", {"city": "B"}, "c2")]))
    app.post(generate("g2", handle, *HISTORY))
    shell.allow()
    safe(app.wait_for("g2"), ErrorCode.PROVIDER_ERROR)
    # a connection without tools cannot take the history at all
    text_app, text_handle = ready(shell, TEXT)
    rejected(
        shell,
        text_app,
        {"history": generate("g1", text_handle, *HISTORY)},
        "unsupported",
        "fx-text",
    )


# --------------------------------------------------------------------------
# LLM-C22: image tool result; error result with no provider-native flag


IMAGE_RESULT = [
    user("screenshot?"),
    assistant(CALL),
    {
        **result_msg("call_1"),
        "content": [
            {"type": "text", "text": "here"},
            {"type": "image", "mimeType": "image/png", "data": PNG},
        ],
    },
]


def test_llm_c22_image_in_tool_result_unsupported_before_submission(shell: ShellPage) -> None:
    app, handle = ready(shell, AUTO)
    cases = {"image result": generate("g1", handle, *IMAGE_RESULT, tools=[WEATHER_TOOL])}
    rejected(shell, app, cases, "unsupported", "fx-auto")
    # where supported, the image reaches the provider with the result
    full_app, full_handle = ready(shell)
    shell.queue("fx-full", text_script("I see it."))
    full_app.run(generate("g1", full_handle, *IMAGE_RESULT, tools=[WEATHER_TOOL]))
    (output,) = items(last_request(shell, "fx-full"), "function_call_output")
    assert PNG in json.dumps(output)


def test_llm_c22_error_flag_maps_to_prefix(shell: ShellPage) -> None:
    app, handle = ready(shell)
    for rid, flag, expected in (
        ("g1", True, "Tool execution failed.\nservice unreachable"),
        ("g2", False, "service unreachable"),
    ):
        messages = [
            user("weather?"),
            assistant(CALL),
            result_msg("call_1", "service unreachable", isError=flag),
        ]
        shell.queue("fx-full", text_script("Sorry."))
        app.run(generate(rid, handle, *messages, tools=[WEATHER_TOOL]))
        (output,) = items(last_request(shell, "fx-full"), "function_call_output")
        assert output["output"] == expected


# --------------------------------------------------------------------------
# LLM-C23: consent declined with sensitive tool definitions/results


def test_llm_c23_disclosure_names_tools_and_results_then_decline(shell: ShellPage) -> None:
    app, handle = ready(shell, PAID)
    before = shell.submissions("fx-paid")
    secret_result = "account balance 12,345.67 EUR"
    messages = [
        user("weather and balance?"),
        assistant(CALL, {**CALL_2, "name": "get_balance", "arguments": {}}),
        result_msg("call_1", "18 C"),
        {**result_msg("call_2", secret_result), "toolName": "get_balance", "isError": True},
    ]
    balance_tool = {
        "name": "get_balance",
        "description": "Read the user's bank balance",
        "parameters": {"type": "object", "properties": {}},
    }
    app.post(generate("g1", handle, *messages, tools=[WEATHER_TOOL, balance_tool]))
    dialog = shell.consent()
    text = dialog.inner_text()
    # the requesting napplet, the route/model, both tool definitions, both results, charges
    assert "probe.html" in text and "fixture-paid" in text
    assert "get_weather" in text and "Look up current weather" in text
    assert "get_balance" in text and "Read the user's bank balance" in text
    assert "call_1" in text and "call_2" in text and "reports an error" in text
    assert "may charge you" in text
    results = dialog.locator(".tool-results li").all_inner_texts()
    assert len(results) == 2
    assert f"{len(secret_result)} characters" in results[1]
    shell.deny()
    safe(app.wait_for("g1"), ErrorCode.USER_CANCELLED)
    assert shell.submissions("fx-paid") == before
    assert secret_result not in json.dumps(app.quiet())
