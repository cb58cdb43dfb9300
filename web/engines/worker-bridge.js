/**
 * The page side of every engine worker: one object that posts a worker (or
 * a MessagePort of one) its loads, chats and cancels, and turns its answers
 * into load results, progress reports and chunk streams (streams.js). The
 * wasm (wllama), onnx (transformers.js) and webllm (WebLLM) engines use it;
 * an engine's module keeps only what is its own (which worker, its load
 * arguments, its model bookkeeping, how its failures are named).
 *
 * Rules (docs/design.md, "Adding an engine")
 * - One protocol, plain data both ways. To the worker:
 *   `{op: "load", key, ...fields}`, `{op: "chat", id, body, ...fields}`
 *   (`body`: an OpenAI chat body), `{op: "cancel", id}`,
 *   `{op: "unload", key}`. From the worker:
 *   `{op: "progress", key, fraction, detail?}` (fraction 0..1; `detail`:
 *   bytes, speed, time left, download.js `describeProgress`),
 *   `{op: "loaded", key, info}` (`info`: `{ok: true, ...}` or
 *   `{ok: false, kind}`), `{op: "chunks", id, chunks: [JSON text, ...]}`
 *   and, once per chat, `{op: "end", id, chunks?: [JSON text, ...],
 *   kind?: text | null, error?: {name, message}}`.
 * - A chat's chunks go to its stream as JSON texts (the page only
 *   concatenates them); its end ends the stream with the failure kind the
 *   worker named, or the one `classify` gives for the worker's `error`
 *   (a worker that only reports the library's error), or none.
 * - Aborting a stream (streams.js `cancel`) posts `cancel` once. The chat
 *   stays known until its `end` arrives, so a caller that waits for the end
 *   (WebLLM drains a cancelled chat before the next one) is never left
 *   waiting; chunks that arrive after the abort are dropped by streams.js.
 * - Loads are keyed: concurrent loads of one key share one answer.
 * - A worker that fails (`error` event, or `fail()`) ends every open chat
 *   of this bridge with `inference` and answers every pending load
 *   `{ok: false, kind: "load"}`; then `onFailure` runs. Nothing of the
 *   worker's own error text reaches Python.
 * - A load is bounded in time (`loadIdleMs`, the engine host gives
 *   limits.js `WORKER_IDLE_MS`): when the worker sends nothing for it
 *   (no progress, no answer) for that long, the load answers
 *   `{ok: false, kind: "stalled"}` and the worker is ended as failed (a
 *   Worker is terminated), so no caller waits on it any longer.
 * - A chat never outlives its model: unloading a key (`unload`,
 *   `endChats`) or stopping the worker (`terminate`) first ends every
 *   open chat of that key (or of the worker) with `unloaded` and posts
 *   its `cancel`; the worker's own end, if it comes, is then ignored.
 */

import * as streams from "./streams.js";

/** The chunks queued for stream `id` since the last read (streams.js `next`): every engine's `nextChunks`. */
export function nextChunks(id) {
  return streams.next(id);
}

/**
 * Cancel stream `id` (streams.js `cancel`): the bridge that carries it
 * posts `cancel` to its worker. The `abort` of an engine whose worker
 * stops a chat itself.
 */
export function cancelChat(id) {
  return streams.cancel(id);
}

/** Streams not yet read to the end or cancelled: every engine's `openStreams`. */
export function openStreams() {
  return streams.openCount();
}

/** The words a progress report's `detail` adds to its label ("" without one). */
export function detailText(message) {
  return typeof message.detail === "string" && message.detail ? ` — ${message.detail}` : "";
}

export class WorkerBridge {
  /**
   * @param {Worker | MessagePort} target where loads and chats are posted.
   * @param {object} [options]
   * @param {(error: object) => string} [options.classify] the failure kind
   *   of an end's `error` (default `inference`).
   * @param {() => void} [options.onFailure] runs after the worker failed.
   * @param {number|null} [options.loadIdleMs] the most ms a load may go
   *   without a message from the worker (null: unbounded).
   */
  constructor(target, { classify = () => "inference", onFailure = () => {}, loadIdleMs = null } = {}) {
    this.target = target;
    this.classify = classify;
    this.onFailure = onFailure;
    this.loadIdleMs = loadIdleMs;
    /** stream id -> {stream, resolve}: chats posted and not ended. */
    this.chats = new Map();
    /** key -> {promise, resolve, onProgress}: loads posted and not answered. */
    this.loads = new Map();
    target.onmessage = (event) => this.receive(event.data);
    if (typeof Worker !== "undefined" && target instanceof Worker) {
      target.onerror = (event) => {
        console.error("napllm engine: the engine worker failed", event && event.message);
        this.fail();
      };
    }
  }

  /**
   * Load `key` with `fields` (the worker's load arguments); resolves with
   * the worker's `info`. `onProgress(fraction, detail)` gets its progress
   * reports (`detail`: " — ..." or "", see `detailText`). Never rejects.
   */
  load(key, fields, onProgress = () => {}) {
    key = String(key);
    const pending = this.loads.get(key);
    if (pending) return pending.promise;
    let resolve;
    const promise = new Promise((done) => {
      resolve = done;
    });
    const load = { promise, resolve, onProgress, timer: null };
    this.loads.set(key, load);
    this.watch(key, load);
    this.post({ ...fields, op: "load", key });
    return promise;
  }

  /** (Re)start the idle bound of `load` (module rules). */
  watch(key, load) {
    if (!Number.isFinite(this.loadIdleMs) || this.loadIdleMs === null) return;
    clearTimeout(load.timer);
    load.timer = setTimeout(() => {
      if (this.loads.get(key) !== load) return;
      console.error("napllm engine: the engine worker sent nothing while loading; ended");
      this.loads.delete(key);
      load.resolve({ ok: false, kind: "stalled" });
      if (typeof this.target.terminate === "function") this.target.terminate();
      this.fail();
    }, this.loadIdleMs);
  }

  /** End the open chats of `key` (module rules), then post `unload` for it. */
  unload(key) {
    this.endChats(key, "unloaded");
    this.post({ op: "unload", key: String(key) });
  }

  /**
   * End every open chat on the model `key` with the failure `kind` (the
   * model goes away under it) and post their cancels.
   */
  endChats(key, kind) {
    for (const [id, chat] of this.chats) {
      if (chat.key !== String(key)) continue;
      this.chats.delete(id);
      this.post({ op: "cancel", id });
      streams.end(chat.stream, kind);
      chat.resolve(kind);
    }
  }

  /**
   * Post the chat `body` for the open stream `stream` (streams.js `open`),
   * with the worker's own `fields`; resolves once the chat ended (its end
   * message, or the worker's failure). Aborting the stream posts `cancel`.
   */
  chat(stream, body, fields = {}) {
    const key = fields.key === undefined ? null : String(fields.key);
    const ended = new Promise((resolve) => this.chats.set(stream.id, { stream, resolve, key }));
    stream.controller.signal.addEventListener("abort", () => this.post({ op: "cancel", id: stream.id }), { once: true });
    this.post({ ...fields, op: "chat", id: stream.id, body });
    return ended;
  }

  /** Chats posted and not ended yet. */
  get openChats() {
    return this.chats.size;
  }

  post(message) {
    try {
      this.target.postMessage(message);
    } catch (error) {
      console.error("napllm engine: posting to the engine worker failed", error);
    }
  }

  /** One message of the worker (module rules). */
  receive(data) {
    if (!data || typeof data !== "object") return;
    if (data.op === "chunks" || data.op === "end") {
      const chat = this.chats.get(String(data.id));
      if (!chat) return;
      if (Array.isArray(data.chunks) && data.chunks.length > 0) streams.pushSerialized(chat.stream, data.chunks);
      if (data.op === "end") {
        this.chats.delete(chat.stream.id);
        const error = data.error && typeof data.error === "object" ? data.error : null;
        // A cancelled chat's end names no failure (streams.js would drop it anyway).
        let kind = null;
        if (!chat.stream.aborted) kind = typeof data.kind === "string" && data.kind ? data.kind : error ? this.classify(error) : null;
        streams.end(chat.stream, kind);
        chat.resolve(kind);
      }
    } else if (data.op === "progress") {
      const load = this.loads.get(String(data.key));
      if (load) {
        this.watch(String(data.key), load);
        load.onProgress(Number(data.fraction) || 0, detailText(data));
      }
    } else if (data.op === "loaded") {
      const load = this.loads.get(String(data.key));
      if (!load) return;
      clearTimeout(load.timer);
      this.loads.delete(String(data.key));
      load.resolve(data.info && typeof data.info === "object" ? data.info : { ok: false, kind: "load" });
    }
  }

  /** The worker is gone: end every chat and answer every load (module rules). */
  fail() {
    for (const load of this.loads.values()) {
      clearTimeout(load.timer);
      load.resolve({ ok: false, kind: "load" });
    }
    this.loads.clear();
    this.endAll("inference");
    this.onFailure();
  }

  /** End every open chat with `kind` (the worker was stopped or failed). */
  endAll(kind) {
    for (const chat of this.chats.values()) {
      streams.end(chat.stream, kind);
      chat.resolve(kind);
    }
    this.chats.clear();
  }

  /**
   * Stop the worker (a Worker target) and end its open chats with `kind`
   * (`unloaded` when its model was unloaded, `inference` when it failed).
   */
  terminate(kind = "inference") {
    if (typeof this.target.terminate === "function") this.target.terminate();
    this.endAll(kind);
  }
}
