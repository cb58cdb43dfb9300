"""NAP-LLM conformance cases LLM-C01..LLM-C23 against the core shell.

The scenarios are written once in tests/conformance_scenarios.py and run
here by the CPython driver (tests/unit/harness_driver.py), which performs
each step on `napllm.shell.Shell` through `harness.Harness`: a recording
transport per endpoint, a chooser and a consent dialog held open until the
scenario answers them, and the controllable `FixtureProvider`. Each test
asserts the *required observation* of its row of the NAP-LLM Conformance
Cases table: correlation, exact error codes, provider submission counts,
delta lifecycle and ordering, one terminal result per request id and no
cross-endpoint delivery. The browser suite runs the same scenarios under
the same test names, inside Pyodide behind the real page.

The tests written out here observe what only the core harness can (the
scenarios module's docstring lists them and why): the observer's drop
records, the developer log, the `Disclosure` given to the consent port,
what a closed endpoint would still receive, exact delta counts and every
event-loop interleaving of a cancel/completion race.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from harness import Chooser, Harness, generate
from harness_driver import drive, drive_case
from napcheck import (
    assert_not_leaked,
    assert_safe_error,
    check_generation,
    code,
    error_code,
    ready,
    run,
    terminal,
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
    user,
)
from fixtures import WEATHER_TOOL
from napllm.errors import SAFE_MESSAGES, ErrorCode
from napllm.providers.fixture import (
    Stall,
    completed,
    text_events,
    text_script,
)
from napllm.shell import ChoicePick, ChoiceRequest


@pytest.fixture(autouse=True)
def no_unexpected_runtime_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fail a test whose run logged an error of the runtime it did not check and clear.

    A crash inside the shell answers `provider-error` like a provider's
    rejection does, so the napplet cannot tell them apart; the log can. A
    test expecting a crash asserts the record, then calls `caplog.clear()`.
    """
    yield
    errors = [
        r.getMessage()
        for r in caplog.get_records("call")
        if r.name.startswith("napllm") and r.levelno >= logging.ERROR
    ]
    assert errors == [], f"the runtime logged unexpected errors: {errors}"


async def until(predicate: Any, limit: int = 200) -> None:
    """Yield to the loop until `predicate()` holds (bounded)."""
    for _ in range(limit):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


# --------------------------------------------------------------------------
# LLM-C01: select, describe, generate; also omit the optional domain


async def test_llm_c01_select_describe_generate_correlate() -> None:
    await drive(sc.llm_c01_select_describe_generate_correlate)


async def test_llm_c01_absent_domain_gets_unsupported_and_no_dialogs() -> None:
    h = Harness()
    fx = h.connect()
    ep = h.endpoint(domains=frozenset())
    h.send(ep, {"type": "llm.select", "id": "s1"})
    h.send(ep, generate("g1", "h-guess"))
    h.send(ep, {"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    await h.settle()
    assert [(e["id"], e["error"]["code"]) for e in h.out(ep)] == [
        ("s1", "unsupported"),
        ("g1", "unsupported"),
        ("c1", "unsupported"),
    ]
    assert h.chooser.requests == [] and h.consent.asked == []
    assert fx.submissions == 0


async def test_llm_c01_domain_absence_does_not_affect_other_endpoints() -> None:
    await drive(sc.llm_c01_domain_absence_does_not_affect_other_endpoints)


# --------------------------------------------------------------------------
# LLM-C02: malformed record, base64, enum or explicit null -> invalid-request


@pytest.mark.parametrize("case", sorted(cases.MALFORMED_REQUESTS))
async def test_llm_c02_malformed_request_is_invalid_without_generation(case: str) -> None:
    await drive_case(sc.llm_c02_malformed_request_is_invalid_without_generation, case)


@pytest.mark.parametrize("case", sorted(cases.MALFORMED_ENVELOPES))
async def test_llm_c02_malformed_envelope_is_invalid(case: str) -> None:
    await drive_case(sc.llm_c02_malformed_envelope_is_invalid, case)


# --------------------------------------------------------------------------
# LLM-C03: unsupported images/JSON/tools/exact model or provider input


@pytest.mark.parametrize("case", sorted(cases.UNMET_REQUIREMENTS))
async def test_llm_c03_select_unmet_requirement_is_unsupported(case: str) -> None:
    await drive_case(sc.llm_c03_select_unmet_requirement_is_unsupported, case)


async def test_llm_c03_select_offers_only_exact_model_no_substitution() -> None:
    await drive(sc.llm_c03_select_offers_only_exact_model_no_substitution)


@pytest.mark.parametrize("case", sorted(cases.UNSUPPORTED_INPUTS))
async def test_llm_c03_generate_unsupported_input_before_submission(case: str) -> None:
    await drive_case(sc.llm_c03_generate_unsupported_input_before_submission, case)


async def test_llm_c03_temperature_out_of_range_is_unsupported() -> None:
    await drive(sc.llm_c03_temperature_out_of_range_is_unsupported)


# --------------------------------------------------------------------------
# LLM-C04: decline consent after selecting a valid model


async def test_llm_c04_declined_consent_is_user_cancelled_without_generation() -> None:
    await drive(sc.llm_c04_declined_consent_is_user_cancelled_without_generation)


async def test_llm_c04_declined_selection_is_user_cancelled() -> None:
    await drive(sc.llm_c04_declined_selection_is_user_cancelled)


# --------------------------------------------------------------------------
# LLM-C05: two endpoints reuse ids and attempt each other's handles/cancel


async def test_llm_c05_foreign_handles_rejected_and_ids_scoped() -> None:
    await drive(sc.llm_c05_foreign_handles_rejected_and_ids_scoped)


async def test_llm_c05_foreign_cancel_is_false_and_original_continues() -> None:
    await drive(sc.llm_c05_foreign_cancel_is_false_and_original_continues)


async def test_llm_c05_same_id_on_two_endpoints_cancels_only_own() -> None:
    await drive(sc.llm_c05_same_id_on_two_endpoints_cancels_only_own)


# --------------------------------------------------------------------------
# LLM-C06: duplicate an active generation id


async def test_llm_c06_duplicate_active_id_during_provider_run() -> None:
    await drive(sc.llm_c06_duplicate_active_id_during_provider_run)


async def test_llm_c06_duplicate_active_id_during_consent() -> None:
    await drive(sc.llm_c06_duplicate_active_id_during_consent)


async def test_llm_c06_finished_id_may_be_reused() -> None:
    await drive(sc.llm_c06_finished_id_may_be_reused)


# --------------------------------------------------------------------------
# LLM-C07: cancel or time out during revalidation, consent or a stalled provider


async def test_llm_c07_cancel_during_consent_prevents_submission() -> None:
    await drive(sc.llm_c07_cancel_during_consent_prevents_submission)


async def test_llm_c07_timeout_during_consent_prevents_submission() -> None:
    await drive(sc.llm_c07_timeout_during_consent_prevents_submission)


async def test_llm_c07_cancel_stalled_provider_settles_and_suppresses_late_output() -> None:
    await drive(sc.llm_c07_cancel_stalled_provider_settles_and_suppresses_late_output)


async def test_llm_c07_timeout_stalled_provider() -> None:
    await drive(sc.llm_c07_timeout_stalled_provider)


async def test_llm_c07_timeout_with_slow_but_finite_provider_discards_late_output() -> None:
    await drive(sc.llm_c07_timeout_with_slow_but_finite_provider_discards_late_output)


async def test_llm_c07_revalidation_after_consent_refuses_edited_connection() -> None:
    await drive(sc.llm_c07_revalidation_after_consent_refuses_edited_connection)


# --------------------------------------------------------------------------
# LLM-C08: switch account, revoke endpoint or change connection during consent


async def test_llm_c08_account_switch_during_consent() -> None:
    await drive(sc.llm_c08_account_switch_during_consent)


async def test_llm_c08_account_switch_during_generation_and_select() -> None:
    await drive(sc.llm_c08_account_switch_during_generation_and_select)


async def test_llm_c08_endpoint_closed_during_consent() -> None:
    h, fx, ep, handle = await ready()
    other = h.endpoint("other")
    h.consent.hold = True
    h.send(ep, generate("g1", handle))
    await until(lambda: len(h.consent.asked) == 1)
    before = list(h.out(ep))
    h.shell.close_endpoint(ep)
    h.consent.release()
    await h.settle()
    assert h.out(ep) == before  # nothing after destruction
    assert h.consent.cancelled == 1 and fx.submissions == 0
    h.send(other, {"type": "llm.describe", "id": "d1", "handle": handle})
    await h.settle()
    assert error_code(h, other, "d1", "llm.describe.result") == "selection-expired"


@pytest.mark.parametrize("change", cases.CONNECTION_CHANGES)
async def test_llm_c08_connection_changed_during_consent(change: str) -> None:
    await drive(sc.llm_c08_connection_changed_during_consent, change)


async def test_llm_c08_a_pick_on_a_chooser_list_that_changed_is_not_bound() -> None:
    """The connection changes after the chooser showed it and before the pick arrives."""

    class LateChooser(Chooser):
        # the page's click was made on the list it drew first (revision 0)
        async def choose(self, request: ChoiceRequest) -> ChoicePick | None:
            self.requests.append(request)
            if self.hold:
                await self._gate.wait()
            return ChoicePick("fx", 0 if len(self.requests) == 1 else request.revision)

    chooser = LateChooser()
    h = Harness(chooser=chooser)
    fx = h.connect()
    ep = h.endpoint()
    chooser.hold = True
    h.send(ep, {"type": "llm.select", "id": "s1"})
    await until(lambda: len(chooser.requests) == 1)
    h.registry.edit("fx", name="Fixture (replacement)")
    chooser.release()
    await h.settle()
    assert [r.revision for r in chooser.requests] == [0, 1]
    model = terminal(h, ep, "s1", "llm.select.result")["model"]
    assert model["name"] == "Fixture (replacement)"
    assert fx.submissions == 0


async def test_llm_c08_connection_removed_during_generation_cancels() -> None:
    await drive(sc.llm_c08_connection_removed_during_generation_cancels)


# --------------------------------------------------------------------------
# LLM-C09: buffered and streamed responses; cancellation/completion race


async def test_llm_c09_streamed_deltas_are_ordered_and_match_result() -> None:
    h, fx, ep, handle = await ready()
    fx.queue(text_script(["Hel", "lo, ", "wor", "ld"]))
    result = await run(h, ep, generate("g1", handle))
    deltas = h.deltas(ep, "g1")
    assert [d["event"] for d in deltas] == ["start", "delta", "delta", "delta", "delta", "end"]
    assert result["result"]["content"] == [{"type": "text", "text": "Hello, world"}]
    assert h.out(ep)[-1] is result


async def test_llm_c09_buffered_provider_output() -> None:
    await drive(sc.llm_c09_buffered_provider_output)


async def test_llm_c09_completion_wins_then_cancel_is_false() -> None:
    await drive(sc.llm_c09_completion_wins_then_cancel_is_false)


@pytest.mark.parametrize("ticks", range(0, 24))
async def test_llm_c09_cancel_completion_race(ticks: int) -> None:
    h, fx, ep, handle = await ready()
    fx.queue(text_script(["a", "b", "c"]))
    h.send(ep, generate("g1", handle))
    for _ in range(ticks):
        await asyncio.sleep(0)
    h.send(ep, {"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    await h.settle()
    cancelled = terminal(h, ep, "c1", "llm.cancel.result")["cancelled"]
    result = check_generation(h, ep, "g1")
    if cancelled:
        assert_safe_error(result, ErrorCode.CANCELLED)
    else:
        assert result["result"]["content"] == [{"type": "text", "text": "abc"}]
    assert h.out(ep).index(result) > max(
        (h.out(ep).index(d) for d in h.deltas(ep, "g1")), default=-1
    )


# --------------------------------------------------------------------------
# LLM-C10: limit/refusal, missing finish marker, invalid JSON-object output


async def test_llm_c10_length_is_partial() -> None:
    await drive(sc.llm_c10_length_is_partial)


async def test_llm_c10_refusal_is_partial() -> None:
    await drive(sc.llm_c10_refusal_is_partial)


async def test_llm_c10_length_with_json_format_is_not_validated_as_complete() -> None:
    await drive(sc.llm_c10_length_with_json_format_is_not_validated_as_complete)


@pytest.mark.parametrize("case", sorted(cases.MISSING_COMPLETION))
async def test_llm_c10_missing_completion_marker_is_provider_error(case: str) -> None:
    await drive_case(sc.llm_c10_missing_completion_marker_is_provider_error, case)


@pytest.mark.parametrize("case", sorted(cases.JSON_NOT_OBJECT))
async def test_llm_c10_json_format_needs_an_object(case: str) -> None:
    await drive_case(sc.llm_c10_json_format_needs_an_object, case)


# --------------------------------------------------------------------------
# LLM-C11: provider failure containing input or credentials


@pytest.mark.parametrize("case", sorted(cases.PROVIDER_FAILURES))
async def test_llm_c11_provider_failure_leaks_nothing(
    case: str, caplog: pytest.LogCaptureFixture
) -> None:
    failure, logged = cases.PROVIDER_FAILURES[case]
    h = Harness()
    fx = h.connect(credential=CREDENTIAL, settings={"baseUrl": "http://127.0.0.1:9/" + SECRET_KEY})
    victim = h.endpoint("victim")
    attacker = h.endpoint("attacker")
    victim_handle = await h.select(victim)
    attacker_handle = await h.select(attacker)
    fx.queue([CREATED, Stall(0.01), *text_events("fine"), completed()])
    h.send(victim, generate("g1", victim_handle, [user(OTHER_PROMPT)]))
    fx.queue([CREATED, *text_events("half"), failure])
    h.send(attacker, generate("g1", attacker_handle, [user("hello")]))
    await h.settle()
    assert_safe_error(check_generation(h, attacker, "g1"), cases.PROVIDER_FAILURE_CODE)
    assert code(check_generation(h, victim, "g1")) is None
    # the failure's own kind is kept for the developer log: a rejection is not a crash
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("napllm")]
    kinds = [m.split(":")[0] for m in messages if m.startswith("provider")]
    assert kinds == [logged], messages
    caplog.clear()  # checked: the crash case's error record is expected
    assert_not_leaked(h, SECRET_KEY, CREDENTIAL)
    assert OTHER_PROMPT not in json.dumps(h.out(attacker))


# --------------------------------------------------------------------------
# LLM-C12: multiple toolCall parts; the next request omits one result


@pytest.mark.parametrize("case", sorted(cases.MISSING_PARALLEL_RESULTS))
async def test_llm_c12_missing_result_of_parallel_calls_is_invalid(case: str) -> None:
    await drive_case(sc.llm_c12_missing_result_of_parallel_calls_is_invalid, case)


async def test_llm_c12_all_results_in_any_order_are_accepted() -> None:
    await drive(sc.llm_c12_all_results_in_any_order_are_accepted)


# --------------------------------------------------------------------------
# LLM-C13: toolChoice forcing a named tool; the provider ignores it


@pytest.mark.parametrize("case", sorted(cases.IGNORED_FORCED))
async def test_llm_c13_ignored_forced_tool_is_provider_error(case: str) -> None:
    await drive_case(sc.llm_c13_ignored_forced_tool_is_provider_error, case)


async def test_llm_c13_forced_tool_obeyed() -> None:
    await drive(sc.llm_c13_forced_tool_obeyed)


@pytest.mark.parametrize("choice", sorted(cases.VIOLATED_MODES))
async def test_llm_c13_violated_mode_is_provider_error(choice: str) -> None:
    await drive_case(sc.llm_c13_violated_mode_is_provider_error, choice)


# --------------------------------------------------------------------------
# LLM-C14: the provider returns no tool call id


@pytest.mark.parametrize("delivery", sorted(cases.ARGUMENT_DELIVERY))
async def test_llm_c14_synthesized_call_id_is_stable_and_round_trips(delivery: str) -> None:
    await drive(sc.llm_c14_synthesized_call_id_is_stable_and_round_trips, delivery)


async def test_llm_c14_empty_provider_id_is_synthesized() -> None:
    await drive(sc.llm_c14_empty_provider_id_is_synthesized)


async def test_llm_c14_parallel_calls_without_ids_get_distinct_ids() -> None:
    await drive(sc.llm_c14_parallel_calls_without_ids_get_distinct_ids)


# --------------------------------------------------------------------------
# LLM-C15: completed calls under different stop labels; truncated parallel turn


@pytest.mark.parametrize("case", sorted(cases.STOP_LABELS))
async def test_llm_c15_completed_calls_normalize_to_tool_use(case: str) -> None:
    await drive_case(sc.llm_c15_completed_calls_normalize_to_tool_use, case)


async def test_llm_c15_text_and_call_turn_is_tool_use() -> None:
    await drive(sc.llm_c15_text_and_call_turn_is_tool_use)


@pytest.mark.parametrize("reason", sorted(cases.TRUNCATED_TURNS))
async def test_llm_c15_truncated_parallel_turn_keeps_finish_without_calls(reason: str) -> None:
    await drive_case(sc.llm_c15_truncated_parallel_turn_keeps_finish_without_calls, reason)


# --------------------------------------------------------------------------
# LLM-C16: malformed / non-object arguments; unknown tool name


@pytest.mark.parametrize("case", sorted(cases.INVALID_CALLS))
async def test_llm_c16_invalid_completed_call_is_provider_error(case: str) -> None:
    await drive_case(sc.llm_c16_invalid_completed_call_is_provider_error, case)


# --------------------------------------------------------------------------
# LLM-C17: replayed thinking; connection requires opaque reasoning state


async def test_llm_c17_thinking_omitted_from_provider_input() -> None:
    await drive(sc.llm_c17_thinking_omitted_from_provider_input)


async def test_llm_c17_required_reasoning_state_is_unsupported() -> None:
    await drive(sc.llm_c17_required_reasoning_state_is_unsupported)


async def test_llm_c17_thinking_in_user_message_is_invalid() -> None:
    await drive(sc.llm_c17_thinking_in_user_message_is_invalid)


# --------------------------------------------------------------------------
# LLM-C18: stream interleaved tool-call blocks


async def test_llm_c18_interleaved_tool_call_blocks() -> None:
    await drive(sc.llm_c18_interleaved_tool_call_blocks)


async def test_llm_c18_provisional_block_then_failure_is_not_executable() -> None:
    await drive(sc.llm_c18_provisional_block_then_failure_is_not_executable)


# --------------------------------------------------------------------------
# LLM-C19: an unlisted tool-choice mode


@pytest.mark.parametrize("case", sorted(cases.UNLISTED_MODES))
async def test_llm_c19_unlisted_mode_is_unsupported(case: str) -> None:
    await drive_case(sc.llm_c19_unlisted_mode_is_unsupported, case)


async def test_llm_c19_listed_modes_pass_through_unchanged() -> None:
    await drive(sc.llm_c19_listed_modes_pass_through_unchanged)


# --------------------------------------------------------------------------
# LLM-C20: invalid tool definitions and choices


@pytest.mark.parametrize("case", sorted(cases.INVALID_TOOLS))
async def test_llm_c20_invalid_tools_and_limits(case: str) -> None:
    await drive_case(sc.llm_c20_invalid_tools_and_limits, case)


async def test_llm_c20_schema_keywords_are_not_unknown_fields() -> None:
    await drive(sc.llm_c20_schema_keywords_are_not_unknown_fields)


# --------------------------------------------------------------------------
# LLM-C21: misplaced/duplicate/orphaned results; history without current tools


@pytest.mark.parametrize("case", sorted(cases.INVALID_HISTORIES))
async def test_llm_c21_invalid_histories_rejected(case: str) -> None:
    await drive_case(sc.llm_c21_invalid_histories_rejected, case)


async def test_llm_c21_history_without_current_tools_accepted() -> None:
    await drive(sc.llm_c21_history_without_current_tools_accepted)


async def test_llm_c21_no_new_calls_without_current_tools() -> None:
    await drive(sc.llm_c21_no_new_calls_without_current_tools)


async def test_llm_c21_history_on_connection_without_tools_is_unsupported() -> None:
    await drive(sc.llm_c21_history_on_connection_without_tools_is_unsupported)


# --------------------------------------------------------------------------
# LLM-C22: image tool result; error result with no provider-native flag


async def test_llm_c22_image_in_tool_result_unsupported_before_submission() -> None:
    await drive(sc.llm_c22_image_in_tool_result_unsupported_before_submission)


async def test_llm_c22_image_in_tool_result_accepted_where_supported() -> None:
    await drive(sc.llm_c22_image_in_tool_result_accepted_where_supported)


async def test_llm_c22_error_flag_maps_to_prefix() -> None:
    await drive(sc.llm_c22_error_flag_maps_to_prefix)


async def test_llm_c22_error_flag_false_has_no_prefix() -> None:
    await drive(sc.llm_c22_error_flag_false_has_no_prefix)


# --------------------------------------------------------------------------
# LLM-C23: consent declined with sensitive tool definitions/results


async def test_llm_c23_disclosure_names_tools_and_results_then_decline() -> None:
    h, fx, ep, handle = await ready()
    h.consent.decision = h.consent.decision.__class__(allow=False)
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
    h.send(ep, generate("g1", handle, messages, tools=[WEATHER_TOOL, balance_tool]))
    await h.settle()
    assert error_code(h, ep, "g1") == "user-cancelled"
    assert fx.submissions == 0 and h.observer.submissions == []
    (disclosure,) = h.consent.asked
    assert disclosure.napplet.name == "napplet"
    assert disclosure.connection.id == "fx" and disclosure.connection.route
    assert disclosure.tool_definitions == [
        {
            "name": "get_weather",
            "description": WEATHER_TOOL["description"],
            "parameters": WEATHER_TOOL["parameters"],
        },
        {
            "name": "get_balance",
            "description": "Read the user's bank balance",
            "parameters": {"type": "object", "properties": {}},
        },
    ]
    results = [
        (r.tool_name, r.tool_call_id, r.characters, r.is_error) for r in disclosure.tool_results
    ]
    assert results == [
        ("get_weather", "call_1", len("18 C"), False),
        ("get_balance", "call_2", len(secret_result), True),
    ]
    shown = disclosure.to_json()
    assert [t["name"] for t in shown["disclosed"]["toolDefinitions"]] == [
        "get_weather",
        "get_balance",
    ]
    assert len(shown["disclosed"]["toolResults"]) == 2
    assert shown["model"] == "fixture-model" and "charges" in shown
    assert secret_result not in json.dumps(h.out(ep))


async def test_llm_c23_disclosure_of_default_tool_schema_and_images() -> None:
    h, fx, ep, handle = await ready()
    h.consent.decision = h.consent.decision.__class__(allow=False)
    h.send(ep, generate("g1", handle, IMAGE_RESULT, tools=[{"name": "get_weather"}]))
    await h.settle()
    (disclosure,) = h.consent.asked
    assert disclosure.tool_definitions[0]["parameters"] == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    assert disclosure.images == 1 and disclosure.tool_results[0].images == 1
    assert fx.submissions == 0


def test_safe_messages_cover_every_code() -> None:
    assert set(SAFE_MESSAGES) == set(ErrorCode)
