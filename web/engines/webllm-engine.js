/**
 * The webllm engine's page adapter: what the engine host (engine-host.js)
 * cannot do from data alone for @mlc-ai/web-llm (dist/vendor/web-llm/) on
 * WebGPU. Everything else (model bookkeeping, one model at a time,
 * progress, chats, streams, cancel) is the host's, as for every engine;
 * the spec is providers/engine_webllm.py, its worker webllm-worker.js.
 *
 * Why WebLLM keeps a page part (docs/design.md, "Adding an engine"):
 * WebLLM's worker is driven by WebLLM's own page-side client
 * (`CreateWebWorkerMLCEngine`), which must run on the page; it is the one
 * place a test build substitutes a double. Its catalogue report reads the
 * build-time catalogue and, on a device with an adapter, WebLLM's cache
 * through the bundle (which a worker could only do by starting WebLLM), and
 * offline-webllm.js reads the record files of a model here without the bundle.
 *
 * Rules (docs/design.md, "The data path" and "Known behaviours"; kind `webllm`)
 * - The web-llm bundle (6 MB) is loaded only on a device with a WebGPU
 *   adapter; without one, the model records come from
 *   `vendor/web-llm/catalog.json`, which build.py extracts from the bundle.
 * - `report()` reports, as JSON text, what WebGPU offers (`gpu`: adapter,
 *   features, buffer limits, fallback adapter, `navigator.deviceMemory`, or
 *   why there is no adapter: `no-webgpu`, `no-adapter`, `timeout`),
 *   WebLLM's prebuilt model records (`records`), its function-calling model
 *   ids, the records of models shipped in dist/ (`bundled`: TinyChat) and
 *   which recommended models are already in the browser cache. The
 *   Python side decides availability and capabilities from that data.
 * - Engines get WebLLM's `appConfig`: its prebuilt records plus the bundled
 *   ones, whose relative URLs are resolved against the shell's folder (no
 *   model host). WebLLM then loads, caches and runs them like any other.
 * - `connect(modelId, fields, onProgress)` starts a worker through
 *   `CreateWebWorkerMLCEngine` (load progress from its
 *   `initProgressCallback`) and hands the host a MessagePort that speaks
 *   the engine-worker protocol's chats (chat-queue.js): WebLLM's page-side
 *   stream would pull one chunk per round trip to its worker (the engine
 *   waiting for the page between tokens), so a chat runs whole in our
 *   worker instead, which posts the chunks in batches (batcher.js). An
 *   engine that is not WebLLM's worker client (a test build's double) is
 *   served on the page by the same chat queue, read chunk by chunk.
 * - Requests run one at a time per engine (WebLLM holds one generation
 *   lock); a cancel interrupts only the chat generating, which is then read
 *   to its end (mlc-ai/web-llm #447; chat-queue.js).
 * - `connect` is bounded: `WORKER_IDLE_MS` (limits.js) without a progress
 *   report from WebLLM ends the load (its worker terminated) as `stalled`.
 * - Errors become kinds (`webgpu`, `feature`, `network`, `download` (a
 *   model file over its byte ceiling, webllm-worker.js), `stalled`, `storage`,
 *   `context`, `inference`, `unknown`): `failureKind` for a load,
 *   `classify` for a chat; the engine's own text never leaves this module
 *   except in the console. After a failed load `forget` removes the
 *   model's files from WebLLM's caches.
 */

import { requestPersistentStorage } from "./room.js";
import { isFallback, requestAdapter, vendorOf } from "./gpu.js";
import { serveChats } from "./chat-queue.js";
import { WORKER_IDLE_MS } from "./limits.js";

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
export async function report() {
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
  // No sign of life from WebLLM's worker while it loads (`connect`).
  if (name === "EngineStalled") return "stalled";
  // A model file over its ceiling (webllm-worker.js, bounded.js): a bad download.
  if (name === "DownloadTooLarge" || text.includes("DownloadTooLarge")) return "download";
  // A shard that failed download.js's checks (no model file, cut for good).
  if (name === "NotAModel" || text.includes("NotAModel")) return "download";
  // download.js's other failures: no room left, or the tries spent on cuts, stalls, restarts.
  if (name === "DownloadNoRoom" || text.includes("DownloadNoRoom")) return "storage";
  if (/^Download(Interrupted|Restarted|Stalled)$/.test(name) || /Download(Interrupted|Restarted|Stalled)/.test(text)) return "download";
  if (name === "WebGPUNotAvailableError" || text.includes("compatible GPU")) return "webgpu";
  if (name === "ShaderF16SupportError" || name === "FeatureSupportError") return "feature";
  if (name === "QuotaExceededError" || text.includes("Quota")) return "storage";
  if (name === "ContextWindowSizeExceededError" || text.includes("context window")) return "context";
  if (name === "TypeError" && /fetch|network|Cache/i.test(text)) return "network";
  if (/fetch|network/i.test(text)) return "network";
  return "unknown";
}

/** How long `close` waits for WebLLM to unload before it ends the worker anyway, in ms. */
export const UNLOAD_WAIT_MS = 5000;

/**
 * Start WebLLM's worker on `modelId` through WebLLM's own page-side client
 * (`CreateWebWorkerMLCEngine`; a test build substitutes a double there) and
 * open the port our chats run on (module rules). `onProgress(fraction)`
 * gets WebLLM's load progress; `onFailure()` runs when the worker fails
 * after the load (it is ended: the chats on the port get their end from the
 * host). Resolves with `{target, close()}` (the engine host's adapter
 * interface, engine-host.js); rejects with WebLLM's error. `close()` asks
 * WebLLM to unload (at most `UNLOAD_WAIT_MS`), then ends the worker.
 */
export async function connect(modelId, fields, onProgress, onFailure = () => {}) {
  // The load is bounded: WORKER_IDLE_MS without a progress report ends it.
  let stall = () => {};
  let timer = null;
  const stalled = new Promise((resolve, reject) => {
    stall = () => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        const error = new Error("WebLLM's worker sent nothing while loading");
        error.name = "EngineStalled";
        reject(error);
      }, WORKER_IDLE_MS);
    };
  });
  stalled.catch(() => {});
  const initProgressCallback = (report) => {
    stall();
    const fraction = Number(report && report.progress);
    onProgress(Number.isFinite(fraction) ? fraction : 0);
  };
  const lib = await webllm();
  // Weights of hundreds of MB: ask the browser not to evict them under pressure.
  requestPersistentStorage();
  const worker = new Worker(new URL("./webllm-worker.js", import.meta.url), { type: "module" });
  let engine;
  try {
    const config = await appConfig(lib);
    stall();
    engine = await Promise.race([
      lib.CreateWebWorkerMLCEngine(worker, String(modelId), { initProgressCallback, appConfig: config }),
      stalled,
    ]);
  } catch (error) {
    worker.terminate();
    throw error;
  } finally {
    clearTimeout(timer);
    stall = () => {};
  }
  const channel = new MessageChannel();
  worker.addEventListener("error", (event) => {
    console.error("napllm webllm engine: the engine worker failed", event && event.message);
    worker.terminate();
    onFailure();
  });
  if (engine instanceof lib.WebWorkerMLCEngine) {
    worker.postMessage({ kind: "napllmPort" }, [channel.port2]);
  } else {
    // Not WebLLM's worker client (a test build's double): its chats run here, read chunk by chunk.
    serveChats(channel.port2, {
      run: async (body, post) => {
        for await (const chunk of await engine.chat.completions.create(body)) post({ op: "chunks", chunks: [JSON.stringify(chunk)] });
        return [];
      },
      interrupt: () => engine.interruptGenerate(),
    });
  }
  const close = async () => {
    let timer;
    try {
      // WebLLM answers an unload only when its worker does: never wait longer than this.
      await Promise.race([engine.unload(), new Promise((resolve) => (timer = setTimeout(resolve, UNLOAD_WAIT_MS)))]);
    } catch {
      /* already gone */
    } finally {
      clearTimeout(timer);
    }
    worker.terminate();
    channel.port1.close();
  };
  return { target: channel.port1, close };
}

/** The failure kind of a load's error (module rules). */
export function failureKind(error) {
  return errorKind(error);
}

/**
 * The failure kind of a chat's error, as its worker reported it
 * (`{name, message}`): an unknown one is an `inference` failure.
 */
export function classify(error) {
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
export async function forget(modelId, kind) {
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
