/**
 * The webllm engine: @mlc-ai/web-llm (dist/vendor/web-llm/) on WebGPU, in a
 * Web Worker (webllm-worker.js), driven by napllm.providers.engine (Python,
 * spec providers/engine_webllm.py) through napllm.browser.engines.
 *
 * Rules (docs/design.md, "The data path" and "Known behaviours"; kind `webllm`)
 * - The web-llm bundle (6 MB) is loaded only on a device with a WebGPU
 *   adapter; without one, the model records come from
 *   `vendor/web-llm/catalog.json`, which build.py extracts from the bundle.
 * - `catalog()` reports, as JSON text, what WebGPU offers (`gpu`: adapter,
 *   features, buffer limits, fallback adapter, `navigator.deviceMemory`, or
 *   why there is no adapter: `no-webgpu`, `no-adapter`, `timeout`),
 *   WebLLM's prebuilt model records (`records`), its function-calling model
 *   ids, the records of models shipped in dist/ (`bundled`: TinyChat) and
 *   which recommended models are already in the browser cache. The
 *   Python side decides availability and capabilities from that data.
 * - Engines get WebLLM's `appConfig`: its prebuilt records plus the bundled
 *   ones, whose relative URLs are resolved against the shell's folder (no
 *   model host). WebLLM then loads, caches and runs them like any other.
 * - One engine (one worker, one model) at a time: loading another model
 *   unloads the previous one, which frees the GPU memory. Concurrent loads
 *   of one model share one promise; a failed load is forgotten.
 * - Load progress goes to `napllmHost.engineProgress(connectionId, label,
 *   fraction)` when the page has it (WebLLM's `initProgressCallback`),
 *   otherwise one `napllmHost.notice` says the model is being loaded.
 * - Requests run one at a time per engine (WebLLM holds one generation
 *   lock). Cancel is per request: `interruptGenerate()` is called only while
 *   the cancelled request is the one generating, and the cancelled stream is
 *   drained to its end before the next request starts, because an
 *   interrupted stream keeps the engine's lock until it is read out
 *   (mlc-ai/web-llm #447).
 * - Errors become kinds (`webgpu`, `feature`, `network`, `download` (a
 *   model file over its byte ceiling, webllm-worker.js), `storage`,
 *   `context`, `inference`, `unknown`); the engine's own text never leaves
 *   this module except in the console.
 * - Streams are read from Python through streams.js (JSON text batches).
 *   WebLLM's page-side stream would pull one chunk per round trip to its
 *   worker (the engine waiting for the page between tokens), so a chat runs
 *   whole in our worker instead (webllm-worker.js, on a MessagePort of its
 *   own, reached through worker-bridge.js as every engine worker is), which
 *   posts the chunks in batches as wllama's worker does (batcher.js). An engine that is not WebLLM's worker client (a test
 *   build's double) is read chunk by chunk on the page, as before.
 * - Engines are created only through the bundle's `CreateWebWorkerMLCEngine`
 *   (the one place a test build substitutes a double; nothing here knows).
 */

import { requestPersistentStorage } from "../js/storage.js";
import { isFallback, requestAdapter, vendorOf } from "./gpu.js";
import { loadingNotice, progress } from "./page.js";
import * as streams from "./streams.js";
import { WorkerBridge } from "./worker-bridge.js";

const RECOMMENDED_PREFIXES = [
  "SmolLM2-360M-Instruct",
  "Qwen2.5-0.5B-Instruct",
  "Llama-3.2-1B-Instruct",
  "Hermes-3-Llama-3.1-8B",
  "Phi-3.5-vision-instruct",
];

let webllmModule = null;
async function webllm() {
  if (!webllmModule) webllmModule = import("../vendor/web-llm/web-llm.js");
  return webllmModule;
}

async function probeGpu() {
  const memory = Number(navigator.deviceMemory) || null;
  const { adapter, reason } = await requestAdapter({ powerPreference: "high-performance" });
  if (!adapter) return { adapter: false, reason, deviceMemory: memory };
  return {
    adapter: true,
    features: [...adapter.features],
    maxBufferSize: Number(adapter.limits.maxBufferSize) || 0,
    maxStorageBufferBindingSize: Number(adapter.limits.maxStorageBufferBindingSize) || 0,
    fallback: isFallback(adapter),
    vendor: vendorOf(adapter),
    deviceMemory: memory,
  };
}

let catalogData = null;
/** vendor/web-llm/catalog.json, read once (a failed read is tried again). */
async function catalogFile() {
  if (!catalogData) {
    catalogData = fetch(new URL("../vendor/web-llm/catalog.json", import.meta.url))
      .then((response) => response.json())
      .catch((error) => {
        catalogData = null;
        throw error;
      });
  }
  return catalogData;
}

/**
 * The model records shipped in dist/ (catalog.json `bundled`, written by
 * build.py) with their `model` and `model_lib` resolved against the shell's
 * folder, so WebLLM fetches them from this origin under any sub-path.
 */
async function bundledRecords() {
  const data = await catalogFile();
  const root = new URL("../", import.meta.url);
  return (Array.isArray(data.bundled) ? data.bundled : []).map((record) => ({
    ...record,
    model: new URL(String(record.model), root).href,
    model_lib: new URL(String(record.model_lib), root).href,
  }));
}

/** WebLLM's app config: its prebuilt records plus the bundled ones. */
async function appConfig(lib) {
  const prebuilt = lib.prebuiltAppConfig || { model_list: [] };
  return { ...prebuilt, model_list: [...(prebuilt.model_list || []), ...(await bundledRecords())] };
}

/**
 * Where WebLLM reads the files of `modelId`, without loading its bundle
 * (the build-time catalogue's records and the bundled ones): `{config,
 * folder, library}` (absolute URLs: `mlc-chat-config.json`, the folder of
 * the tokenizer, `tensor-cache.json` and the parameter shards, the model
 * library), or null for an unknown id, a record with a model manifest
 * (whose file names the manifest sets) or a model library WebLLM does not
 * cache (on `localhost`, or relative). Never rejects.
 */
export async function modelRecordFiles(modelId) {
  try {
    const data = await catalogFile();
    const records = [...(Array.isArray(data.records) ? data.records : []), ...(await bundledRecords())];
    const record = records.find((r) => r && r.model_id === String(modelId));
    if (!record || record.model_manifest !== undefined || typeof record.model_lib !== "string") return null;
    if (!record.model_lib.startsWith("http") || record.model_lib.includes("localhost")) return null;
    const folder = modelFolder(record.model);
    return { config: new URL("mlc-chat-config.json", folder).href, folder, library: new URL(record.model_lib).href };
  } catch {
    return null;
  }
}

/**
 * WebGPU facts and WebLLM's model catalogue, as JSON text (module rules).
 * The records come from the build-time catalogue (the fields build.py
 * extracts from the bundle); the bundle itself is loaded only on a device
 * with an adapter, to see which recommended models are already cached.
 */
export async function catalog() {
  const gpu = await probeGpu();
  const data = await catalogFile();
  const records = Array.isArray(data.records) ? data.records : [];
  const cached = [];
  if (gpu.adapter) {
    const lib = await webllm();
    for (const record of records) {
      if (!RECOMMENDED_PREFIXES.some((prefix) => record.model_id.startsWith(prefix))) continue;
      try {
        if (await lib.hasModelInCache(record.model_id)) cached.push(record.model_id);
      } catch {
        /* no cache access: not cached */
      }
    }
  }
  return JSON.stringify({
    gpu,
    records,
    functionCallingIds: Array.isArray(data.functionCallingIds) ? data.functionCallingIds : [],
    cached,
    bundled: Array.isArray(data.bundled) ? data.bundled : [],
  });
}

function errorKind(error) {
  // Errors from the worker may arrive as plain strings ("TypeError: Failed to fetch").
  const name = String((error && typeof error === "object" && (error.name || error.constructor?.name)) || "");
  const text = typeof error === "string" ? error : String((error && error.message) || "");
  // A model file over its ceiling (webllm-worker.js, bounded.js): a bad download.
  if (name === "DownloadTooLarge" || text.includes("DownloadTooLarge")) return "download";
  // A shard that failed download.js's checks (no model file, cut for good).
  if (name === "NotAModel" || text.includes("NotAModel")) return "download";
  if (name === "WebGPUNotAvailableError" || text.includes("compatible GPU")) return "webgpu";
  if (name === "ShaderF16SupportError" || name === "FeatureSupportError") return "feature";
  if (name === "QuotaExceededError" || text.includes("Quota")) return "storage";
  if (name === "ContextWindowSizeExceededError" || text.includes("context window")) return "context";
  if (name === "TypeError" && /fetch|network|Cache/i.test(text)) return "network";
  if (/fetch|network/i.test(text)) return "network";
  return "unknown";
}

/** The engine in use: {modelId, promise, engine, bridge, chain, active}. */
let current = null;

async function createEngine(modelId, connectionId, label) {
  const initProgressCallback = (report) => {
    const fraction = Number(report && report.progress);
    progress(connectionId, `Loading ${label}`, Number.isFinite(fraction) ? fraction : 0);
  };
  const lib = await webllm();
  // Weights of hundreds of MB: ask the browser not to evict them under pressure.
  requestPersistentStorage();
  const worker = new Worker(new URL("./webllm-worker.js", import.meta.url), { type: "module" });
  let engine;
  try {
    engine = await lib.CreateWebWorkerMLCEngine(worker, modelId, {
      initProgressCallback,
      appConfig: await appConfig(lib),
    });
  } catch (error) {
    worker.terminate();
    throw error;
  }
  let port = null;
  if (engine instanceof lib.WebWorkerMLCEngine) {
    const channel = new MessageChannel();
    worker.postMessage({ kind: "napllmPort" }, [channel.port2]);
    port = channel.port1;
  }
  return { engine, port };
}

/**
 * The failure kind of a chat's error, as its worker reported it
 * (`{name, message}`): an unknown one is an `inference` failure.
 */
function chatFailure(error) {
  console.error("napllm webllm engine: generation failed", error);
  const kind = errorKind(error);
  return kind === "unknown" ? "inference" : kind;
}

/** Cache Storage caches WebLLM keeps model files in (its cache scopes). */
const WEBLLM_CACHES = "webllm/";

/**
 * The folder URL WebLLM reads a model record's files from: the record's
 * `model` with a trailing slash and, for a bare repository URL,
 * `resolve/main/` (the same rule as WebLLM's own `cleanModelUrl`).
 */
function modelFolder(url) {
  let folder = String(url);
  if (!folder.endsWith("/")) folder += "/";
  if (!/.+\/resolve\/.+\//.test(folder)) folder += "resolve/main/";
  return new URL(folder).href;
}

/**
 * After a failed load, remove the model's files from WebLLM's caches (a
 * bad or partial download is then fetched again next time): every entry
 * under the model's folder, and its model library, in every `webllm/`
 * cache. Not WebLLM's `deleteModelAllInfoInCache`: it first reads the
 * cached `tensor-cache.json` (downloading it when missing) and stops at
 * its first failure, so a fallback page kept as that file kept everything
 * else too. Not when the device lacks WebGPU or a feature: the download was
 * not the problem. Resolves with the number of entries removed; never rejects.
 */
async function forgetModelFiles(modelId, kind) {
  if (kind === "webgpu" || kind === "feature" || !("caches" in globalThis)) return 0;
  let removed = 0;
  try {
    const lib = await webllm();
    const records = (await appConfig(lib)).model_list;
    const record = records.find((r) => r && r.model_id === String(modelId));
    if (!record) return 0;
    const folder = modelFolder(record.model);
    const library = record.model_lib ? new URL(String(record.model_lib)).href : null;
    for (const name of await caches.keys()) {
      if (!name.startsWith(WEBLLM_CACHES)) continue;
      const cache = await caches.open(name);
      for (const request of await cache.keys()) {
        if (request.url.startsWith(folder) || request.url === library) {
          if (await cache.delete(request)) removed += 1;
        }
      }
    }
  } catch (error) {
    console.error("napllm webllm engine: could not clear cached model files", error);
  }
  return removed;
}

/**
 * Load (or reuse) the engine for `modelId`. Resolves with JSON text
 * `{"ok": true}` or `{"ok": false, "kind"}`; never rejects.
 */
export async function ensureEngine(modelId, connectionId, label) {
  modelId = String(modelId);
  if (!current || current.modelId !== modelId) {
    const previous = current;
    const entry = {
      modelId,
      engine: null,
      bridge: null,
      chain: Promise.resolve(),
      active: null,
      promise: null,
    };
    current = entry;
    entry.promise = (async () => {
      if (previous && previous.engine) {
        try {
          await previous.engine.unload();
        } catch {
          /* already gone */
        }
      }
      loadingNotice(`Loading the model of ${label}…`, connectionId);
      progress(connectionId, `Loading ${label}`, 0);
      try {
        const created = await createEngine(modelId, connectionId, String(label));
        entry.engine = created.engine;
        if (created.port) entry.bridge = new WorkerBridge(created.port, { classify: chatFailure });
        progress(connectionId, `${label} is ready`, 1);
        return { ok: true };
      } catch (error) {
        console.error("napllm webllm engine: the model could not be loaded", error);
        if (current === entry) current = null;
        progress(connectionId, `${label} could not be loaded`, -1);
        const kind = errorKind(error);
        await forgetModelFiles(modelId, kind);
        return { ok: false, kind };
      }
    })();
  }
  return JSON.stringify(await current.promise);
}

async function run(entry, body, stream) {
  let failure = null;
  let chunks = null;
  try {
    if (stream.aborted) return;
    entry.active = stream;
    if (entry.bridge) {
      // The worker reads the chat to its end, after a cancel too (mlc-ai/web-llm #447);
      // the bridge ends the stream, with the failure kind of the worker's error.
      await entry.bridge.chat(stream, body);
      return;
    }
    chunks = await entry.engine.chat.completions.create(body);
    for await (const chunk of chunks) {
      // After a cancel the stream is still read to its end (mlc-ai/web-llm #447).
      streams.push(stream, chunk);
    }
  } catch (error) {
    if (!stream.aborted) {
      console.error("napllm webllm engine: generation failed", error);
      failure = errorKind(error);
      if (failure === "unknown") failure = "inference";
    }
  } finally {
    if (entry.active === stream) entry.active = null;
    streams.end(stream, failure);
  }
}

/**
 * Start a streamed chat completion with body `bodyJson` on the loaded
 * engine of `modelId`; returns the stream id. Requests queue behind the
 * one generating (module rules).
 */
export function startChat(modelId, bodyJson, deliveryDelayMs = 0) {
  const entry = current;
  if (!entry || entry.modelId !== String(modelId) || !entry.engine) throw new Error("model not loaded");
  const body = JSON.parse(String(bodyJson));
  const stream = streams.open("webllm", deliveryDelayMs);
  stream.entry = entry;
  entry.chain = entry.chain.then(() => run(entry, body, stream));
  return stream.id;
}

export { nextChunks, openStreams } from "./worker-bridge.js";

/** Cancel stream `id`: interrupt it only if it is the one generating. */
export function abort(id) {
  const entry = current;
  const active = entry && entry.active && entry.active.id === String(id) ? entry.active : null;
  const found = streams.cancel(id);
  if (active && entry.engine && typeof entry.engine.interruptGenerate === "function") {
    try {
      entry.engine.interruptGenerate();
    } catch {
      /* the stream ends on its own */
    }
  }
  return found;
}
