/**
 * Chunk batches posted by an engine worker (wllama-worker.js,
 * webllm-worker.js) to the page: how a chat stream that runs in a worker
 * reaches the page's main thread in batches, without a timer in front of
 * the first text.
 *
 * Rules (README, DESIGN notes "Generation off the main thread")
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
 * - Once `signal` is aborted nothing more is posted and nothing is returned.
 */

/** The least time between two posts of one stream after its first text (ms): one display frame. */
export const BATCH_MS = 16;

/** Whether an OpenAI chat chunk carries text or a tool call (not only a role or usage). */
export function carriesOutput(chunk) {
  const choice = chunk && Array.isArray(chunk.choices) ? chunk.choices[0] : null;
  const delta = choice && choice.delta;
  if (!delta || typeof delta !== "object") return false;
  return (typeof delta.content === "string" && delta.content.length > 0) || Array.isArray(delta.tool_calls);
}

/**
 * Read `chunks` to the end, posting batches through `post(message)`.
 * Returns the JSON texts still waiting (module rules); rethrows the
 * iterator's error after clearing its timer.
 */
export async function runChat(chunks, post, signal) {
  let waiting = [];
  let sentOutput = false;
  let lastPost = -Infinity;
  let timer = null;
  const flush = () => {
    if (timer !== null) clearTimeout(timer);
    timer = null;
    if (waiting.length === 0 || signal.aborted) return;
    post({ op: "chunks", chunks: waiting });
    waiting = [];
    lastPost = performance.now();
  };
  try {
    for await (const chunk of chunks) {
      if (signal.aborted) break;
      waiting.push(JSON.stringify(chunk));
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
  return signal.aborted ? [] : waiting;
}
