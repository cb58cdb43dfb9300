/**
 * Chunk batches posted by an engine worker (wllama-worker.js,
 * webllm-worker.js) to the page: how a chat stream that runs in a worker
 * reaches the page's main thread in batches, without a timer in front of
 * the first text.
 *
 * Rules (README, "Design note: generation off the main thread")
 * - `runChat(chunks, post, signal)` reads an async iterable of OpenAI chat
 *   chunks to its end and posts `{op: "chunks", chunks: [JSON text, ...]}`
 *   messages (each chunk serialized here, so the page only concatenates)
 *   through `post`; it returns the chunks not yet posted when the stream
 *   ends, so the caller sends them with its `end` message (one message, one
 *   read on the page, for the stream's tail).
 * - Chunks before the first one that carries text or a tool call (a
 *   role-only chunk) wait for it, and that first output is posted at once
 *   with them: the first text never waits for a timer, and the page reads
 *   it in the same batch as the role. After it, chunks are coalesced: at most one post
 *   every `BATCH_MS`, the rest waits in the worker (a timer posts what
 *   waited once the gap has passed). The page and the runtime then work per
 *   batch, not per token, while the engine runs ahead here (NAP-LLM,
 *   Streaming: deltas may be coalesced; no text is dropped or reordered).
 * - Each batch (and the returned tail) has its runs of adjacent text-only
 *   chunks merged into one chunk (`mergeTextChunks`): the runtime parses and
 *   maps one chunk per run instead of one per token, and the text is the
 *   same, in the same order (the mapping accepts text split anywhere).
 *   Only plain data is merged (`plainParts`): a chunk with any other
 *   top-level field (an `error`), a getter, an inherited field or a class
 *   instance is sent as it is, so a merge never changes what the runtime
 *   reads. A caller that wants chunks one by one (a delivery delay) passes
 *   `merge = false`.
 * - Once `signal` is aborted nothing more is posted and nothing is returned.
 * - `drainedOnExit(chunks)` wraps a stream whose engine rejects a promise
 *   nobody awaits when its reader stops early (wllama: after an abort its
 *   stream settles its next read with `WllamaAbortError`, "Operation
 *   aborted", once the reader has already left). When the reader leaves
 *   before the end, the rest is read in the background and its rejection
 *   handled, so every abort path ends without an uncaught error. Only for
 *   engines whose stream ends by itself on the abort signal: reading the
 *   rest of any other stream would run its generation to the end.
 */

/**
 * The least time between two posts of one stream after its first text (ms):
 * two display frames. A merged batch costs the runtime about the same
 * whatever text it carries, so fewer batches leave more of a small
 * machine's cores to the engine (bench_wasm: tokens/s after the first
 * token 0.96-0.97 of the bare worker at 16 ms, 1.00-1.02 at 32 ms), and a
 * napplet's text still updates 30 times a second.
 */
export const BATCH_MS = 32;

/**
 * `chunks` as an async iterable whose remainder is read in the background,
 * with any rejection handled, when its reader stops before the end (see the
 * rules above). Yields exactly what `chunks` yields.
 */
export async function* drainedOnExit(chunks) {
  const iterator = chunks[Symbol.asyncIterator]();
  let ended = false;
  try {
    for (;;) {
      const step = await iterator.next();
      if (step.done) {
        ended = true;
        return;
      }
      yield step.value;
    }
  } catch (error) {
    ended = true;
    throw error;
  } finally {
    if (!ended) {
      (async () => {
        try {
          while (!(await iterator.next()).done) {
            /* dropped: the reader is gone */
          }
        } catch {
          /* the engine's abort error, handled */
        }
      })();
    }
  }
}

/** Whether an OpenAI chat chunk carries text or a tool call (not only a role or usage). */
export function carriesOutput(chunk) {
  const choice = chunk && Array.isArray(chunk.choices) ? chunk.choices[0] : null;
  const delta = choice && choice.delta;
  if (!delta || typeof delta !== "object") return false;
  return (typeof delta.content === "string" && delta.content.length > 0) || Array.isArray(delta.tool_calls);
}

/**
 * Top-level fields a text-only chunk may have (OpenAI's, and llama.cpp's
 * `timings` and `prompt_progress` from wllama): the runtime reads none of
 * them but `choices` and `usage`, so the merged chunk may keep the first
 * chunk's. Any other field (`error` above all) keeps a chunk apart.
 */
const PLAIN_CHUNK_KEYS = new Set([
  "id", "object", "created", "model", "system_fingerprint", "service_tier", "choices", "usage", "timings", "prompt_progress",
]);
const PLAIN_CHOICE_KEYS = new Set(["index", "delta", "finish_reason", "logprobs"]);
const PLAIN_DELTA_KEYS = new Set(["content", "role"]);

/**
 * The fields of `value` when it is plain data whose every field is named in
 * `allowed`, else null: an object whose prototype is `Object.prototype` or
 * null (no class instance, no inherited field), whose own enumerable
 * fields (the ones JSON.stringify writes) are all data properties, never
 * getters. The fields are copied out (a null-prototype object), so a merge
 * writes exactly the values that were checked.
 */
function plainFields(value, allowed) {
  if (!value || typeof value !== "object" || Array.isArray(value)) return null;
  const proto = Object.getPrototypeOf(value);
  if (proto !== Object.prototype && proto !== null) return null;
  const fields = Object.create(null);
  for (const key of Object.keys(value)) {
    if (!allowed.has(key)) return null;
    const field = Object.getOwnPropertyDescriptor(value, key);
    if (!field || !("value" in field)) return null;
    fields[key] = field.value;
  }
  return fields;
}

/**
 * The checked fields of a chunk that carries nothing but text, else null:
 * `{chunk, choice, delta}`, each from `plainFields`, with `delta.content` a
 * string. Plain means: only the usual top-level fields (an `error`, an
 * extension or a `toJSON` is not), no usage, one choice of index 0 with no
 * finish reason and no log-probabilities, whose delta holds only `content`
 * and maybe `role`. Anything else (tool calls, reasoning, the last chunk,
 * objects that are not plain data) is not: such a chunk is sent as it is.
 */
function plainParts(chunk) {
  const top = plainFields(chunk, PLAIN_CHUNK_KEYS);
  if (top === null || (top.usage !== undefined && top.usage !== null)) return null;
  const choices = top.choices;
  if (!Array.isArray(choices) || Object.getPrototypeOf(choices) !== Array.prototype || choices.length !== 1) return null;
  const slot = Object.getOwnPropertyDescriptor(choices, "0");
  if (!slot || !("value" in slot)) return null;
  const choice = plainFields(slot.value, PLAIN_CHOICE_KEYS);
  if (choice === null || (choice.index ?? 0) !== 0) return null;
  if (choice.finish_reason !== undefined && choice.finish_reason !== null) return null;
  if (choice.logprobs !== undefined && choice.logprobs !== null) return null;
  const delta = plainFields(choice.delta, PLAIN_DELTA_KEYS);
  if (delta === null || typeof delta.content !== "string") return null;
  return { chunk: top, choice, delta };
}

/** The content of a chunk that carries nothing but text (`plainParts`), else null. */
export function plainText(chunk) {
  const parts = plainParts(chunk);
  return parts === null ? null : parts.delta.content;
}

/**
 * `last` and `chunk` as one chunk when both carry nothing but text
 * (`plainParts`) and `chunk` names no other role than `last`: `last`'s
 * checked fields with the two texts joined (new plain objects; neither
 * input changes). Else null.
 */
export function mergedWith(last, chunk) {
  const head = plainParts(last);
  if (head === null) return null;
  const next = plainParts(chunk);
  if (next === null) return null;
  const role = next.delta.role;
  if (role !== undefined && role !== null && role !== head.delta.role) return null;
  return {
    ...head.chunk,
    choices: [{ ...head.choice, delta: { ...head.delta, content: head.delta.content + next.delta.content } }],
  };
}

/** `chunks` with each run of adjacent text-only chunks merged (`mergedWith`), in order. */
export function mergeTextChunks(chunks) {
  const out = [];
  for (const chunk of chunks) {
    const merged = out.length > 0 ? mergedWith(out[out.length - 1], chunk) : null;
    if (merged) out[out.length - 1] = merged;
    else out.push(chunk);
  }
  return out;
}

/**
 * Read `chunks` to the end, posting batches through `post(message)`.
 * Returns the JSON texts still waiting (module rules); rethrows the
 * iterator's error after clearing its timer. With `merge` (the default)
 * each batch's runs of text-only chunks are sent as one chunk.
 */
export async function runChat(chunks, post, signal, merge = true) {
  let waiting = [];
  let sentOutput = false;
  let lastPost = -Infinity;
  let timer = null;
  const flush = () => {
    if (timer !== null) clearTimeout(timer);
    timer = null;
    if (waiting.length === 0 || signal.aborted) return;
    post({ op: "chunks", chunks: serialized(waiting, merge) });
    waiting = [];
    lastPost = performance.now();
  };
  try {
    for await (const chunk of chunks) {
      if (signal.aborted) break;
      waiting.push(chunk);
      if (!sentOutput) {
        if (carriesOutput(chunk)) {
          sentOutput = true;
          flush();
        }
        continue;
      }
      const wait = lastPost + BATCH_MS - performance.now();
      if (wait <= 0) flush();
      else if (timer === null) timer = setTimeout(flush, wait);
    }
  } finally {
    if (timer !== null) clearTimeout(timer);
    timer = null;
  }
  return signal.aborted ? [] : serialized(waiting, merge);
}

function serialized(chunks, merge) {
  return (merge ? mergeTextChunks(chunks) : chunks).map((chunk) => JSON.stringify(chunk));
}
