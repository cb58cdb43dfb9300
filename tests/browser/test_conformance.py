"""NAP-LLM conformance cases LLM-C01..LLM-C23 in Chromium against the real shell.

The shell page (web/ with napllm in Pyodide, ``?test=1``) runs the fixture
connections ``fx-*``; napplet frames run ``napplets/probe.html``, which posts
envelopes from inside the sandboxed frame the NIP-5D web projection's way
(``window.parent.postMessage``) and records what the shell delivers as
``message`` events whose ``source`` is ``window.parent``. The chooser and
consent dialogs are answered with real clicks (and Esc); provider
submissions are counted with ``napllmTest.stats``. Each test
asserts the *required observation* of its row in the NAP-LLM Conformance
Cases table under the name of its tests/unit/test_conformance_core.py
counterpart, and parametrizes over the same tables (tests/conformance_cases.py),
so every case runs in Pyodide too (tests/unit/test_conformance_tables.py
checks both). Cases that only need a provider's answer run on the
product's scripted connection, set up through the connections form
(`scripted`); the others use the fixture connections, which show what only
they can: provider submission counts, the LMSP request sent, and raw LMSP
event scripts (failures, truncations, interleavings).

One page is booted per module and reused: every test opens its own napplet
tabs (fresh endpoints) and closes them, and the shared state (deadline,
profile, standing permissions) is reset after each test. A case table runs
as one batch through one tab the first time one of its cases is collected
(`batch`); each parametrized test then asserts its own case's outcome.
"""

from __future__ import annotations

import json
from collections.abc import Callable
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
    terminal,
    user,
    wait_deltas,
)

import conformance_cases as cases
from conformance_cases import (
    CALL,
    CALL_2,
    CREATED,
    CREDENTIAL,
    FORCED,
    HISTORY,
    IMAGE_RESULT,
    OTHER_PROMPT,
    OTHER_TOOL,
    PNG,
    SECRET_KEY,
    THINKING_HISTORY,
    assistant,
    interleaved_calls,
    result_msg,
    truncated_parallel_turn,
)
from fixtures import WEATHER_TOOL
from napllm.errors import SAFE_MESSAGES, ErrorCode
from napllm.lmsp import LmspEvent
from napllm.providers.fixture import (
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


#: The page's scripted connection (the product's kind for napplet development).
SCRIPTED = "Scripted (conformance)"


def scripted(shell: ShellPage, turns: list[dict[str, Any]]) -> str:
    """Make the scripted connection play `turns` from its first; returns its name.

    The connection is added (or edited, which starts its script again)
    through the connections form, as a napplet developer does; its handles
    expire with each edit. Cases that need what only the fixture connections
    show (submission counts, the LMSP request, raw LMSP events) use those.
    """
    page = shell.page
    entry = page.locator("#connection-list li.connection", has_text=SCRIPTED)
    if entry.count() == 0:
        page.click("#connection-add")
        page.fill("#connection-name", SCRIPTED)
        page.select_option("#connection-kind", "scripted")
    else:
        entry.locator("button.edit").click()
    page.fill("#connection-script", json.dumps(turns))
    page.click("#connection-save")
    page.locator("#connection-form").wait_for(state="hidden")
    entry.wait_for()
    return SCRIPTED


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


# -- case tables in batches -------------------------------------------------------

_batches: dict[str, Any] = {}


def batch(key: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`run()`'s outcome for table `key`, computed once per module (a failure is kept)."""
    if key not in _batches:
        try:
            _batches[key] = run()
        except Exception as exc:  # every case of the table reports the batch's failure
            _batches[key] = exc
    outcome = _batches[key]
    if isinstance(outcome, Exception):
        raise AssertionError(f"the batch of {key} failed: {outcome!r}") from outcome
    result: dict[str, Any] = outcome
    return result


def rejections(
    shell: ShellPage,
    connection: str,
    cid: str,
    envelopes: Callable[[str], dict[str, dict[str, Any]]],
) -> dict[str, Any]:
    """Post every envelope of a table at once from one tab; collect each answer.

    `envelopes(handle)` maps case -> envelope (distinct ids). Returns
    `{"answers": {case: result envelope}, "dialogs": n, "submitted": n}`,
    the dialogs open and the provider submissions made once all were answered.
    """
    app, handle = ready(shell, connection)
    table = envelopes(handle)
    before = shell.submissions(cid)
    for envelope in table.values():
        app.post(envelope)
    answers = {
        case: app.wait_for(envelope["id"], envelope["type"] + ".result")
        for case, envelope in table.items()
    }
    envelopes_seen = app.quiet()
    for envelope in table.values():
        terminal(envelopes_seen, envelope["id"], envelope["type"] + ".result")
    return {
        "answers": answers,
        "dialogs": shell.open_dialogs(),
        "submitted": shell.submissions(cid) - before,
    }


def assert_rejected(outcome: dict[str, Any], case: str, expected: str) -> None:
    """`case` got `expected` and its table caused no dialog and no submission."""
    answer = outcome["answers"][case]
    assert code(answer) == expected, (case, answer)
    assert outcome["dialogs"] == 0 and outcome["submitted"] == 0


def with_fields(handle: str, table: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One generate per case: a valid request with the case's fields merged in."""
    out = {}
    for index, (case, fields) in enumerate(sorted(table.items())):
        envelope = generate(f"g{index}", handle)
        envelope["request"].update(fields)
        out[case] = envelope
    return out


def played(
    shell: ShellPage,
    table: dict[str, Any],
    scene: Callable[[str, str, Any], tuple[list[Any], dict[str, Any]]],
    connection: str = FULL,
    cid: str = "fx-full",
) -> dict[str, Any]:
    """Play each case of a provider table in turn through one tab.

    `scene(rid, handle, value)` returns `(script, envelope)`: the fixture
    script queued for the case and the generate sent. The first generation's
    consent is answered with "remember", so the others need no dialog.
    Returns `{"results": {case: terminal}, "deltas": {case: [delta]},
    "requests": {case: LMSP request}, "envelopes": everything received}`.
    """
    app, handle = ready(shell, connection)
    results: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    rids: dict[str, str] = {}
    for index, (case, value) in enumerate(sorted(table.items())):
        rid = f"g{index}"
        script, envelope = scene(rid, handle, value)
        shell.queue(cid, script)
        app.post(envelope)
        if index == 0:
            shell.remember()
        results[case] = app.wait_for(rid)
        requests[case] = last_request(shell, cid)
        rids[case] = rid
    envelopes = app.quiet()
    for rid in rids.values():
        check_generation(envelopes, rid)
    return {
        "results": results,
        "requests": requests,
        "deltas": {case: deltas_of(envelopes, rid) for case, rid in rids.items()},
        "envelopes": envelopes,
    }


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
    name = scripted(shell, [{"text": ["Hi ", "there"], "delayMs": 30}])
    selecting = app.call("select", {"tools": True})
    assert TEXT not in shell.candidates()
    shell.choose(name)
    selected = app.outcome(selecting)
    assert selected["state"] == "ok"
    model = selected["value"]
    describing = app.call("describe", model["handle"])
    assert app.outcome(describing) == {"method": "describe", "state": "ok", "value": model}
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
    # absence is discoverable without a handshake: no `llm` in the namespace
    assert plain.evaluate("() => Object.keys(window.napplet)") == []
    assert plain.evaluate("() => 'llm' in window.napplet") is False
    before = shell.submissions("fx-full")
    plain.post({"type": "llm.select", "id": "s1"})
    plain.post(generate("g1", "h-guess"))
    plain.post({"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    assert plain.quiet() == []
    assert shell.open_dialogs() == 0 and shell.submissions("fx-full") == before
    # the napplet's own (non-llm) functionality is unaffected
    assert plain.evaluate("() => document.querySelector('h1').textContent") == "Probe napplet"


def test_llm_c01_domain_absence_does_not_affect_other_endpoints(shell: ShellPage) -> None:
    plain = shell.open_napplet()
    plain.set_llm(False)
    with_llm = shell.open_napplet()
    plain.post({"type": "llm.select", "id": "s1"})
    # the other napplet's llm domain still works
    handle = with_llm.select(FULL)
    assert handle
    assert plain.quiet() == []


# --------------------------------------------------------------------------
# LLM-C02: malformed record, base64, enum or explicit null -> invalid-request


@pytest.mark.parametrize("case", sorted(cases.MALFORMED_REQUESTS))
def test_llm_c02_malformed_request_is_invalid_without_generation(
    shell: ShellPage, case: str
) -> None:
    outcome = batch(
        "MALFORMED_REQUESTS",
        lambda: rejections(
            shell, FULL, "fx-full", lambda h: with_fields(h, cases.MALFORMED_REQUESTS)
        ),
    )
    assert_rejected(outcome, case, "invalid-request")


def _envelopes(table: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {case: {**e, "id": f"e{i}"} for i, (case, e) in enumerate(sorted(table.items()))}


@pytest.mark.parametrize("case", sorted(cases.MALFORMED_ENVELOPES))
def test_llm_c02_malformed_envelope_is_invalid(shell: ShellPage, case: str) -> None:
    outcome = batch(
        "MALFORMED_ENVELOPES",
        lambda: rejections(
            shell, FULL, "fx-full", lambda _h: _envelopes(cases.MALFORMED_ENVELOPES)
        ),
    )
    assert_rejected(outcome, case, "invalid-request")


# --------------------------------------------------------------------------
# LLM-C03: unsupported images/JSON/tools/exact model or provider-specific input


def _unmet(_handle: str) -> dict[str, dict[str, Any]]:
    # pinned to the text-only fixture's model, so only the case's requirement decides
    return {
        case: {
            "type": "llm.select",
            "id": f"u{index}",
            "requirements": {"model": "fixture-text", **requirements},
        }
        for index, (case, requirements) in enumerate(sorted(cases.UNMET_REQUIREMENTS.items()))
    }


@pytest.mark.parametrize("case", sorted(cases.UNMET_REQUIREMENTS))
def test_llm_c03_select_unmet_requirement_is_unsupported(shell: ShellPage, case: str) -> None:
    outcome = batch("UNMET_REQUIREMENTS", lambda: rejections(shell, TEXT, "fx-text", _unmet))
    assert_rejected(outcome, case, "unsupported")


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


@pytest.mark.parametrize("case", sorted(cases.UNSUPPORTED_INPUTS))
def test_llm_c03_generate_unsupported_input_before_submission(shell: ShellPage, case: str) -> None:
    outcome = batch(
        "UNSUPPORTED_INPUTS",
        lambda: rejections(
            shell, TEXT, "fx-text", lambda h: with_fields(h, cases.UNSUPPORTED_INPUTS)
        ),
    )
    assert_rejected(outcome, case, "unsupported")


def test_llm_c03_temperature_out_of_range_is_unsupported(shell: ShellPage) -> None:
    app, handle = ready(shell)
    before = shell.submissions("fx-full")
    app.post(generate("g1", handle, temperature=2.5))
    assert code(app.wait_for("g1")) == "unsupported"
    assert shell.open_dialogs() == 0 and shell.submissions("fx-full") == before
    shell.queue("fx-full", text_script("ok"))
    result = app.run(generate("g2", handle, temperature=2.0))
    assert "result" in result and last_request(shell, "fx-full")["temperature"] == 2.0


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


def test_llm_c05_same_id_on_two_endpoints_cancels_only_own(shell: ShellPage) -> None:
    alpha, handle_a = ready(shell)
    beta, handle_b = ready(shell)
    shell.queue("fx-full", [CREATED, *text_events("alpha text"), Stall(0.5), completed()])
    alpha.post(generate("g1", handle_a))
    shell.allow()
    wait_deltas(alpha, "g1")
    shell.queue("fx-full", [CREATED, *text_events("beta text"), Stall(None), completed()])
    beta.post(generate("g1", handle_b))
    shell.allow()
    wait_deltas(beta, "g1")
    beta.post({"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    assert beta.wait_for("c1", "llm.cancel.result")["cancelled"] is True
    safe(beta.wait_for("g1"), ErrorCode.CANCELLED)
    result = alpha.wait_for("g1")
    assert result["result"]["content"] == [{"type": "text", "text": "alpha text"}]
    check_generation(alpha.quiet(), "g1")
    check_generation(beta.envelopes(), "g1")
    assert "beta" not in json.dumps(alpha.envelopes())
    assert "alpha" not in json.dumps(beta.envelopes())


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


def test_llm_c06_finished_id_may_be_reused(shell: ShellPage) -> None:
    app, handle = ready(shell, scripted(shell, [{"text": "first"}, {"text": "second"}]))
    app.post(generate("g1", handle))
    shell.remember()
    app.wait_for("g1")
    app.post(generate("g1", handle))
    app.frame.wait_for_function(
        "() => window.probe.envelopes()"
        ".filter((e) => e.type === 'llm.generate.result').length >= 2",
        polling=POLL_MS,
    )
    # two generations under one id, each answered by its own turn of the script
    results = _results(app, "g1")
    assert [r["result"]["content"][0]["text"] for r in results] == ["first", "second"]


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


def test_llm_c07_timeout_with_slow_but_finite_provider_discards_late_output(
    shell: ShellPage,
) -> None:
    app, handle = ready(shell)
    # a standing grant first, so that the deadline races the provider, not the dialog
    shell.queue("fx-full", text_script("granted"))
    app.post(generate("g0", handle))
    shell.remember()
    app.wait_for("g0")
    stats = shell.stats("fx-full")
    shell.set_deadline(0.3)
    shell.queue("fx-full", [CREATED, Stall(1.0), *text_events("late"), completed()])
    app.post(generate("g1", handle))
    safe(app.wait_for("g1", timeout_ms=5_000), ErrorCode.TIMEOUT)
    # the provider's stream is closed once the deadline settled the generation
    shell.page.wait_for_function(
        "([c, n]) => JSON.parse(window.napllmTest.stats(c)).closedEarly > n",
        arg=["fx-full", stats["closedEarly"]],
        polling=POLL_MS,
    )
    envelopes = app.quiet()
    check_generation(envelopes, "g1")
    assert deltas_of(envelopes, "g1") == [] and "late" not in json.dumps(envelopes)
    assert shell.submissions("fx-full") == stats["submissions"] + 1


def test_llm_c07_revalidation_after_consent_refuses_edited_connection(shell: ShellPage) -> None:
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


@pytest.mark.parametrize("change", cases.CONNECTION_CHANGES)
def test_llm_c08_connection_changed_during_consent(shell: ShellPage, change: str) -> None:
    app, handle = ready(shell, PAID)
    before = shell.submissions("fx-paid")
    app.post(generate("g1", handle))
    dialog = shell.consent()
    assert "may charge" in dialog.inner_text()
    try:
        if change == "edit":
            shell.rename_connection("fx-paid", "Fixture (replacement)")
        else:
            shell.page.evaluate("() => window.napllmTest.removeConnection('fx-paid')")
        assert code(app.wait_for("g1")) == "selection-expired"
        dialog.wait_for(state="detached")
        app.post({"type": "llm.describe", "id": "d1", "handle": handle})
        assert code(app.wait_for("d1", "llm.describe.result")) == "selection-expired"
        # a new select offers the changed connection under its new name only, or not at all
        app.post({"type": "llm.select", "id": "s2", "requirements": {"model": "fixture-paid"}})
        if change == "edit":
            assert shell.candidates() == ["Fixture (replacement)"]
            shell.cancel_chooser()
        else:
            assert code(app.wait_for("s2", "llm.select.result")) == "unsupported"
    finally:
        shell.page.evaluate("() => window.napllmTest.restoreConnection('fx-paid')")
        shell.rename_connection("fx-paid", PAID)
    assert shell.submissions("fx-paid") == before


def test_llm_c08_a_pick_on_a_chooser_list_that_changed_is_not_bound(shell: ShellPage) -> None:
    """The connection changes after the page drew the list and before the click lands."""
    app = shell.open_napplet()
    before = shell.submissions("fx-paid")
    names = (
        "() => [...document.querySelectorAll('dialog.chooser-dialog[open] .candidate-name')]"
        ".map((n) => n.textContent)"
    )
    shell.page.evaluate("() => window.napllmTest.holdChooserUpdates(true)")
    try:
        app.post({"type": "llm.select", "id": "s1", "requirements": {"model": "fixture-paid"}})
        assert shell.candidates() == [PAID]
        shell.rename_connection("fx-paid", "Fixture (replacement)")
        # The page still shows the list it drew: the runtime's refresh is late.
        assert shell.page.evaluate(names) == [PAID]
        shell.page.click(
            f"dialog.chooser-dialog[open] .candidate:has(.candidate-name:text-is('{PAID}'))"
        )
        # The click on the old list bound nothing: the current list is shown again.
        shell.page.wait_for_function(
            f"() => ({names})().join() === 'Fixture (replacement)'", polling=POLL_MS
        )
        assert [e for e in app.envelopes() if isinstance(e, dict) and e.get("id") == "s1"] == []
        assert "The connections changed" in shell.chooser().inner_text()
        shell.choose("Fixture (replacement)")
        model = app.wait_for("s1", "llm.select.result")["model"]
        assert model["name"] == "Fixture (replacement)"
    finally:
        shell.page.evaluate("() => window.napllmTest.holdChooserUpdates(false)")
        shell.rename_connection("fx-paid", PAID)
    assert shell.submissions("fx-paid") == before


def test_llm_c08_connection_removed_during_generation_cancels(shell: ShellPage) -> None:
    app, handle = ready(shell, PAID)
    stats = shell.stats("fx-paid")
    shell.queue("fx-paid", [CREATED, *text_events("partial"), Stall(None), completed()])
    app.post(generate("g1", handle))
    shell.allow()
    wait_deltas(app, "g1")
    try:
        shell.page.evaluate("() => window.napllmTest.removeConnection('fx-paid')")
        safe(app.wait_for("g1"), ErrorCode.CANCELLED)
        check_generation(app.quiet(), "g1")
    finally:
        shell.page.evaluate("() => window.napllmTest.restoreConnection('fx-paid')")
    assert shell.stats("fx-paid")["closedEarly"] == stats["closedEarly"] + 1


# --------------------------------------------------------------------------
# LLM-C09: buffered and streamed responses; cancellation/completion race


def test_llm_c09_streamed_deltas_are_ordered_and_match_result(shell: ShellPage) -> None:
    name = scripted(shell, [{"text": ["Hel", "lo, ", "wor", "ld"], "delayMs": 50}])
    app, handle = ready(shell, name)
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


def test_llm_c10_length_is_partial(shell: ShellPage) -> None:
    app, handle = ready(shell)
    shell.queue(
        "fx-full",
        [CREATED, *text_events(["Incomplete ", "answer"]), incomplete("max_output_tokens")],
    )
    result = app.run(generate("g1", handle, maxTokens=3))
    assert result["result"] == {
        "content": [{"type": "text", "text": "Incomplete answer"}],
        "finish": "length",
        "usage": {"inputTokens": 12, "outputTokens": 3},
    }
    assert last_request(shell, "fx-full")["max_output_tokens"] == 3


def test_llm_c10_refusal_is_partial(shell: ShellPage) -> None:
    app, handle = ready(shell)
    shell.queue("fx-full", [CREATED, *text_events("I can"), incomplete("content_filter")])
    assert app.run(generate("g1", handle))["result"]["finish"] == "refusal"


def test_llm_c10_length_with_json_format_is_not_validated_as_complete(shell: ShellPage) -> None:
    app, handle = ready(shell)
    shell.queue("fx-full", [CREATED, *text_events('{"a": '), incomplete("max_output_tokens")])
    result = app.run(generate("g1", handle, format="json"))
    assert result["result"]["finish"] == "length"


@pytest.mark.parametrize("case", sorted(cases.MISSING_COMPLETION))
def test_llm_c10_missing_completion_marker_is_provider_error(shell: ShellPage, case: str) -> None:
    outcome = batch(
        "MISSING_COMPLETION",
        lambda: played(
            shell, cases.MISSING_COMPLETION, lambda rid, h, script: (script, generate(rid, h))
        ),
    )
    safe(outcome["results"][case], ErrorCode.PROVIDER_ERROR)


@pytest.mark.parametrize("case", sorted(cases.JSON_NOT_OBJECT))
def test_llm_c10_json_format_needs_an_object(shell: ShellPage, case: str) -> None:
    outcome = batch(
        "JSON_NOT_OBJECT",
        lambda: played(
            shell,
            cases.JSON_NOT_OBJECT,
            lambda rid, h, text: (text_script(text), generate(rid, h, format="json")),
        ),
    )
    result = outcome["results"][case]
    safe(result, ErrorCode.PROVIDER_ERROR)
    assert cases.JSON_NOT_OBJECT[case] not in json.dumps(result)


# --------------------------------------------------------------------------
# LLM-C11: provider failure containing input or credentials


def _failures(shell: ShellPage, console: list[str]) -> dict[str, Any]:
    """Every failure of the table hits one napplet while another one's generation runs.

    `console` is the page's console as it grows; the lines each case added
    (the runtime's developer log) are kept in `outcome["log"][case]`.
    """
    marks: dict[str, int] = {}

    def scene(rid: str, handle: str, value: tuple[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        case, step = value
        marks[case] = len(console)
        return [CREATED, *text_events("half"), step], generate(rid, handle, user("hello"))

    victim, victim_handle = ready(shell)
    shell.queue("fx-full", [CREATED, Stall(0.3), *text_events("fine"), completed()])
    victim.post(generate("v1", victim_handle, user(OTHER_PROMPT)))
    shell.allow()
    outcome = played(
        shell,
        {case: (case, step) for case, (step, _logged) in cases.PROVIDER_FAILURES.items()},
        scene,
    )
    ordered = sorted(marks.items(), key=lambda item: item[1])  # in the order played
    ends = [start for _, start in ordered[1:]] + [len(console)]
    outcome["log"] = {
        case: console[start:end] for (case, start), end in zip(ordered, ends, strict=True)
    }
    assert code(victim.wait_for("v1")) is None
    check_generation(victim.quiet(), "v1")
    outcome["victim"] = victim.envelopes()
    outcome["notices"] = shell.notices()
    return outcome


@pytest.mark.parametrize("case", sorted(cases.PROVIDER_FAILURES))
def test_llm_c11_provider_failure_leaks_nothing(
    shell: ShellPage, request_log: Any, case: str
) -> None:
    outcome = batch("PROVIDER_FAILURES", lambda: _failures(shell, request_log.console))
    # the spec's detail: the typed code and the runtime's fixed, safe message
    result = outcome["results"][case]
    safe(result, cases.PROVIDER_FAILURE_CODE)
    assert set(result) == {"type", "id", "error"}
    # the developer log (the page's console) tells a provider's rejection from a crash
    logged = cases.PROVIDER_FAILURES[case][1]
    log = outcome["log"][case]
    assert any(f": {logged}" in line for line in log), log
    other = "provider or runtime failure" if logged == "provider failure" else "provider failure:"
    assert not any(other in line for line in log), log
    shown = json.dumps([result, outcome["deltas"][case]])
    for secret in (SECRET_KEY, CREDENTIAL, OTHER_PROMPT):
        assert secret not in shown
    # nothing reaches either napplet; the shell's own notices show the user no
    # failure text either, only the hint a provider adapter gives for the user
    # (here the fixture's, which names the user's own key)
    hint = cases.PROVIDER_FAILURES["fail-hint"][0].user_hint
    notices = [n for n in outcome["notices"] if hint not in n]
    everything = json.dumps([outcome["envelopes"], outcome["victim"], notices])
    assert SECRET_KEY not in everything and CREDENTIAL not in everything
    assert OTHER_PROMPT not in json.dumps([outcome["envelopes"], outcome["notices"]])


# --------------------------------------------------------------------------
# LLM-C12: assistant turn with multiple toolCall parts; next request omits one result


@pytest.mark.parametrize("case", sorted(cases.MISSING_PARALLEL_RESULTS))
def test_llm_c12_missing_result_of_parallel_calls_is_invalid(shell: ShellPage, case: str) -> None:
    def envelopes(handle: str) -> dict[str, dict[str, Any]]:
        return {
            name: generate(f"g{i}", handle, *messages, tools=[WEATHER_TOOL])
            for i, (name, messages) in enumerate(sorted(cases.MISSING_PARALLEL_RESULTS.items()))
        }

    outcome = batch(
        "MISSING_PARALLEL_RESULTS", lambda: rejections(shell, FULL, "fx-full", envelopes)
    )
    assert_rejected(outcome, case, "invalid-request")


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


@pytest.mark.parametrize("case", sorted(cases.IGNORED_FORCED))
def test_llm_c13_ignored_forced_tool_is_provider_error(shell: ShellPage, case: str) -> None:
    outcome = batch(
        "IGNORED_FORCED",
        lambda: played(
            shell,
            cases.IGNORED_FORCED,
            lambda rid, h, script: (
                script,
                generate(rid, h, tools=[WEATHER_TOOL, OTHER_TOOL], toolChoice=FORCED),
            ),
        ),
    )
    safe(outcome["results"][case], ErrorCode.PROVIDER_ERROR)
    assert outcome["requests"][case]["tool_choice"] == {"type": "function", "name": "get_weather"}


def test_llm_c13_forced_tool_obeyed(shell: ShellPage) -> None:
    turns = [{"toolCalls": [{"name": "get_weather", "arguments": {"city": "B"}, "id": "c1"}]}]
    app, handle = ready(shell, scripted(shell, turns))
    envelope = generate("g1", handle, tools=[WEATHER_TOOL, OTHER_TOOL], toolChoice=FORCED)
    assert app.run(envelope)["result"]["finish"] == "toolUse"


@pytest.mark.parametrize("choice", sorted(cases.VIOLATED_MODES))
def test_llm_c13_violated_mode_is_provider_error(shell: ShellPage, choice: str) -> None:
    outcome = batch(
        "VIOLATED_MODES",
        lambda: played(
            shell,
            {mode: (mode, script) for mode, script in cases.VIOLATED_MODES.items()},
            lambda rid, h, value: (
                value[1],
                generate(rid, h, tools=[WEATHER_TOOL], toolChoice=value[0]),
            ),
        ),
    )
    safe(outcome["results"][choice], ErrorCode.PROVIDER_ERROR)
    assert outcome["requests"][choice]["tool_choice"] == choice


# --------------------------------------------------------------------------
# LLM-C14: provider returns no tool call id


@pytest.mark.parametrize("delivery", sorted(cases.ARGUMENT_DELIVERY))
def test_llm_c14_synthesized_call_id_is_stable_and_round_trips(
    shell: ShellPage, delivery: str
) -> None:
    app, handle = ready(shell)
    before = shell.submissions("fx-full")
    stream_arguments = cases.ARGUMENT_DELIVERY[delivery]
    shell.queue(
        "fx-full",
        tool_call_script([("get_weather", {"city": "B"}, None)], stream_arguments=stream_arguments),
    )
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
    assert shell.submissions("fx-full") == before + 2


def test_llm_c14_empty_provider_id_is_synthesized(shell: ShellPage) -> None:
    app, handle = ready(shell)
    shell.queue("fx-full", tool_call_script([("get_weather", {"city": "B"}, "")]))
    result = app.run(generate("g1", handle, tools=[WEATHER_TOOL]))
    assert result["result"]["content"][0]["toolCallId"] != ""


def test_llm_c14_parallel_calls_without_ids_get_distinct_ids(shell: ShellPage) -> None:
    app, handle = ready(shell)
    shell.queue("fx-full", tool_call_script([("get_weather", {"city": "B"}, None)] * 2))
    result = app.run(generate("g1", handle, tools=[WEATHER_TOOL]))
    ids = [p["toolCallId"] for p in result["result"]["content"]]
    assert len(ids) == 2 and len(set(ids)) == 2


# --------------------------------------------------------------------------
# LLM-C15: completed calls with different stop labels; truncated parallel turn


def _labelled(rid: str, handle: str, label: str | None) -> tuple[list[Any], dict[str, Any]]:
    final = completed()
    if label is not None:
        final = LmspEvent(event=final.event, data={**final.data, "stop_reason": label})
    script = [*tool_call_script([("get_weather", {"city": "B"}, "c1")])[:-1], final]
    return script, generate(rid, handle, tools=[WEATHER_TOOL])


@pytest.mark.parametrize("case", sorted(cases.STOP_LABELS))
def test_llm_c15_completed_calls_normalize_to_tool_use(shell: ShellPage, case: str) -> None:
    outcome = batch("STOP_LABELS", lambda: played(shell, cases.STOP_LABELS, _labelled))
    assert outcome["results"][case]["result"]["finish"] == "toolUse"


def test_llm_c15_text_and_call_turn_is_tool_use(shell: ShellPage) -> None:
    app, handle = ready(shell)
    shell.queue(
        "fx-full",
        [
            CREATED,
            *text_events("Let me check.", output_index=0),
            *call_events(
                "get_weather", {"city": "B"}, output_index=1, fragments=['{"ci', 'ty":"B"}']
            ),
            completed(),
        ],
    )
    result = app.run(generate("g1", handle, tools=[WEATHER_TOOL]))
    assert result["result"]["finish"] == "toolUse"
    assert [p["type"] for p in result["result"]["content"]] == ["text", "toolCall"]


@pytest.mark.parametrize("reason", sorted(cases.TRUNCATED_TURNS))
def test_llm_c15_truncated_parallel_turn_keeps_finish_without_calls(
    shell: ShellPage, reason: str
) -> None:
    outcome = batch(
        "TRUNCATED_TURNS",
        lambda: played(
            shell,
            {r: r for r in cases.TRUNCATED_TURNS},
            lambda rid, h, r: (truncated_parallel_turn(r), generate(rid, h, tools=[WEATHER_TOOL])),
        ),
    )
    result = outcome["results"][reason]
    assert result["result"]["finish"] == cases.TRUNCATED_TURNS[reason]
    assert result["result"]["content"] == [{"type": "text", "text": "Checking both."}]
    # the provisional call blocks were streamed but are not executable content
    assert "toolCall" in {d["block"] for d in outcome["deltas"][reason]}


# --------------------------------------------------------------------------
# LLM-C16: completed arguments malformed or not an object; unknown tool name


@pytest.mark.parametrize("case", sorted(cases.INVALID_CALLS))
def test_llm_c16_invalid_completed_call_is_provider_error(shell: ShellPage, case: str) -> None:
    outcome = batch(
        "INVALID_CALLS",
        lambda: played(
            shell,
            cases.INVALID_CALLS,
            lambda rid, h, call: (
                tool_call_script([(call[0], call[1], "c1")], stream_arguments=False),
                generate(rid, h, tools=[WEATHER_TOOL]),
            ),
        ),
    )
    result = outcome["results"][case]
    safe(result, ErrorCode.PROVIDER_ERROR)
    assert cases.INVALID_CALLS[case][1] not in json.dumps(result)


# --------------------------------------------------------------------------
# LLM-C17: replay thinking; connection requires opaque reasoning state


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


def test_llm_c17_thinking_in_user_message_is_invalid(shell: ShellPage) -> None:
    app, handle = ready(shell)
    messages = [{"role": "user", "content": [{"type": "thinking", "text": "x"}]}]
    rejected(
        shell, app, {"thinking": generate("g1", handle, *messages)}, "invalid-request", "fx-full"
    )


# --------------------------------------------------------------------------
# LLM-C18: stream interleaved tool-call blocks


def test_llm_c18_interleaved_tool_call_blocks(shell: ShellPage) -> None:
    app, handle = ready(shell)
    before = shell.submissions("fx-full")
    shell.queue("fx-full", interleaved_calls(0.03))
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
    shell.queue("fx-full", [*interleaved_calls(0.03)[:-3], Fail(detail="stream reset")])
    result = app.run(generate("g1", handle, tools=[WEATHER_TOOL]))
    safe(result, ErrorCode.PROVIDER_ERROR)
    assert any(d["block"] == "toolCall" for d in deltas_of(app.envelopes(), "g1"))


# --------------------------------------------------------------------------
# LLM-C19: request an unlisted tool-choice mode


def _unlisted(shell: ShellPage) -> dict[str, Any]:
    app = shell.open_napplet()
    app.post({"type": "llm.select", "id": "s1", "requirements": {"tools": True}})
    shell.choose(AUTO)
    model = app.wait_for("s1", "llm.select.result")["model"]
    assert model["toolChoiceModes"] == ["auto", "none"]
    app.close()
    return rejections(
        shell,
        AUTO,
        "fx-auto",
        lambda h: {
            case: generate(f"g{i}", h, tools=[WEATHER_TOOL], toolChoice=choice)
            for i, (case, choice) in enumerate(sorted(cases.UNLISTED_MODES.items()))
        },
    )


@pytest.mark.parametrize("case", sorted(cases.UNLISTED_MODES))
def test_llm_c19_unlisted_mode_is_unsupported(shell: ShellPage, case: str) -> None:
    outcome = batch("UNLISTED_MODES", lambda: _unlisted(shell))
    assert_rejected(outcome, case, "unsupported")


def test_llm_c19_listed_modes_pass_through_unchanged(shell: ShellPage) -> None:
    app, handle = ready(shell, AUTO)
    for rid, mode in (("g1", "auto"), ("g2", "none")):
        shell.queue("fx-auto", text_script("ok"))
        app.run(generate(rid, handle, tools=[WEATHER_TOOL], toolChoice=mode))
        assert last_request(shell, "fx-auto")["tool_choice"] == mode


# --------------------------------------------------------------------------
# LLM-C20: duplicate/invalid tool names, missing tools, unknown forced name,
# non-object schema, zero maxTokens


@pytest.mark.parametrize("case", sorted(cases.INVALID_TOOLS))
def test_llm_c20_invalid_tools_and_limits(shell: ShellPage, case: str) -> None:
    outcome = batch(
        "INVALID_TOOLS",
        lambda: rejections(shell, FULL, "fx-full", lambda h: with_fields(h, cases.INVALID_TOOLS)),
    )
    assert_rejected(outcome, case, "invalid-request")


def test_llm_c20_schema_keywords_are_not_unknown_fields(shell: ShellPage) -> None:
    app, handle = ready(shell)
    before = shell.submissions("fx-full")
    shell.queue("fx-full", text_script("ok"))
    result = app.run(generate("g1", handle, tools=[cases.SCHEMA_KEYWORDS_TOOL]))
    assert "result" in result and shell.submissions("fx-full") == before + 1


# --------------------------------------------------------------------------
# LLM-C21: misplaced/duplicate/orphaned results; history without current tools


@pytest.mark.parametrize("case", sorted(cases.INVALID_HISTORIES))
def test_llm_c21_invalid_histories_rejected(shell: ShellPage, case: str) -> None:
    def envelopes(handle: str) -> dict[str, dict[str, Any]]:
        return {
            name: generate(f"g{i}", handle, *messages, tools=[WEATHER_TOOL])
            for i, (name, messages) in enumerate(sorted(cases.INVALID_HISTORIES.items()))
        }

    outcome = batch("INVALID_HISTORIES", lambda: rejections(shell, FULL, "fx-full", envelopes))
    assert_rejected(outcome, case, "invalid-request")


def test_llm_c21_history_without_current_tools_accepted(shell: ShellPage) -> None:
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


def test_llm_c21_no_new_calls_without_current_tools(shell: ShellPage) -> None:
    turns = [{"toolCalls": [{"name": "get_weather", "arguments": {"city": "B"}, "id": "c2"}]}]
    app, handle = ready(shell, scripted(shell, turns))
    safe(app.run(generate("g1", handle, *HISTORY)), ErrorCode.PROVIDER_ERROR)


def test_llm_c21_history_on_connection_without_tools_is_unsupported(shell: ShellPage) -> None:
    app, handle = ready(shell, TEXT)
    rejected(shell, app, {"history": generate("g1", handle, *HISTORY)}, "unsupported", "fx-text")


# --------------------------------------------------------------------------
# LLM-C22: image tool result; error result with no provider-native flag


def test_llm_c22_image_in_tool_result_unsupported_before_submission(shell: ShellPage) -> None:
    app, handle = ready(shell, AUTO)
    envelopes = {"image result": generate("g1", handle, *IMAGE_RESULT, tools=[WEATHER_TOOL])}
    rejected(shell, app, envelopes, "unsupported", "fx-auto")


def test_llm_c22_image_in_tool_result_accepted_where_supported(shell: ShellPage) -> None:
    full_app, full_handle = ready(shell)
    shell.queue("fx-full", text_script("I see it."))
    full_app.run(generate("g1", full_handle, *IMAGE_RESULT, tools=[WEATHER_TOOL]))
    (output,) = items(last_request(shell, "fx-full"), "function_call_output")
    assert PNG in json.dumps(output)


def _error_flag(shell: ShellPage, flag: bool) -> str:
    """The tool output the provider got for a result "service unreachable" flagged `flag`."""
    app, handle = ready(shell)
    messages = [
        user("weather?"),
        assistant(CALL),
        result_msg("call_1", "service unreachable", isError=flag),
    ]
    shell.queue("fx-full", text_script("Sorry."))
    app.run(generate("g1", handle, *messages, tools=[WEATHER_TOOL]))
    (output,) = items(last_request(shell, "fx-full"), "function_call_output")
    text: str = output["output"]
    return text


def test_llm_c22_error_flag_maps_to_prefix(shell: ShellPage) -> None:
    assert _error_flag(shell, True) == "Tool execution failed.\nservice unreachable"


def test_llm_c22_error_flag_false_has_no_prefix(shell: ShellPage) -> None:
    assert _error_flag(shell, False) == "service unreachable"


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
    assert "get_weather" in text and WEATHER_TOOL["description"] in text
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


def test_llm_c23_disclosure_of_default_tool_schema_and_images(shell: ShellPage) -> None:
    app, handle = ready(shell)
    before = shell.submissions("fx-full")
    app.post(generate("g1", handle, *IMAGE_RESULT, tools=[{"name": "get_weather"}]))
    dialog = shell.consent()
    # the default schema a tool without parameters is sent with, and the image counts
    schema = dialog.locator(".tool-definitions pre").first.text_content() or ""
    assert json.loads(schema) == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    images = dialog.locator("dt", has_text="Images").locator("xpath=following-sibling::dd[1]")
    assert images.inner_text() == "1"
    results = dialog.locator(".tool-results li").all_inner_texts()
    assert len(results) == 1 and "1 image" in results[0]
    shell.deny()
    safe(app.wait_for("g1"), ErrorCode.USER_CANCELLED)
    assert shell.submissions("fx-full") == before


# --------------------------------------------------------------------------
# MUST sentences whose caller side is the binding (docs/conformance.md)


def test_must_e2_binding_treats_an_unknown_error_code_as_failure(shell: ShellPage) -> None:
    """NAP-LLM, Error Handling: "Unknown error codes MUST be treated as failures".

    The runtime only sends the eight codes, so one real answer is given a
    code the binding cannot know (`napllmTest.recodeNextError`) on its way
    to the frame; the binding rejects with it, for a select and a generate.
    """
    app = shell.open_napplet()
    recode = "() => window.napllmTest.recodeNextError('a-code-from-a-later-revision')"
    shell.page.evaluate(recode)
    selecting = app.call("select", {"model": "no-such-model"})
    outcome = app.outcome(selecting)
    assert outcome["state"] == "error" and outcome["code"] == "a-code-from-a-later-revision"
    handle = app.select(FULL, rid="s-ok")
    shell.page.evaluate(recode)
    generating = app.call_generate({"handle": handle, "messages": [user("Hello!")]})
    shell.deny()
    outcome = app.outcome(generating)
    assert outcome["state"] == "error" and outcome["code"] == "a-code-from-a-later-revision"
    assert outcome["deltas"] == []
