"""The engines' chunk batching in JS (web/engines/batcher.js, streams.js), run in node.

What the page and the runtime receive from an engine worker: the first text
together with the chunks before it, later chunks coalesced, every chunk once
and in order, nothing after an abort; and a stream's tail read together with
its end.
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nodejs import needs_node, run_module

from napllm.providers.chat_stream import ChatStreamToLmsp

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ROOT / "web" / "engines"

pytestmark = needs_node


def run_node(body: str) -> Any:
    """Run an ES module body (with `batcher` and `streams` imported); its JSON output."""
    script = (
        f"import * as batcher from {json.dumps((ENGINES / 'batcher.js').as_uri())};\n"
        f"import * as streams from {json.dumps((ENGINES / 'streams.js').as_uri())};\n"
        f"{body}\n"
    )
    return run_module(script)


CHUNKS = """
const chunk = (delta, finish = null) => ({ choices: [{ index: 0, delta, finish_reason: finish }] });
async function* engine(n, signal = null) {
  yield chunk({ role: 'assistant', content: '' });
  for (let i = 1; i <= n; i += 1) {
    if (signal && i === 3) signal.abort();
    yield chunk({ content: `${i},` });
  }
  yield chunk({}, 'stop');
}
"""


def test_the_first_text_goes_at_once_with_the_role_and_the_rest_in_batches() -> None:
    """Unmerged (`merge = false`, as with a delivery delay): every chunk as it came."""
    out = run_node(
        CHUNKS
        + """
const posts = [];
const rest = await batcher.runChat(engine(200), (m) => posts.push(m.chunks), new AbortController().signal, false);
const texts = (list) => list.map((t) => JSON.parse(t).choices[0].delta.content ?? null);
console.log(JSON.stringify({ first: texts(posts[0]), posts: posts.length,
  all: [...posts.flat(), ...rest].map((t) => JSON.parse(t)), rest: rest.length }));
"""
    )
    # The role-only chunk waits for the first text and travels with it.
    assert out["first"] == ["", "1,"]
    # Every chunk arrives exactly once, in order; 202 chunks in fewer posts.
    contents = [c["choices"][0]["delta"].get("content") for c in out["all"]]
    assert contents == ["", *[f"{i}," for i in range(1, 201)], None]
    assert out["all"][-1]["choices"][0]["finish_reason"] == "stop"
    assert out["posts"] < 202


def test_merged_batches_carry_the_same_text_in_fewer_chunks() -> None:
    out = run_node(
        CHUNKS
        + """
const posts = [];
const rest = await batcher.runChat(engine(200), (m) => posts.push(m.chunks), new AbortController().signal);
console.log(JSON.stringify({ first: posts[0].map((t) => JSON.parse(t)),
  all: [...posts.flat(), ...rest].map((t) => JSON.parse(t)), posts: posts.length }));
"""
    )
    # The role-only chunk (empty text) and the first text are one chunk, sent at once.
    assert out["first"] == [
        {
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": "1,"}, "finish_reason": None}
            ]
        }
    ]
    texts = [c for c in out["all"] if c["choices"][0]["finish_reason"] is None]
    # One text chunk per post (each batch's run merged), the text whole and in order.
    assert len(texts) <= out["posts"] + 1
    assert "".join(c["choices"][0]["delta"]["content"] for c in texts) == "".join(
        f"{i}," for i in range(1, 201)
    )
    assert out["all"][-1] == {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}


def text_chunk(t: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": t, **extra}, "finish_reason": None}],
    }


def last_chunk(reason: str = "stop") -> dict[str, Any]:
    return {
        "id": "c1",
        "choices": [{"index": 0, "delta": {}, "finish_reason": reason}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
    }


def merged(chunks: list[Any]) -> Any:
    """`batcher.mergeTextChunks(chunks)` in node, and whether the input was left unchanged."""
    return run_node(
        f"const input = {json.dumps(chunks)};\n"
        "const before = JSON.stringify(input);\n"
        "const out = batcher.mergeTextChunks(input);\n"
        "console.log(JSON.stringify({ out, unchanged: JSON.stringify(input) === before }));"
    )


def test_a_run_of_text_chunks_becomes_one_chunk() -> None:
    got = merged(
        [text_chunk("1,", role="assistant"), text_chunk(" 2"), text_chunk(","), text_chunk(" 3.")]
    )
    assert got["unchanged"] is True
    assert len(got["out"]) == 1
    assert got["out"][0]["choices"][0]["delta"] == {"content": "1, 2, 3.", "role": "assistant"}
    assert got["out"][0]["id"] == "c1"


def test_other_chunks_stay_in_place_and_split_runs() -> None:
    tool = {
        "choices": [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]},
                "finish_reason": None,
            }
        ]
    }
    other_role = text_chunk("e", role="tool")
    batch = [text_chunk("a"), text_chunk("b"), tool, text_chunk("c"), text_chunk("d"), other_role]
    got = merged([*batch, last_chunk()])
    assert got["out"] == [text_chunk("ab"), tool, text_chunk("cd"), other_role, last_chunk()]


def test_chunks_that_are_not_plain_text_pass_unchanged() -> None:
    odd: list[Any] = [
        "not a chunk",
        None,
        [1, 2],
        {"choices": []},
        {"choices": [{"index": 1, "delta": {"content": "x"}}]},
        {"choices": [{"index": 0, "delta": {"content": "x", "reasoning_content": "r"}}]},
        {"choices": [{"index": 0, "delta": {"content": "x"}, "logprobs": {"content": []}}]},
        {"choices": [{"index": 0, "delta": {"content": 3}}]},
        {"choices": [{"index": 0, "delta": {"content": "x"}}], "usage": {"total_tokens": 1}},
        {"choices": [{"index": 0, "delta": {"content": "x"}, "extra": 1}]},
        {"choices": [{"index": 0, "delta": {"content": None, "role": "assistant"}}]},
    ]
    assert merged(odd)["out"] == odd
    assert merged([])["out"] == []


def mapped_text(chunks: list[Any], tools: bool) -> tuple[str, list[str]]:
    state = ChatStreamToLmsp(parse_tool_call_blocks=tools)
    events = [e for c in chunks for e in state.feed(c)] + list(state.finish())
    deltas = "".join(
        str(e.data.get("delta", "")) for e in events if e.event == "response.output_text.delta"
    )
    kinds = [e.event for e in events if not e.event.endswith(".delta")]
    return deltas, kinds


def test_merged_batches_map_to_the_same_text_and_items() -> None:
    pieces = ["Hel", "lo", " <tool", "_call>", '\n{"name": "f", "arguments": {}}', "\n</tool_call>"]
    chunks = [text_chunk(p) for p in pieces] + [last_chunk("tool_calls")]
    batch = merged(chunks)["out"]
    assert len(batch) == 2
    for tools in (False, True):
        assert mapped_text(batch, tools) == mapped_text(chunks, tools)


def test_a_stream_without_text_posts_nothing_and_returns_everything() -> None:
    out = run_node(
        """
async function* engine() {
  yield { choices: [{ index: 0, delta: { role: 'assistant' }, finish_reason: null }] };
  yield { choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] };
}
const posts = [];
const rest = await batcher.runChat(engine(), (m) => posts.push(m), new AbortController().signal);
console.log(JSON.stringify({ posts: posts.length, rest: rest.length }));
"""
    )
    assert out == {"posts": 0, "rest": 2}


def test_nothing_is_posted_or_returned_after_an_abort() -> None:
    out = run_node(
        CHUNKS
        + """
const controller = new AbortController();
const posts = [];
const rest = await batcher.runChat(engine(50, controller), (m) => posts.push(...m.chunks), controller.signal);
console.log(JSON.stringify({ posted: posts.map((t) => JSON.parse(t).choices[0].delta.content),
  rest: rest.length }));
"""
    )
    # The chunks before the abort may or may not have been posted yet (a
    # batch timer); none from after it ever is.
    assert out["posted"][:1] == ["1,"]  # the role-only chunk merged with the first text
    assert out["posted"] in (["1,"], ["1,", "2,"])
    assert out["rest"] == 0


def test_a_read_after_the_end_carries_the_tail_and_the_end_together() -> None:
    out = run_node(
        """
const stream = streams.open('t');
streams.pushSerialized(stream, ['{"a":1}']);
const first = JSON.parse(await streams.next(stream.id));
streams.pushSerialized(stream, ['{"b":2}', '{"c":3}']);
streams.end(stream, 'inference');
const last = JSON.parse(await streams.next(stream.id));
console.log(JSON.stringify({ first, last, open: streams.openCount(),
  after: JSON.parse(await streams.next(stream.id)) }));
"""
    )
    assert out["first"] == {"chunks": [{"a": 1}], "done": False, "error": None}
    assert out["last"] == {
        "chunks": [{"b": 2}, {"c": 3}],
        "done": True,
        "error": {"kind": "inference"},
    }
    assert out["open"] == 0
    assert out["after"]["done"] is True


def test_a_waiting_read_gets_the_next_chunk_and_a_cancel_ends_it() -> None:
    out = run_node(
        """
const stream = streams.open('t');
const pending = streams.next(stream.id);
streams.pushSerialized(stream, ['{"a":1}']);
const got = JSON.parse(await pending);
const waiting = streams.next(stream.id);
streams.cancel(stream.id);
console.log(JSON.stringify({ got, cancelled: JSON.parse(await waiting), aborted: stream.aborted }));
"""
    )
    assert out["got"] == {"chunks": [{"a": 1}], "done": False, "error": None}
    assert out["cancelled"] == {"chunks": [], "done": True, "error": None}
    assert out["aborted"] is True


# -- hostile chunk shapes: merging never changes what the runtime maps ----------


def both_ways(setup: str) -> Any:
    """Chunks built by JS `setup` (a `chunks` array), serialized merged and one by one."""
    return run_node(
        f"{setup}\n"
        "const merged = batcher.mergeTextChunks(chunks).map((c) => JSON.stringify(c));\n"
        "const single = chunks.map((c) => JSON.stringify(c));\n"
        "console.log(JSON.stringify({ merged, single }));"
    )


def mapped_outcome(texts: list[str]) -> tuple[str, list[str]] | str:
    """What the runtime makes of serialized chunks: (text, item events), or the failure."""
    from napllm.errors import ProviderFailure
    from napllm.jsontext import read_stream_payload
    from napllm.streaming import SurrogateJoiner

    state = ChatStreamToLmsp(parse_tool_call_blocks=False)
    joiner = SurrogateJoiner()
    text = ""
    try:
        events = [e for t in texts for e in state.feed(read_stream_payload(t))]
        events += list(state.finish())
    except ProviderFailure as exc:
        return f"failure: {exc.code}"
    for event in events:
        if event.event == "response.output_text.delta":
            text += joiner.feed(str(event.data.get("delta", "")))
    kinds = [e.event for e in events if not e.event.endswith(".delta")]
    return text + joiner.flush(), kinds


def test_an_error_chunk_is_never_merged_into_text() -> None:
    """A chunk with a top-level `error` fails the stream, merged or not (it was dropped)."""
    for order in ("[text('a'), erring('b')]", "[erring('a'), text('b')]"):
        got = both_ways(
            "const text = (t) => ({ id: 'c1', choices: [{ index: 0, delta: { content: t } }] });\n"
            "const erring = (t) => ({ error: { message: 'boom' }, choices: [{ index: 0, delta: { content: t } }] });\n"
            f"const chunks = {order};"
        )
        assert mapped_outcome(got["merged"]) == mapped_outcome(got["single"])
        assert str(mapped_outcome(got["merged"])).startswith("failure")


def test_chunks_with_unknown_top_level_keys_stay_apart() -> None:
    got = merged(
        [text_chunk("a"), {**text_chunk("b"), "x_extra": {"content": "?"}}, text_chunk("c")]
    )
    assert len(got["out"]) == 3


def test_objects_that_are_not_plain_data_are_not_merged() -> None:
    """Getters, inherited fields, `toJSON` and class instances: serialized as they are."""
    got = both_ways(
        """
const text = (t) => ({ id: 'c1', choices: [{ index: 0, delta: { content: t } }] });
class Delta { get content() { return 'inherited'; } }
const withGetter = { choices: [{ index: 0, delta: { get content() { return 'getter'; } } }] };
const withToJson = { ...text('t'), toJSON() { return text('replaced'); } };
const inherited = { choices: [{ index: 0, delta: new Delta() }] };
const protoChoice = { choices: [Object.assign(Object.create({ extra: 1 }), { index: 0, delta: { content: 'p' } })] };
const protoKey = JSON.parse('{"choices": [{"index": 0, "delta": {"content": "k", "__proto__": {"role": "x"}}}]}');
const chunks = [text('a'), withToJson, text('b'), inherited, text('c'), withGetter, text('d'),
                protoChoice, text('e'), protoKey, text('f')];
"""
    )
    assert mapped_outcome(got["merged"]) == mapped_outcome(got["single"])
    assert mapped_outcome(got["single"])[0] == "areplacedbcgetterdpekf"  # type: ignore[index]


def test_split_surrogate_pairs_map_to_the_same_text_merged_or_not() -> None:
    got = both_ways(
        """
const text = (t) => ({ choices: [{ index: 0, delta: { content: t } }] });
const chunks = [text('a\\ud83d'), text('\\ude00b'), text('\\ud83d'), text('c'), text('\\ude00'),
                text('\\ud83d'), { choices: [{ index: 0, delta: {}, finish_reason: null }] }, text('\\ude00'), text('\\ud83d')];
"""
    )
    assert mapped_outcome(got["merged"]) == mapped_outcome(got["single"])
    assert len(got["merged"]) < len(got["single"])


#: A stream built like wllama's (`cbToAsyncIter`): each read awaits the next
#: of a list of promises that the producer settles; after an abort the
#: producer rejects the pending one with "Operation aborted", whether or not
#: anybody still reads.
WLLAMA_LIKE = """
function wllamaLike(signal) {
  const values = [];
  let resolve, reject;
  const next = () => values.push(new Promise((res, rej) => { resolve = res; reject = rej; }));
  next();
  let i = 0;
  const timer = setInterval(() => {
    if (signal.aborted) {
      // The token in flight still arrives; the abort error settles the read after it.
      clearInterval(timer);
      resolve([{ choices: [{ index: 0, delta: { content: 'late,' }, finish_reason: null }] }, false]);
      next();
      const rejectLater = reject;
      setTimeout(() => {
        const error = new Error('Operation aborted');
        error.name = 'WllamaAbortError';
        rejectLater(error);
      }, 5);
      return;
    }
    i += 1;
    resolve([{ choices: [{ index: 0, delta: { content: `${i},` }, finish_reason: null }] }, false]);
    next();
  }, 2);
  return (async function* () {
    for (let k = 0, done = false; !done; k += 1) {
      let val;
      [val, done] = await values[k];
      if (val !== undefined) yield val;
    }
  })();
}
async function uncaughtAfterAbort(wrap) {
  const uncaught = [];
  const onRejection = (reason) => uncaught.push(String(reason && reason.message));
  process.on('unhandledRejection', onRejection);
  const controller = new AbortController();
  const posts = [];
  setTimeout(() => controller.abort(), 30);
  const stream = wllamaLike(controller.signal);
  let thrown = null;
  try {
    await batcher.runChat(wrap ? batcher.drainedOnExit(stream) : stream, (m) => posts.push(m), controller.signal);
  } catch (error) {
    thrown = String(error.message);
  }
  await new Promise((r) => setTimeout(r, 100));
  process.off('unhandledRejection', onRejection);
  return { uncaught, thrown, posted: posts.length > 0 };
}
"""


def test_an_aborted_wllama_stream_leaves_no_uncaught_rejection() -> None:
    """Twenty aborts of a wllama-like stream: handled when drained, uncaught when not."""
    out = run_node(
        WLLAMA_LIKE
        + """
const drained = [];
for (let n = 0; n < 20; n += 1) drained.push(await uncaughtAfterAbort(true));
const bare = await uncaughtAfterAbort(false);
console.log(JSON.stringify({ drained, bare }));
"""
    )
    assert all(run["uncaught"] == [] for run in out["drained"]), out["drained"]
    assert all(run["posted"] for run in out["drained"])
    # The same stream read without the wrapper: the rejection nobody handles.
    assert out["bare"]["uncaught"] == ["Operation aborted"]


def test_a_drained_stream_yields_everything_and_passes_errors_on() -> None:
    out = run_node(
        """
async function* three() { yield 1; yield 2; yield 3; }
async function* failing() { yield 1; throw new Error('engine failed'); }
const all = [];
for await (const v of batcher.drainedOnExit(three())) all.push(v);
let error = null;
try { for await (const v of batcher.drainedOnExit(failing())) all.push(v); } catch (e) { error = e.message; }
console.log(JSON.stringify({ all, error }));
"""
    )
    assert out == {"all": [1, 2, 3, 1], "error": "engine failed"}
