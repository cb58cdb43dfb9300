/**
 * Chunk streams shared by the in-browser engines (wllama, WebLLM): how a
 * chat stream produced in JS is read from Python without holding JS objects.
 *
 * Rules
 * - A stream is identified by a string id. Its producer pushes OpenAI chat
 *   chunks (`push`, or `pushSerialized` for chunks already turned into JSON
 *   text, as the wasm engine's worker sends them) and finally ends it (`end`,
 *   with an error kind or none). The queue holds JSON texts, so a read only
 *   concatenates them: the main thread does no per-token parsing.
 * - `next(id)` resolves with JSON text `{"chunks": [...], "done": bool,
 *   "error": null | {"kind": text}}` holding every chunk queued since the
 *   previous read (one bridge crossing per batch, not per token), at once:
 *   a read waits only while nothing is queued. A batch read after the
 *   stream ended carries `done` (and the error) itself, so the stream's
 *   tail costs one read; once `done` has been reported the stream is
 *   forgotten.
 * - `cancel(id)` marks the stream aborted, drops queued chunks, wakes a
 *   pending read (which reports `done`) and forgets it; the producer learns
 *   it through `stream.aborted` and its AbortSignal.
 * - Batching is the producer's: an engine worker posts every chunk at once
 *   until the first text and then at most one batch every few milliseconds
 *   (batcher.js), so the first text never waits for a timer here and the
 *   runtime still works per batch while the engine runs ahead.
 * - A delivery delay (0 unless the caller sets one) hands chunks over one at a time.
 */

const streams = new Map();
let counter = 0;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function wake(stream) {
  const waiter = stream.waiter;
  stream.waiter = null;
  if (waiter) waiter();
}

/** The open stream `id` (its state object), or null once it is read out or cancelled. */
export function byId(id) {
  return streams.get(String(id)) || null;
}

/** Create a stream; returns its state object (`id`, `controller`, `aborted`). */
export function open(prefix, deliveryDelayMs = 0) {
  counter += 1;
  const stream = {
    id: `${prefix}-${counter}`,
    queue: [],
    done: false,
    error: null,
    waiter: null,
    controller: new AbortController(),
    delayMs: Math.max(0, Number(deliveryDelayMs) || 0),
    get aborted() {
      return this.controller.signal.aborted;
    },
  };
  streams.set(stream.id, stream);
  return stream;
}

/** Queue one chunk (ignored once the stream is aborted or ended). */
export function push(stream, chunk) {
  if (stream.done || stream.aborted) return;
  stream.queue.push(JSON.stringify(chunk));
  wake(stream);
}

/** Queue chunks given as JSON texts (each one chunk; ignored once aborted or ended). */
export function pushSerialized(stream, texts) {
  if (stream.done || stream.aborted) return;
  for (const text of texts) stream.queue.push(String(text));
  wake(stream);
}

function batch(texts, done = false, error = null) {
  return `{"chunks":[${texts.join(",")}],"done":${done},"error":${JSON.stringify(error)}}`;
}

/** End the stream; `errorKind` names a failure (see the Python side's hints). */
export function end(stream, errorKind = null) {
  if (stream.done) return;
  stream.done = true;
  if (errorKind && !stream.aborted) stream.error = { kind: String(errorKind) };
  wake(stream);
}

/** The next batch of stream `id` as JSON text (module rules). */
export async function next(id) {
  const stream = streams.get(String(id));
  if (!stream) return JSON.stringify({ chunks: [], done: true, error: { kind: "unknown" } });
  for (;;) {
    if (stream.aborted) break;
    if (stream.queue.length > 0) {
      if (stream.delayMs > 0) {
        await sleep(stream.delayMs);
        if (stream.aborted) break;
        return batch([stream.queue.shift()]);
      }
      const texts = stream.queue.splice(0, stream.queue.length);
      if (!stream.done) return batch(texts);
      streams.delete(stream.id);
      return batch(texts, true, stream.error);
    }
    if (stream.done) break;
    await new Promise((resolve) => {
      stream.waiter = resolve;
    });
  }
  streams.delete(stream.id);
  return JSON.stringify({ chunks: [], done: true, error: stream.error });
}

/** Abort stream `id`; returns false when it was already gone. */
export function cancel(id) {
  const stream = streams.get(String(id));
  if (!stream) return false;
  streams.delete(stream.id);
  stream.controller.abort();
  stream.queue.length = 0;
  stream.done = true;
  wake(stream);
  return true;
}

/** End every open stream whose id starts with `prefix` (its producer is gone). */
export function endAll(prefix, errorKind) {
  for (const stream of streams.values()) {
    if (stream.id.startsWith(`${prefix}-`)) end(stream, errorKind);
  }
}

/** Number of streams not yet read to the end or cancelled. */
export function openCount() {
  return streams.size;
}
