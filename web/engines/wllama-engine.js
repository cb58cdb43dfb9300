/**
 * The wasm engine: llama.cpp compiled to WebAssembly through @wllama/wllama
 * (dist/vendor/wllama/), driven by napllm.browser.engines (Python).
 *
 * Rules (DESIGN.md "The data path", provider kind `wasm`)
 * - One Wllama instance (llama.cpp in its own worker) per loaded model key
 *   (model URL + load parameters). Concurrent loads of one key share one
 *   promise; a failed load is forgotten so the next request tries again.
 * - `loadModel()` resolves even when llama.cpp fails to read the file; the
 *   load is checked through `getLoadedContextInfo().success` (and a model
 *   without a vocabulary counts as a failure too).
 * - Download progress goes to the page through
 *   `napllmHost.engineProgress(connectionId, label, fraction)` (fraction 0..1,
 *   -1 when the load failed) when the page
 *   has that hook; otherwise one `napllmHost.notice` says the model is being
 *   loaded. Errors are classified into kinds (`download`, `load`, `context`,
 *   `inference`, `unknown`); the Python side turns a kind into a fixed
 *   message, so no engine text reaches a napplet.
 * - Every value crossing to Python is JSON text or a plain string: a chat
 *   stream is started with `startChat` (returns a stream id), read with
 *   `nextChunks(id)` and stopped with `abort(id)`, which aborts the wllama
 *   request through its AbortSignal (streams.js has the batch format).
 * - `deliveryDelayMs` hands chunks over one at a time, N ms apart (the
 *   Python side passes its engine's `delay_ms`, 0 in the product).
 */

import { Wllama, wasmPaths } from "../vendor/wllama/wllama.js";
import { forgetCachedModel, roomForModel } from "../js/storage.js";
import { loadingNotice, progress } from "./page.js";
import * as streams from "./streams.js";

/** key -> {promise: Promise<info>, wllama: Wllama|null} */
const models = new Map();

const quietLogger = {
  debug() {},
  log() {},
  warn() {},
  error(...args) {
    console.error("wllama:", ...args);
  },
};

/** The environment facts the Python side needs to pick load parameters. */
export function environment() {
  return JSON.stringify({
    crossOriginIsolated: globalThis.crossOriginIsolated === true,
    hardwareConcurrency: Number(navigator.hardwareConcurrency) || 1,
  });
}

function errorKind(error, stage) {
  const type = error && typeof error.type === "string" ? error.type : "";
  if (type === "kv_cache_full") return "context";
  if (type === "download_error") return "download";
  if (type === "load_error" || type === "version_mismatch") return "load";
  if (stage === "download") return "download";
  if (stage === "load") return "load";
  if (type === "inference_error") return "inference";
  return stage === "chat" ? "inference" : "unknown";
}

async function load(url, params, connectionId, label) {
  const absolute = new URL(url, document.baseURI);
  const sameOrigin = absolute.origin === location.origin;
  // wllama keeps its own copy (OPFS) besides the service worker's: two copies.
  if (!(await roomForModel(absolute.href, { copies: 2, connectionId }))) {
    progress(connectionId, `${label} does not fit in this browser's storage`, -1);
    return { wllama: null, info: { ok: false, kind: "storage" } };
  }
  const wllama = new Wllama(wasmPaths, { logger: quietLogger, suppressNativeLog: true });
  let stage = "download";
  let lastReport = 0;
  loadingNotice(`Loading the model of ${label}…`, connectionId);
  progress(connectionId, `Downloading ${label}`, 0);
  try {
    await wllama.loadModelFromUrl(absolute.href, {
      ...params,
      // Same-origin files are revalidated by the HTTP cache; only models
      // from elsewhere are kept in wllama's own (OPFS) cache.
      useCache: !sameOrigin,
      progressCallback: ({ loaded, total }) => {
        const now = performance.now();
        if (total > 0 && (now - lastReport > 100 || loaded >= total)) {
          lastReport = now;
          progress(connectionId, `Downloading ${label}`, Math.min(1, loaded / total));
        }
        if (total > 0 && loaded >= total) stage = "load";
      },
    });
    stage = "load";
    const info = wllama.getLoadedContextInfo();
    if (!info || info.success === false || !(info.n_vocab > 0)) {
      throw new Error("llama.cpp could not load the model");
    }
    progress(connectionId, `${label} is ready`, 1);
    return {
      wllama,
      info: {
        ok: true,
        threads: wllama.getNumThreads(),
        multithread: wllama.isMultithread(),
        nCtx: info.n_ctx,
        nVocab: info.n_vocab,
      },
    };
  } catch (error) {
    console.error("napllm wasm engine: the model could not be loaded", error);
    try {
      await wllama.exit();
    } catch {
      /* already gone */
    }
    await forgetModel(wllama, absolute.href);
    progress(connectionId, `${label} could not be loaded`, -1);
    return { wllama: null, info: { ok: false, kind: errorKind(error, stage) } };
  }
}

/**
 * After a failed load, remove `href` from every cache that may hold it
 * (wllama's own OPFS cache and the service worker's model cache), so a
 * bad or cut-off download is never served again: the next try downloads.
 */
async function forgetModel(wllama, href) {
  try {
    await wllama.cacheManager.delete(href);
  } catch {
    /* nothing cached */
  }
  await forgetCachedModel(href);
}

/**
 * Load (or reuse) the model for `key`. Resolves with JSON text:
 * `{"ok": true, "threads", "multithread", "nCtx", "nVocab"}` or
 * `{"ok": false, "kind"}`. Never rejects.
 */
export async function ensureModel(key, url, paramsJson, connectionId, label) {
  let entry = models.get(key);
  if (!entry) {
    entry = { wllama: null, promise: null };
    entry.promise = load(String(url), JSON.parse(String(paramsJson)), connectionId, label).then(
      (result) => {
        entry.info = { url: String(url), ...result.info };
        if (result.wllama) entry.wllama = result.wllama;
        else if (models.get(key) === entry) models.delete(key);
        return result.info;
      },
    );
    models.set(key, entry);
  }
  return JSON.stringify(await entry.promise);
}

/** Whether the model of `key` is loaded and ready (synchronous). */
export function isLoaded(key) {
  const entry = models.get(String(key));
  return Boolean(entry && entry.wllama);
}

/** JSON text: the loaded models with their threads and context (for the shell UI and tests). */
export function loadedModels() {
  return JSON.stringify([...models.values()].filter((e) => e.wllama).map((e) => e.info));
}

/** Unload the model of `key` (frees its worker and memory). */
export async function unloadModel(key) {
  const entry = models.get(key);
  models.delete(key);
  if (entry && entry.wllama) await entry.wllama.exit();
}

async function pump(wllama, body, stream) {
  let failure = null;
  try {
    const chunks = await wllama.createChatCompletion({
      ...body,
      stream: true,
      abortSignal: stream.controller.signal,
    });
    for await (const chunk of chunks) {
      if (stream.aborted) break;
      streams.push(stream, chunk);
    }
  } catch (error) {
    if (!stream.aborted) {
      console.error("napllm wasm engine: generation failed", error);
      failure = errorKind(error, "chat");
    }
  } finally {
    streams.end(stream, failure);
  }
}

/**
 * Start a streamed chat completion on the loaded model `key` with the
 * OpenAI chat body `bodyJson`; returns the stream id. Throws when the
 * model is not loaded (the Python side calls `ensureModel` first).
 */
export function startChat(key, bodyJson, deliveryDelayMs = 0) {
  const entry = models.get(key);
  if (!entry || !entry.wllama) throw new Error("model not loaded");
  const body = JSON.parse(String(bodyJson));
  const stream = streams.open("wasm", deliveryDelayMs);
  pump(entry.wllama, body, stream);
  return stream.id;
}

/** The chunks queued for stream `id` since the last call (see streams.js). */
export function nextChunks(id) {
  return streams.next(id);
}

/** Abort stream `id` (its wllama request stops at the next token) and forget it. */
export function abort(id) {
  return streams.cancel(id);
}

/** Streams still open (tests use it to prove cancelled streams are released). */
export function openStreams() {
  return streams.openCount();
}
