"""The Prompt API layer (web/prompt-api/) in the product shell, in Chromium.

A napplet that opts in with ``<meta name="napplet-prompt-api">``
(tests/browser/napplets/prompt-api.html) uses only ``LanguageModel``. Each
of its examples follows one example of the Prompt API explainer call for
call; here they run against the scripted connection (exact answers, and the
requests the runtime received, read from the envelope inspector) and against
TinyChat (real inference). Every request is answered in the consent dialog
by a click, and the number of dialogs is checked against the number of
requests the connection received, so each ``generate`` of the layer (each
prompt, each round of a tool loop) had its own consent. Hostile use ends in
the errors docs/napplets.md documents.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from shellpage import (
    POLL_MS,
    Napplet,
    ShellPage,
    boot_shell,
    linked_napplet_frame,
)

pytestmark = pytest.mark.browser

SCRIPTED = "Prompt script"
TINYCHAT = "TinyChat (on this device)"
STEP_TIMEOUT_MS = 60_000
#: The layer's bound on a session's messages (web/prompt-api/limits.js MAX_HISTORY_MESSAGES).
MAX_HISTORY_MESSAGES = 256


class Examples:
    """The example napplet open in the shell: start an example, answer dialogs, read its run."""

    def __init__(self, shell: ShellPage, napplet: Napplet) -> None:
        self.shell = shell
        self.napplet = napplet
        self.consents = 0

    def start(self, name: str, *args: Any) -> None:
        self.napplet.frame.evaluate("([n, a]) => window.start(n, ...a)", [name, list(args)])

    def armed(self, kind: str) -> Any:
        """The open `kind` dialog once it takes clicks (armed), by its own token: the
        next dialog may open as soon as this one is answered, so waits name it."""
        self.shell.page.locator(f"dialog.{kind}-dialog[open][data-armed=true]").wait_for()
        token = self.shell.page.locator(f"dialog.{kind}-dialog[open]").get_attribute("data-token")
        return self.shell.page.locator(f"dialog[data-token='{token}']")

    def choose(self, connection: str = SCRIPTED) -> None:
        dialog = self.armed("chooser")
        exact = re.compile("^" + re.escape(connection) + "$")
        name = self.shell.page.locator(".candidate-name", has_text=exact)
        dialog.locator(".candidate", has=name).click()
        dialog.wait_for(state="detached")

    def answer(self, button: str) -> None:
        dialog = self.armed("consent")
        dialog.locator(f"button.{button}").click()
        dialog.wait_for(state="detached")

    def allow(self, times: int = 1) -> None:
        for _ in range(times):
            self.answer("allow")
            self.consents += 1

    def deny(self) -> None:
        self.answer("deny")

    def cancel_chooser(self) -> None:
        dialog = self.armed("chooser")
        dialog.get_by_role("button", name="Cancel").click()
        dialog.wait_for(state="detached")

    def finish(self, name: str, timeout_ms: int = STEP_TIMEOUT_MS) -> dict[str, Any]:
        self.napplet.frame.wait_for_function(
            "(n) => window.runs[n] && window.runs[n].state !== 'pending'",
            arg=name,
            timeout=timeout_ms,
            polling=POLL_MS,
        )
        run: dict[str, Any] = self.napplet.frame.evaluate("(n) => window.runs[n]", name)
        assert self.shell.open_dialogs() == 0, "a dialog is still open after the example"
        return run

    def ok(self, name: str, timeout_ms: int = STEP_TIMEOUT_MS) -> list[str]:
        run = self.finish(name, timeout_ms)
        assert run["state"] == "ok", run
        logs: list[str] = run["logs"]
        return logs

    def error(self, name: str) -> dict[str, Any]:
        run = self.finish(name)
        assert run["state"] == "error", run
        error: dict[str, Any] = run["error"]
        return error

    def eval(self, expression: str) -> Any:
        return self.napplet.frame.evaluate(expression)


def open_examples(page: Any, product_url: str, test_pages_dir: Path, script: Any) -> Examples:
    """Boot the product shell with scripted connection `script` and open the example napplet."""
    scripts = {SCRIPTED: script} if script is not None else {}
    shell = boot_shell(page, product_url, test_pages_dir, "", scripts)
    napplet = shell.open_napplet(shell.napplets_url + "prompt-api.html")
    napplet.set_llm(True)
    return Examples(shell, napplet)


def text_of(message: dict[str, Any]) -> str:
    return "".join(p["text"] for p in message["content"] if p["type"] == "text")


def test_explainer_examples_run_on_the_scripted_connection(
    page: Any, product_url: str, test_pages_dir: Path, request_log: Any
) -> None:
    script = [
        {"text": "Waves and lights."},  # zero-shot prompt
        {"text": ["A ", "longer ", "poem."], "delayMs": 100},  # zero-shot streaming
        {"text": "Ships!"},  # system prompt, three ways
        {"text": "Gulls!"},
        {"text": "Stars!"},
        {"text": "annoyed"},  # n-shot, two clones
        {"text": "happy"},
        {"text": "A hedge of two metres."},  # several messages in one prompt
        {"json": {"rating": 4}},  # JSON Schema
        {"toolCalls": [{"name": "get_weather", "arguments": {"location": "Seattle"}, "id": "c1"}]},
        {"text": "It is 12 degrees and rainy in Seattle."},  # the tool loop's second round
        {"text": "Both are about water crossings."},  # append, then prompt
    ]
    ex = open_examples(page, product_url, test_pages_dir, script)

    ex.start("availability")
    assert ex.ok("availability") == ["available", "unavailable", "true", "2"]

    ex.start("zeroShot", "Write a short poem.", "Write a longer poem.")
    ex.choose()
    ex.allow(2)
    logs = ex.ok("zeroShot")
    assert logs[0] == "Waves and lights."
    # Streamed: each chunk is new text (the runtime may join deltas that arrive together).
    assert len(logs) > 2 and "".join(logs[1:]) == "A longer poem."

    ex.start("systemPrompts")
    for _ in range(3):
        ex.choose()
        ex.allow()
    assert ex.ok("systemPrompts") == ["Ships!", "Gulls!", "Stars!"]

    ex.start("nShotClone")
    ex.choose()
    ex.allow(2)
    logs = ex.ok("nShotClone")
    assert logs[:2] == ["annoyed", "happy"]

    ex.start("multiUser")
    ex.choose()
    ex.allow()
    assert ex.ok("multiUser") == ["A hedge of two metres."]

    ex.start("jsonSchema", "Rate this review from 0 to 5: lovely soup.")
    ex.choose()
    ex.allow()
    assert ex.ok("jsonSchema") == ["4"]

    ex.start("toolUse", "What is the weather in Seattle?", "location")
    ex.choose()
    ex.allow(2)  # two generations: the tool call, then the answer
    assert ex.ok("toolUse") == [
        '[{"location":"Seattle"}]',
        "It is 12 degrees and rainy in Seattle.",
    ]

    ex.start("append")
    ex.choose()
    ex.allow()  # the appends send nothing
    assert ex.ok("append") == ["true", "Both are about water crossings."]

    # One consent per request: the connection received exactly what was allowed.
    assert ex.shell.script_requests(SCRIPTED) == ex.consents == len(script)

    requests = [r["request"] for r in ex.shell.generate_requests()]
    assert len(requests) == len(script)
    # A session sends its whole history: the second prompt holds the first turn.
    assert [m["role"] for m in requests[1]["messages"]] == ["user", "assistant", "user"]
    assert text_of(requests[1]["messages"][1]) == "Waves and lights."
    # System prompts: first in every one of the three requests.
    for request in requests[2:5]:
        assert [m["role"] for m in request["messages"]] == ["system", "user"]
        assert text_of(request["messages"][0]) == "Answer like a cheerful lighthouse keeper."
    # Clones copy the five initial prompts and do not share their turns.
    for request in requests[5:7]:
        assert [m["role"] for m in request["messages"]] == [
            "system",
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
        ]
    assert text_of(requests[6]["messages"][-1]) == "We won the match."
    assert [m["role"] for m in requests[7]["messages"]] == ["system", "user", "user", "assistant"]
    # JSON Schema: format json, the schema in the prompt.
    assert requests[8]["format"] == "json"
    assert '"rating"' in text_of(requests[8]["messages"][-1])
    # Tools: declared as NAP-LLM tools; the second round carries the toolResult.
    assert requests[9]["tools"][0]["name"] == "get_weather"
    assert requests[9]["tools"][0]["parameters"]["required"] == ["location"]
    second_round = requests[10]["messages"]
    assert [m["role"] for m in second_round] == ["system", "user", "assistant", "toolResult"]
    assert second_round[2]["content"][0]["type"] == "toolCall"
    assert second_round[3]["toolCallId"] == second_round[2]["content"][0]["toolCallId"]
    assert (
        text_of(second_round[3]) == '{"city": "Seattle", "temperature": 12, "condition": "rainy"}'
    )
    # Append: the appended messages go with the one prompt.
    assert [text_of(m) for m in requests[11]["messages"]] == [
        "You compare notes.",
        "Note one: the river is high.",
        "Note two: the bridge is closed.",
        "What do the notes have in common?",
    ]
    request_log.assert_local()


def test_abort_destroy_and_hostile_use_end_in_documented_errors(
    page: Any, product_url: str, test_pages_dir: Path, request_log: Any
) -> None:
    script = {
        "turns": [
            {"text": "Once upon", "stall": True},  # aborted
            {"text": ["a", "b", "c"], "delayMs": 200, "stall": True},  # destroyed while streaming
            {"toolCalls": [{"name": "explode", "arguments": {}}]},  # the tool throws
            {"json": {"rating": 9}},  # does not meet the schema
            {"text": "Note 999."},  # after 1,000 appends
            {"text": "never sent"},
        ]
    }
    ex = open_examples(page, product_url, test_pages_dir, script)

    ex.start("abort")
    ex.choose()
    ex.allow()
    ex.napplet.frame.wait_for_function(
        "() => window.controllers.abort !== undefined", polling=POLL_MS
    )
    ex.shell.page.wait_for_timeout(300)  # the stalled generation has started streaming
    ex.eval("() => window.controllers.abort.abort()")
    error = ex.error("abort")
    assert error == {"name": "AbortError", "message": error["message"], "isDOMException": True}
    assert ex.eval("() => window.afterAbort") == 0  # nothing of the aborted turn was kept
    ex.shell.page.wait_for_function(
        "() => document.querySelector('#connection-list .script-progress').dataset.stopped === '1'"
    )

    ex.start("destroyWhileStreaming")
    ex.choose()
    ex.allow()
    error = ex.error("destroyWhileStreaming")
    assert error["name"] == "AbortError" and error["isDOMException"]
    assert ex.finish("destroyWhileStreaming")["logs"] == ["a"]

    ex.start("useAfterDestroy")
    ex.choose()
    assert ex.error("useAfterDestroy")["name"] == "InvalidStateError"

    ex.start("throwingTool")
    ex.choose()
    ex.allow()
    assert ex.error("throwingTool") == {
        "name": "RangeError",
        "message": "the tool broke",
        "isDOMException": False,
    }

    ex.start("unmetSchema")
    ex.choose()
    ex.allow()
    error = ex.error("unmetSchema")
    assert error["name"] == "SyntaxError" and error["isDOMException"]
    assert "#/rating" in error["message"]
    assert ex.eval("() => window.afterUnmet") == 0  # the failed turn is not in the history

    ex.start("regexConstraint")
    ex.choose()
    assert ex.error("regexConstraint")["name"] == "NotSupportedError"

    ex.start("slowPattern")
    ex.choose()
    assert ex.error("slowPattern")["name"] == "NotSupportedError"

    ex.start("thousandAppends")
    ex.choose()
    ex.allow()  # only the prompt asks
    logs = ex.ok("thousandAppends", timeout_ms=120_000)
    # 1 system prompt + 1,000 notes in a session of 256 messages: 745 evictions.
    assert logs == [str(1 + 1000 - MAX_HISTORY_MESSAGES), "Note 999."]

    assert ex.shell.script_requests(SCRIPTED) == ex.consents == 5

    # Consent denied, chooser cancelled: NotAllowedError, nothing reaches the connection.
    ex.start("deniedConsent")
    ex.choose()
    ex.deny()
    assert ex.error("deniedConsent")["name"] == "NotAllowedError"
    ex.start("cancelledChooser")
    ex.cancel_chooser()
    assert ex.error("cancelledChooser")["name"] == "NotAllowedError"
    assert ex.shell.script_requests(SCRIPTED) == 5

    requests = [r["request"] for r in ex.shell.generate_requests()]
    assert requests[-1]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Hello?"}]}
    ]
    last = requests[-2]["messages"]  # the prompt after 1,000 appends
    assert (
        len(last) == MAX_HISTORY_MESSAGES
    )  # the bounded history plus the prompt, oldest notes gone
    assert last[0]["role"] == "system" and text_of(last[1]) == "746"
    assert text_of(last[-1]) == "Which note came last?"
    request_log.assert_local()


def test_explainer_examples_run_on_tinychat(
    page: Any, product_url: str, test_pages_dir: Path, request_log: Any
) -> None:
    page.set_default_timeout(STEP_TIMEOUT_MS)
    ex = open_examples(page, product_url, test_pages_dir, None)
    greedy = {"samplingMode": "most-predictable"}  # temperature 0: TinyChat's exact answers

    ex.start("zeroShot", "Hello!", "Who are you?", greedy)
    ex.choose(TINYCHAT)
    ex.allow(2)
    logs = ex.ok("zeroShot", timeout_ms=120_000)
    assert logs[0] == "Hello! How can I help you today?"
    assert len(logs) > 2  # streamed in several chunks
    assert "".join(logs[1:]) == "I am TinyChat, a small test model."

    ex.start("jsonPerson", "Return a JSON object with name Alice and age 30.", greedy)
    ex.choose(TINYCHAT)
    ex.allow()
    assert ex.ok("jsonPerson", timeout_ms=120_000) == ['{"name": "Alice", "age": 30}']

    ex.start("toolUse", "What is the weather in Berlin?", "city", {**greedy, "noSystem": True})
    ex.choose(TINYCHAT)
    ex.allow(2)
    logs = ex.ok("toolUse", timeout_ms=120_000)
    assert logs[0] == '[{"city":"Berlin"}]'
    assert logs[1] == "It is sunny in Berlin with a temperature of 21 degrees."

    ex.start("conversation", greedy)
    ex.choose(TINYCHAT)
    ex.allow(4)  # two sessions' prompts, the prompt after append, the aborted stream
    assert ex.ok("conversation", timeout_ms=120_000) == [
        "Hello! How can I help you today?",
        "I am TinyChat, a small test model.",
        "Goodbye! Have a nice day.",
        "true",
        "AbortError",
    ]
    request_log.assert_local()


def test_a_napplet_without_the_meta_sees_no_change(
    page: Any, product_url: str, test_pages_dir: Path, request_log: Any
) -> None:
    shell = boot_shell(page, product_url, test_pages_dir, "")
    napplets = shell.napplets_url
    probe = shell.open_napplet()
    probe.set_llm(True)
    seen = probe.frame.evaluate(
        "() => ({nappletLayer: 'NappletLanguageModel' in window,"
        " languageModel: typeof window.LanguageModel === 'undefined' ? 'undefined'"
        " : String(window.LanguageModel).includes('[native code]') ? 'native' : 'other',"
        " scripts: document.querySelectorAll('script').length})"
    )
    assert seen["nappletLayer"] is False
    assert seen["languageModel"] in ("undefined", "native")
    ex = Examples(shell, shell.open_napplet(napplets + "prompt-api.html"))
    ex.napplet.set_llm(True)
    native = ex.eval("() => LanguageModel.native === undefined ? 'none' : 'kept'")
    # A native LanguageModel, where this Chromium has one, stays reachable.
    assert native == ("kept" if seen["languageModel"] == "native" else "none")
    # LLM access off: the layer is there, and says "unavailable" without a dialog.
    ex.napplet.set_llm(False)
    ex.start("availability")
    assert ex.ok("availability")[:2] == ["unavailable", "unavailable"]
    request_log.assert_local()


def test_the_gallery_napplet_uses_only_the_prompt_api(
    page: Any, product_url: str, test_pages_dir: Path, request_log: Any
) -> None:
    script = [
        {"text": ["Hello", " there!"], "delayMs": 50},
        {"json": {"rating": 5}},
        {"text": "Once upon", "stall": True},
    ]
    shell = boot_shell(page, product_url, test_pages_dir, "", {SCRIPTED: script})
    before = page.locator("iframe.napplet-frame").count()
    page.fill("#napplet-url", f"{product_url}napplets/prompt/index.html")
    page.click("#napplet-url-open")
    frame = linked_napplet_frame(page, before)
    dialogs = Examples(shell, None)  # type: ignore[arg-type]  # dialogs only
    frame.wait_for_function(
        "() => document.querySelector('#availability').textContent === 'Availability: available'",
        polling=POLL_MS,
    )

    frame.click("#start")
    dialogs.choose()
    status = frame.locator("#status")
    status.filter(has_text="Session started.").wait_for()
    frame.click("#send")
    dialogs.allow()
    status.filter(has_text="Done.").wait_for()
    assert frame.text_content("#answer") == "Hello there!"

    frame.click("#rate")
    dialogs.allow()
    status.filter(has_text="Rated.").wait_for()
    assert json.loads(frame.text_content("#rating") or "") == {"rating": 5}

    frame.click("#send")
    dialogs.allow()
    frame.locator("#answer").filter(has_text="Once upon").wait_for()
    frame.click("#stop")
    status.filter(has_text="No answer (AbortError").wait_for()
    assert shell.script_requests(SCRIPTED) == dialogs.consents == 3
    requests = [r["request"] for r in shell.generate_requests()]
    # The rating ran on a clone: the third request holds the first turn only.
    assert [m["role"] for m in requests[2]["messages"]] == [
        "system",
        "user",
        "assistant",
        "user",
    ]
    request_log.assert_local()
