/**
 * The onnx engine: ONNX chat models run by @huggingface/transformers
 * (onnxruntime-web) on WebGPU, each in its own worker
 * (transformers-worker.js), driven by napllm.providers.engine (Python, spec
 * providers/engine_onnx.py) through napllm.browser.engines.
 *
 * Rules
 * - `probe()` says whether WebGPU gives an adapter, without loading the
 *   library: the transformers.js bundle and onnxruntime's wasm (27 MB) are
 *   fetched only by a worker, only when a model is first used, so a first
 *   visit does not grow; the service worker keeps them from then on, so the
 *   engine works offline after its first use (web/sw-napllm.js).
 * - One worker per model key (source + device + dtype). Concurrent loads of
 *   one key share one promise; a failed load terminates its worker and is
 *   forgotten, so the next request tries again, in a new worker that fetches
 *   every file afresh (`fresh`; the worker has already removed the model's
 *   files from the library's cache).
 * - Load progress goes to `napllmHost.engineProgress` (page.js).
 * - Chat streams are read from Python through streams.js (JSON text batches):
 *   `startChat` returns a stream id, `nextChunks(id)` reads, `abort(id)`
 *   cancels (the worker interrupts the generation and stays usable). Each
 *   worker is reached through worker-bridge.js (its protocol).
 * - Errors arrive from the worker as kinds; no library text reaches Python.
 * - `deliveryDelayMs` (test mode only, set by the Python side) hands chunks
 *   over one at a time, N ms apart.
 */

import { isFallback, requestAdapter, vendorOf } from "./gpu.js";
import { loadingNotice, progress } from "./page.js";
import * as streams from "./streams.js";
import { WorkerBridge, cancelChat } from "./worker-bridge.js";

/** key -> {bridge, promise, info} */
const models = new Map();

let probed = null;

/** Keys whose last load failed: their next load fetches every file afresh. */
const failed = new Set();

/**
 * JSON text `{"webgpu": bool, "reason"?: "no-webgpu"|"no-adapter"|"timeout",
 * "fallback"?: bool, "vendor"?: text}` (cached after the first call).
 */
export async function probe() {
  if (!probed) {
    probed = (async () => {
      const { adapter, reason } = await requestAdapter();
      if (!adapter) return { webgpu: false, reason };
      return { webgpu: true, fallback: isFallback(adapter), vendor: vendorOf(adapter) };
    })();
  }
  return JSON.stringify(await probed);
}

/**
 * Load (or reuse) the model of `key`. `sourceJson`: `{"kind": "path",
 * "base", "model"}` or `{"kind": "hub", "model"}` (see the worker);
 * `device`: `webgpu` or `wasm`; `dtype`: a transformers.js dtype or "".
 * Resolves with JSON text `{"ok": true, "device", "contextSize"}` or
 * `{"ok": false, "kind"}`; never rejects.
 */
export async function ensureModel(key, sourceJson, device, dtype, connectionId, label) {
  key = String(key);
  let entry = models.get(key);
  if (!entry) {
    const worker = new Worker(new URL("./transformers-worker.js", import.meta.url), { type: "module" });
    entry = { bridge: new WorkerBridge(worker), promise: null, info: null };
    models.set(key, entry);
    const source = JSON.parse(String(sourceJson));
    if (source.kind === "path") source.base = new URL(String(source.base), document.baseURI).href;
    label = String(label);
    loadingNotice(`Loading the model of ${label}…`, connectionId);
    progress(connectionId, `Loading ${label}`, 0);
    const fields = { source, device: String(device), dtype: String(dtype || ""), fresh: failed.has(key) };
    const onProgress = (fraction, detail) => progress(connectionId, `Loading ${label}${detail}`, fraction);
    entry.promise = entry.bridge.load(key, fields, onProgress).then((result) => {
      if (result.ok) {
        failed.delete(key);
        entry.info = { key, device: result.device, contextSize: result.contextSize };
        progress(connectionId, `${label} is ready`, 1);
        return { ok: true, device: result.device, contextSize: result.contextSize };
      }
      failed.add(key);
      entry.bridge.terminate();
      if (models.get(key) === entry) models.delete(key);
      progress(connectionId, `${label} could not be loaded`, -1);
      return { ok: false, kind: String(result.kind || "load") };
    });
  }
  return JSON.stringify(await entry.promise);
}

/**
 * The files the model of `source` (`{kind: "path", base, model}` or
 * `{kind: "hub", model}`; a relative `base` is read against the page)
 * needs on `device` with `dtype` ("" for the model's default), listed by
 * a worker of its own that loads no model (no WebGPU needed), then ends.
 * Resolves with `{urls, cache, engine}` (the worker's `files` message) or
 * null when they cannot be listed (within `timeoutMs`); never rejects.
 */
export function modelFileList(source, device = "webgpu", dtype = "", timeoutMs = 60_000) {
  return new Promise((resolve) => {
    let worker;
    try {
      worker = new Worker(new URL("./transformers-worker.js", import.meta.url), { type: "module" });
    } catch {
      resolve(null);
      return;
    }
    const finish = (value) => {
      clearTimeout(timer);
      worker.terminate();
      resolve(value);
    };
    const timer = setTimeout(() => finish(null), timeoutMs);
    worker.onmessage = ({ data }) => {
      if (!data || data.op !== "files") return;
      const ok = data.ok === true && Array.isArray(data.urls) && Array.isArray(data.engine);
      finish(ok ? { urls: data.urls.map(String), cache: data.cache ? String(data.cache) : null, engine: data.engine.map(String) } : null);
    };
    worker.onerror = () => finish(null);
    const copy = { ...source };
    if (copy.kind === "path") copy.base = new URL(String(copy.base), document.baseURI).href;
    worker.postMessage({ op: "files", source: copy, device: String(device), dtype: String(dtype || "") });
  });
}

/** Whether the model of `key` is loaded and ready (synchronous). */
export function isLoaded(key) {
  const entry = models.get(String(key));
  return Boolean(entry && entry.info);
}

/** JSON text: the loaded models (key, device, context size). */
export function loadedModels() {
  return JSON.stringify([...models.values()].filter((e) => e.info).map((e) => e.info));
}

/** Unload the model of `key` (terminates its worker; open streams end as failed). */
export function unloadModel(key) {
  const entry = models.get(String(key));
  models.delete(String(key));
  if (entry) entry.bridge.terminate();
}

/**
 * Start a streamed chat completion with the OpenAI chat body `bodyJson` on
 * the loaded model `key`; returns the stream id. Throws when the model is
 * not loaded (the Python side calls `ensureModel` first).
 */
export function startChat(key, bodyJson, deliveryDelayMs = 0) {
  const entry = models.get(String(key));
  if (!entry || !entry.info) throw new Error("model not loaded");
  const body = JSON.parse(String(bodyJson));
  const stream = streams.open("onnx", deliveryDelayMs);
  entry.bridge.chat(stream, body);
  return stream.id;
}

export { nextChunks, openStreams } from "./worker-bridge.js";

/** Cancel stream `id`: the worker interrupts (or skips) its generation (worker-bridge.js posts the cancel). */
export const abort = cancelChat;
