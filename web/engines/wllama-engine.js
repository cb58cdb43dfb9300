/**
 * The wasm engine: llama.cpp compiled to WebAssembly through @wllama/wllama
 * (dist/vendor/wllama/), driven by napllm.providers.engine (Python, spec
 * providers/engine_wasm.py) through napllm.browser.engines.
 *
 * Rules (docs/design.md, "The data path", kind `wasm`; README, "Design
 * note: generation off the main thread")
 * - wllama lives in one dedicated worker of ours (wllama-worker.js), which
 *   runs each whole chat completion and posts its chunks in batches (the
 *   first text at once, then one batch per 32 ms: batcher.js); the
 *   page's main thread only queues them (streams.js) until Python reads
 *   them, so the token loop never waits for Python or for the page. The
 *   worker is started on the first load and kept.
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
 *   `nextChunks(id)` and stopped with `abort(id)`, which tells the worker to
 *   abort the wllama request through its AbortSignal (streams.js has the
 *   batch format). The worker is reached through worker-bridge.js (its
 *   protocol): a worker that dies ends every open stream with the kind
 *   `inference` and every pending load with `load`.
 * - `deliveryDelayMs` hands chunks over one at a time, N ms apart (the
 *   Python side passes its engine's `delay_ms`, 0 in the product).
 * - Before a download the model must fit in the browser's storage (one
 *   copy: the service worker's model cache; the worker downloads and checks
 *   the file itself and hands it to wllama, which keeps no copy of its own);
 *   a model that fails to load is removed from the shell's model cache here
 *   and from wllama's (OPFS) cache in the worker, so the next try downloads
 *   it again. A failed load also drops the worker's state for that key.
 */

import { forgetCachedModel, roomForModel } from "../js/storage.js";
import { loadingNotice, progress } from "./page.js";
import * as streams from "./streams.js";
import { WorkerBridge, cancelChat } from "./worker-bridge.js";

/** key -> {promise: Promise<info>, loaded: bool, info, connectionId, label} */
const models = new Map();
/** The bridge to the engine worker, or null before the first load or after it failed. */
let bridge = null;

/** The environment facts the Python side needs to pick load parameters. */
export function environment() {
  return JSON.stringify({
    crossOriginIsolated: globalThis.crossOriginIsolated === true,
    hardwareConcurrency: Number(navigator.hardwareConcurrency) || 1,
  });
}

/** The worker is gone: its loaded models with it (pending loads and open streams are ended by the bridge). */
function onWorkerFailure() {
  bridge = null;
  for (const [key, entry] of models) {
    if (entry.loaded) models.delete(key);
  }
}

function engineWorker() {
  if (!bridge) {
    const worker = new Worker(new URL("./wllama-worker.js", import.meta.url), { type: "module" });
    bridge = new WorkerBridge(worker, { onFailure: onWorkerFailure });
  }
  return bridge;
}

async function load(key, url, params, entry) {
  const absolute = new URL(url, document.baseURI);
  const label = entry.label;
  // One copy is kept: the service worker's (the worker downloads the file
  // itself, so wllama keeps none of its own).
  if (!(await roomForModel(absolute.href, { copies: 1, connectionId: entry.connectionId }))) {
    progress(entry.connectionId, `${label} does not fit in this browser's storage`, -1);
    return { ok: false, kind: "storage" };
  }
  loadingNotice(`Loading the model of ${label}…`, entry.connectionId);
  progress(entry.connectionId, `Downloading ${label}`, 0);
  const info = await engineWorker().load(key, { url: absolute.href, params }, (fraction, detail) =>
    progress(entry.connectionId, `Downloading ${label}${detail}`, fraction),
  );
  if (info && info.ok === true) {
    progress(entry.connectionId, `${label} is ready`, 1);
    return info;
  }
  progress(entry.connectionId, `${label} could not be loaded`, -1);
  await forgetCachedModel(absolute.href);
  return { ok: false, kind: (info && info.kind) || "load" };
}

/**
 * Load (or reuse) the model for `key`. Resolves with JSON text:
 * `{"ok": true, "threads", "multithread", "nCtx", "nVocab"}` or
 * `{"ok": false, "kind"}`. Never rejects.
 */
export async function ensureModel(key, url, paramsJson, connectionId, label) {
  key = String(key);
  let entry = models.get(key);
  if (!entry) {
    entry = { loaded: false, promise: null, connectionId: String(connectionId), label };
    models.set(key, entry);
    entry.promise = load(key, String(url), JSON.parse(String(paramsJson)), entry).then(
      (info) => {
        entry.info = { url: String(url), ...info };
        if (info.ok) entry.loaded = true;
        else if (models.get(key) === entry) models.delete(key);
        return info;
      },
    );
  }
  return JSON.stringify(await entry.promise);
}

/** Whether the model of `key` is loaded and ready (synchronous). */
export function isLoaded(key) {
  const entry = models.get(String(key));
  return Boolean(entry && entry.loaded);
}

/** JSON text: the loaded models with their threads and context (for the shell UI and tests). */
export function loadedModels() {
  return JSON.stringify([...models.values()].filter((e) => e.loaded).map((e) => e.info));
}

/** Unload the model of `key` (frees its llama.cpp worker and memory). */
export async function unloadModel(key) {
  const entry = models.get(String(key));
  models.delete(String(key));
  if (entry && entry.loaded && bridge) bridge.unload(key);
}

/**
 * Start a streamed chat completion on the loaded model `key` with the
 * OpenAI chat body `bodyJson`; returns the stream id. Throws when the
 * model is not loaded (the Python side calls `ensureModel` first).
 */
export function startChat(key, bodyJson, deliveryDelayMs = 0) {
  const entry = models.get(String(key));
  if (!entry || !entry.loaded || !bridge) throw new Error("model not loaded");
  const body = JSON.parse(String(bodyJson));
  const stream = streams.open("wasm", deliveryDelayMs);
  // With a delivery delay the page hands chunks over one by one, so the
  // worker keeps them apart (batcher.js `merge`).
  bridge.chat(stream, body, { key: String(key), merge: stream.delayMs === 0 });
  return stream.id;
}

export { nextChunks, openStreams } from "./worker-bridge.js";

/** Abort stream `id` (the worker stops its wllama request at the next token) and forget it. */
export const abort = cancelChat;
