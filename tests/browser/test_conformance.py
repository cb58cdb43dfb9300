"""NAP-LLM conformance cases LLM-C01..LLM-C23 in Chromium against the real shell.

The scenarios are written once in tests/conformance_scenarios.py and run
here by the page driver (tests/browser/page_driver.py): the shell page
(web/ with napllm in Pyodide, ``?test=1``) runs the fixture connections
``fx-*``; napplet frames run ``napplets/probe.html``, which posts envelopes
from inside the sandboxed frame the NIP-5D web projection's way
(``window.parent.postMessage``) and records what the shell delivers; the
chooser and consent dialogs are answered with real clicks (and Esc);
provider submissions are counted with ``napllmTest.stats``. Every test has
the name and parametrization of its tests/unit/test_conformance_core.py
counterpart (tests/unit/test_conformance_tables.py checks both), so every
case runs under CPython and in Pyodide.

The tests written out here need what only the page has (the scenarios
module's docstring lists them and why): the `window.napplet.llm` binding
and the tab's LLM switch, the frame's namespace, the profile switcher, the
page's console as the developer log, the consent dialog's text, the
product's scripted connection, and real-time races.

One page is booted per module and reused: every test opens its own napplet
tabs (fresh endpoints) and closes them, and the shared state (deadline,
profile, standing permissions) is reset after each test. A case table runs
as one batch through one tab the first time one of its cases is collected
(`page_driver.batch`); each parametrized test then asserts its own case.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from page_driver import batch, drive, drive_case
from shellpage import (
    POLL_MS,
    Napplet,
    ShellPage,
    check_generation,
    code,
    deltas_of,
    generate,
    user,
)

import conformance_cases as cases
import conformance_scenarios as sc
from conformance_cases import (
    CALL,
    CALL_2,
    CREATED,
    CREDENTIAL,
    IMAGE_RESULT,
    OTHER_PROMPT,
    SECRET_KEY,
    assistant,
    result_msg,
)
from fixtures import WEATHER_TOOL
from napllm.errors import ErrorCode
from napllm.providers.fixture import (
    Stall,
    completed,
    text_events,
    text_script,
)

pytestmark = pytest.mark.browser

FULL = sc.FULL.name
TEXT = sc.TEXT.name
JSON_ONLY = sc.JSON_ONLY.name
PAID = sc.PAID.name


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


def ready(shell: ShellPage, connection: str = FULL) -> tuple[Napplet, str]:
    """A fresh napplet tab with a live handle for `connection` (chosen by click)."""
    app = shell.open_napplet()
    return app, app.select(connection)


# --------------------------------------------------------------------------
# LLM-C01: select, describe, generate; also omit the optional domain


def test_llm_c01_select_describe_generate_correlate(shell: ShellPage) -> None:
    drive(shell, sc.llm_c01_select_describe_generate_correlate)


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


def test_llm_c01_absent_domain_gets_unsupported_and_no_dialogs(shell: ShellPage) -> None:
    plain = shell.open_napplet()
    plain.set_llm(False)
    # absence is discoverable without a handshake: no `llm` in the namespace
    assert plain.evaluate("() => Object.keys(window.napplet)") == []
    assert plain.evaluate("() => 'llm' in window.napplet") is False
    before = shell.submissions("fx-full")
    plain.post({"type": "llm.select", "id": "s1"})
    plain.post(generate("g1", "h-guess"))
    plain.post({"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    # each request is answered as an unavailable domain, nothing more
    for rid, kind in (("s1", "llm.select"), ("g1", "llm.generate"), ("c1", "llm.cancel")):
        assert code(plain.wait_for(rid, kind + ".result")) == "unsupported"
    assert len(plain.quiet()) == 3
    assert shell.open_dialogs() == 0 and shell.submissions("fx-full") == before
    # the napplet's own (non-llm) functionality is unaffected
    assert plain.evaluate("() => document.querySelector('h1').textContent") == "Probe napplet"


def test_llm_c01_domain_absence_does_not_affect_other_endpoints(shell: ShellPage) -> None:
    drive(shell, sc.llm_c01_domain_absence_does_not_affect_other_endpoints)


# --------------------------------------------------------------------------
# LLM-C02: malformed record, base64, enum or explicit null -> invalid-request


@pytest.mark.parametrize("case", sorted(cases.MALFORMED_REQUESTS))
def test_llm_c02_malformed_request_is_invalid_without_generation(
    shell: ShellPage, case: str
) -> None:
    drive_case(shell, sc.llm_c02_malformed_request_is_invalid_without_generation, case)


@pytest.mark.parametrize("case", sorted(cases.MALFORMED_ENVELOPES))
def test_llm_c02_malformed_envelope_is_invalid(shell: ShellPage, case: str) -> None:
    drive_case(shell, sc.llm_c02_malformed_envelope_is_invalid, case)


# --------------------------------------------------------------------------
# LLM-C03: unsupported images/JSON/tools/exact model or provider-specific input


@pytest.mark.parametrize("case", sorted(cases.UNMET_REQUIREMENTS))
def test_llm_c03_select_unmet_requirement_is_unsupported(shell: ShellPage, case: str) -> None:
    drive_case(shell, sc.llm_c03_select_unmet_requirement_is_unsupported, case)


def test_llm_c03_select_offers_only_exact_model_no_substitution(shell: ShellPage) -> None:
    drive(shell, sc.llm_c03_select_offers_only_exact_model_no_substitution)


@pytest.mark.parametrize("case", sorted(cases.UNSUPPORTED_INPUTS))
def test_llm_c03_generate_unsupported_input_before_submission(shell: ShellPage, case: str) -> None:
    drive_case(shell, sc.llm_c03_generate_unsupported_input_before_submission, case)


def test_llm_c03_temperature_out_of_range_is_unsupported(shell: ShellPage) -> None:
    drive(shell, sc.llm_c03_temperature_out_of_range_is_unsupported)


# --------------------------------------------------------------------------
# LLM-C04: decline consent after selecting a valid model


def test_llm_c04_declined_consent_is_user_cancelled_without_generation(shell: ShellPage) -> None:
    drive(shell, sc.llm_c04_declined_consent_is_user_cancelled_without_generation)


def test_llm_c04_declined_selection_is_user_cancelled(shell: ShellPage) -> None:
    drive(shell, sc.llm_c04_declined_selection_is_user_cancelled)


# --------------------------------------------------------------------------
# LLM-C05: two endpoints reuse ids and attempt each other's handles/cancel


def test_llm_c05_foreign_handles_rejected_and_ids_scoped(shell: ShellPage) -> None:
    drive(shell, sc.llm_c05_foreign_handles_rejected_and_ids_scoped)


def test_llm_c05_foreign_cancel_is_false_and_original_continues(shell: ShellPage) -> None:
    drive(shell, sc.llm_c05_foreign_cancel_is_false_and_original_continues)


def test_llm_c05_same_id_on_two_endpoints_cancels_only_own(shell: ShellPage) -> None:
    drive(shell, sc.llm_c05_same_id_on_two_endpoints_cancels_only_own)


# --------------------------------------------------------------------------
# LLM-C06: duplicate an active generation id


def test_llm_c06_duplicate_active_id_during_provider_run(shell: ShellPage) -> None:
    drive(shell, sc.llm_c06_duplicate_active_id_during_provider_run)


def test_llm_c06_duplicate_active_id_during_consent(shell: ShellPage) -> None:
    drive(shell, sc.llm_c06_duplicate_active_id_during_consent)


def test_llm_c06_finished_id_may_be_reused(shell: ShellPage) -> None:
    drive(shell, sc.llm_c06_finished_id_may_be_reused)


# --------------------------------------------------------------------------
# LLM-C07: cancel or time out during revalidation, consent or a stalled provider


def test_llm_c07_cancel_during_consent_prevents_submission(shell: ShellPage) -> None:
    drive(shell, sc.llm_c07_cancel_during_consent_prevents_submission)


def test_llm_c07_timeout_during_consent_prevents_submission(shell: ShellPage) -> None:
    drive(shell, sc.llm_c07_timeout_during_consent_prevents_submission)


def test_llm_c07_cancel_stalled_provider_settles_and_suppresses_late_output(
    shell: ShellPage,
) -> None:
    drive(shell, sc.llm_c07_cancel_stalled_provider_settles_and_suppresses_late_output)


def test_llm_c07_timeout_stalled_provider(shell: ShellPage) -> None:
    drive(shell, sc.llm_c07_timeout_stalled_provider)


def test_llm_c07_timeout_with_slow_but_finite_provider_discards_late_output(
    shell: ShellPage,
) -> None:
    drive(shell, sc.llm_c07_timeout_with_slow_but_finite_provider_discards_late_output)


def test_llm_c07_revalidation_after_consent_refuses_edited_connection(shell: ShellPage) -> None:
    drive(shell, sc.llm_c07_revalidation_after_consent_refuses_edited_connection)


# --------------------------------------------------------------------------
# LLM-C08: switch account, revoke endpoint or change connection during consent


def test_llm_c08_account_switch_during_consent(shell: ShellPage) -> None:
    drive(shell, sc.llm_c08_account_switch_during_consent)


def test_llm_c08_account_switch_during_generation_and_select(shell: ShellPage) -> None:
    drive(shell, sc.llm_c08_account_switch_during_generation_and_select)


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
    drive(shell, sc.llm_c08_connection_changed_during_consent, change)


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
    drive(shell, sc.llm_c08_connection_removed_during_generation_cancels)


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
    drive(shell, sc.llm_c09_buffered_provider_output)


def test_llm_c09_completion_wins_then_cancel_is_false(shell: ShellPage) -> None:
    drive(shell, sc.llm_c09_completion_wins_then_cancel_is_false)


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
            sc.safe(result, ErrorCode.CANCELLED)
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
    drive(shell, sc.llm_c10_length_is_partial)


def test_llm_c10_refusal_is_partial(shell: ShellPage) -> None:
    drive(shell, sc.llm_c10_refusal_is_partial)


def test_llm_c10_length_with_json_format_is_not_validated_as_complete(shell: ShellPage) -> None:
    drive(shell, sc.llm_c10_length_with_json_format_is_not_validated_as_complete)


@pytest.mark.parametrize("case", sorted(cases.MISSING_COMPLETION))
def test_llm_c10_missing_completion_marker_is_provider_error(shell: ShellPage, case: str) -> None:
    drive_case(shell, sc.llm_c10_missing_completion_marker_is_provider_error, case)


@pytest.mark.parametrize("case", sorted(cases.JSON_NOT_OBJECT))
def test_llm_c10_json_format_needs_an_object(shell: ShellPage, case: str) -> None:
    drive_case(shell, sc.llm_c10_json_format_needs_an_object, case)


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
    outcome: dict[str, Any] = drive(
        shell,
        sc.played,
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
    sc.safe(result, cases.PROVIDER_FAILURE_CODE)
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
    drive_case(shell, sc.llm_c12_missing_result_of_parallel_calls_is_invalid, case)


def test_llm_c12_all_results_in_any_order_are_accepted(shell: ShellPage) -> None:
    drive(shell, sc.llm_c12_all_results_in_any_order_are_accepted)


# --------------------------------------------------------------------------
# LLM-C13: toolChoice forcing a named tool; provider ignores it


@pytest.mark.parametrize("case", sorted(cases.IGNORED_FORCED))
def test_llm_c13_ignored_forced_tool_is_provider_error(shell: ShellPage, case: str) -> None:
    drive_case(shell, sc.llm_c13_ignored_forced_tool_is_provider_error, case)


def test_llm_c13_forced_tool_obeyed(shell: ShellPage) -> None:
    drive(shell, sc.llm_c13_forced_tool_obeyed)


@pytest.mark.parametrize("choice", sorted(cases.VIOLATED_MODES))
def test_llm_c13_violated_mode_is_provider_error(shell: ShellPage, choice: str) -> None:
    drive_case(shell, sc.llm_c13_violated_mode_is_provider_error, choice)


# --------------------------------------------------------------------------
# LLM-C14: provider returns no tool call id


@pytest.mark.parametrize("delivery", sorted(cases.ARGUMENT_DELIVERY))
def test_llm_c14_synthesized_call_id_is_stable_and_round_trips(
    shell: ShellPage, delivery: str
) -> None:
    drive(shell, sc.llm_c14_synthesized_call_id_is_stable_and_round_trips, delivery)


def test_llm_c14_empty_provider_id_is_synthesized(shell: ShellPage) -> None:
    drive(shell, sc.llm_c14_empty_provider_id_is_synthesized)


def test_llm_c14_parallel_calls_without_ids_get_distinct_ids(shell: ShellPage) -> None:
    drive(shell, sc.llm_c14_parallel_calls_without_ids_get_distinct_ids)


# --------------------------------------------------------------------------
# LLM-C15: completed calls with different stop labels; truncated parallel turn


@pytest.mark.parametrize("case", sorted(cases.STOP_LABELS))
def test_llm_c15_completed_calls_normalize_to_tool_use(shell: ShellPage, case: str) -> None:
    drive_case(shell, sc.llm_c15_completed_calls_normalize_to_tool_use, case)


def test_llm_c15_text_and_call_turn_is_tool_use(shell: ShellPage) -> None:
    drive(shell, sc.llm_c15_text_and_call_turn_is_tool_use)


@pytest.mark.parametrize("reason", sorted(cases.TRUNCATED_TURNS))
def test_llm_c15_truncated_parallel_turn_keeps_finish_without_calls(
    shell: ShellPage, reason: str
) -> None:
    drive_case(shell, sc.llm_c15_truncated_parallel_turn_keeps_finish_without_calls, reason)


# --------------------------------------------------------------------------
# LLM-C16: completed arguments malformed or not an object; unknown tool name


@pytest.mark.parametrize("case", sorted(cases.INVALID_CALLS))
def test_llm_c16_invalid_completed_call_is_provider_error(shell: ShellPage, case: str) -> None:
    drive_case(shell, sc.llm_c16_invalid_completed_call_is_provider_error, case)


# --------------------------------------------------------------------------
# LLM-C17: replay thinking; connection requires opaque reasoning state


def test_llm_c17_thinking_omitted_from_provider_input(shell: ShellPage) -> None:
    drive(shell, sc.llm_c17_thinking_omitted_from_provider_input)


def test_llm_c17_required_reasoning_state_is_unsupported(shell: ShellPage) -> None:
    drive(shell, sc.llm_c17_required_reasoning_state_is_unsupported)


def test_llm_c17_thinking_in_user_message_is_invalid(shell: ShellPage) -> None:
    drive(shell, sc.llm_c17_thinking_in_user_message_is_invalid)


# --------------------------------------------------------------------------
# LLM-C18: stream interleaved tool-call blocks


def test_llm_c18_interleaved_tool_call_blocks(shell: ShellPage) -> None:
    drive(shell, sc.llm_c18_interleaved_tool_call_blocks)


def test_llm_c18_provisional_block_then_failure_is_not_executable(shell: ShellPage) -> None:
    drive(shell, sc.llm_c18_provisional_block_then_failure_is_not_executable)


# --------------------------------------------------------------------------
# LLM-C19: request an unlisted tool-choice mode


@pytest.mark.parametrize("case", sorted(cases.UNLISTED_MODES))
def test_llm_c19_unlisted_mode_is_unsupported(shell: ShellPage, case: str) -> None:
    drive_case(shell, sc.llm_c19_unlisted_mode_is_unsupported, case)


def test_llm_c19_listed_modes_pass_through_unchanged(shell: ShellPage) -> None:
    drive(shell, sc.llm_c19_listed_modes_pass_through_unchanged)


# --------------------------------------------------------------------------
# LLM-C20: duplicate/invalid tool names, missing tools, unknown forced name,
# non-object schema, zero maxTokens


@pytest.mark.parametrize("case", sorted(cases.INVALID_TOOLS))
def test_llm_c20_invalid_tools_and_limits(shell: ShellPage, case: str) -> None:
    drive_case(shell, sc.llm_c20_invalid_tools_and_limits, case)


def test_llm_c20_schema_keywords_are_not_unknown_fields(shell: ShellPage) -> None:
    drive(shell, sc.llm_c20_schema_keywords_are_not_unknown_fields)


# --------------------------------------------------------------------------
# LLM-C21: misplaced/duplicate/orphaned results; history without current tools


@pytest.mark.parametrize("case", sorted(cases.INVALID_HISTORIES))
def test_llm_c21_invalid_histories_rejected(shell: ShellPage, case: str) -> None:
    drive_case(shell, sc.llm_c21_invalid_histories_rejected, case)


def test_llm_c21_history_without_current_tools_accepted(shell: ShellPage) -> None:
    drive(shell, sc.llm_c21_history_without_current_tools_accepted)


def test_llm_c21_no_new_calls_without_current_tools(shell: ShellPage) -> None:
    drive(shell, sc.llm_c21_no_new_calls_without_current_tools)


def test_llm_c21_history_on_connection_without_tools_is_unsupported(shell: ShellPage) -> None:
    drive(shell, sc.llm_c21_history_on_connection_without_tools_is_unsupported)


# --------------------------------------------------------------------------
# LLM-C22: image tool result; error result with no provider-native flag


def test_llm_c22_image_in_tool_result_unsupported_before_submission(shell: ShellPage) -> None:
    drive(shell, sc.llm_c22_image_in_tool_result_unsupported_before_submission)


def test_llm_c22_image_in_tool_result_accepted_where_supported(shell: ShellPage) -> None:
    drive(shell, sc.llm_c22_image_in_tool_result_accepted_where_supported)


def test_llm_c22_error_flag_maps_to_prefix(shell: ShellPage) -> None:
    drive(shell, sc.llm_c22_error_flag_maps_to_prefix)


def test_llm_c22_error_flag_false_has_no_prefix(shell: ShellPage) -> None:
    drive(shell, sc.llm_c22_error_flag_false_has_no_prefix)


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
    sc.safe(app.wait_for("g1"), ErrorCode.USER_CANCELLED)
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
    sc.safe(app.wait_for("g1"), ErrorCode.USER_CANCELLED)
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
