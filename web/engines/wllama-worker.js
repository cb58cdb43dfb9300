/**
 * The wasm engine's worker: hosts @wllama/wllama (llama.cpp compiled to
 * WebAssembly) off the page's main thread and runs whole chat completions
 * here, so the token loop never waits for the page or for Python.
 *
 * Rules (README, "Design note: generation off the main thread")
 * - Loaded as a module worker by the engine host (engine-host.js); holds no napllm policy.
 *   wllama starts its own llama.cpp worker from here (a nested worker), and
 *   its per-token round trips stay between the two workers.
 * - The protocol of every engine worker (worker-bridge.js). From the page:
 *   `{op: "load", key, url, params, roomBytes?}` (`roomBytes`: the space
 *   the page's storage check found, where the download stops), `{op: "unload", key}`,
 *   `{op: "chat", id, key, body, merge}` (`merge`: see batcher.js), `{op: "cancel", id}`.
 * - Messages to the page:
 *   `{op: "progress", key, fraction, detail}` while downloading (at most
 *   every 100 ms; `detail`: bytes, speed, time left, resumed or restarted,
 *   download.js `describeProgress`),
 *   `{op: "loaded", key, info}` or `{op: "loaded", key, info: {ok: false, kind}}`,
 *   `{op: "chunks", id, chunks: [JSON text, ...]}` with the chunks wllama
 *   yielded (each already serialized, so the page only concatenates): every
 *   chunk at once until the first text, then batches at most every
 *   `BATCH_MS` (batcher.js),
 *   `{op: "end", id, kind: null | text, chunks: [JSON text, ...]}` once per
 *   chat, with the chunks that had not been posted yet.
 * - Model files are downloaded here through download.js (resumable: a
 *   cut download continues from the checked bytes already stored), checked
 *   as they arrive (status 200, or 206 for the rest, not a text type, the
 *   GGUF magic, the declared length, and a byte ceiling for the whole model,
 *   `MAX_GGUF_MODEL_BYTES` of limits.js, which holds with no declared length
 *   or a compressed body too), kept whole in the service worker's model
 *   cache and handed to wllama as Blobs; wllama's own download and its OPFS cache are not used
 *   (that cache kept any answer, a fallback page too, and never asked the
 *   host again). A failed load removes the URL from that cache as well, for
 *   copies an older build left there, and the next load of that URL
 *   fetches past the HTTP cache.
 * - Errors are classified into kinds (`download`, `load`, `context`,
 *   `inference`, `unknown`); no engine text leaves this worker.
 */

import { CacheManager, ModelManager, Wllama, wasmPaths } from "../vendor/wllama/wllama.js";
import { drainedOnExit, runChat } from "./batcher.js";
import { describeProgress, downloadModelFile } from "./download.js";
import { MAX_GGUF_MODEL_BYTES } from "./limits.js";

/** The service worker's model cache (build.py MODEL_CACHE), where whole GGUF files are kept. */
const MODEL_CACHE = "napllm-models";

/** key -> Wllama */
const models = new Map();
/** Model URLs whose last load failed: the next load fetches them afresh. */
const failed = new Set();
/** chat id -> AbortController */
const chats = new Map();

const quietLogger = {
  debug() {},
  log() {},
  warn() {},
  error(...args) {
    console.error("wllama:", ...args);
  },
};

function errorKind(error, stage) {
  const type = error && typeof error.type === "string" ? error.type : "";
  if (type === "kv_cache_full") return "context";
  if (type === "download_error") return "download";
  if (type === "storage_error") return "storage";
  if (type === "load_error" || type === "version_mismatch") return "load";
  if (stage === "download") return "download";
  if (stage === "load") return "load";
  if (type === "inference_error") return "inference";
  return stage === "chat" ? "inference" : "unknown";
}

/**
 * The whole file at `url` as a Blob, through the resumable downloader
 * (download.js: status, content type, the GGUF magic when `gguf`, exactly
 * the declared length, at most `budget` bytes, resumed from the bytes an
 * earlier attempt left). `fresh`: fetch past the HTTP cache, for a retry
 * after a failed load, so an answer it kept from before (a fallback page)
 * is not reused. The whole file is put into the service worker's model
 * cache (`napllm-models`), which answers first next time. `room`: the
 * bytes the page's storage check found (null: unknown); the download stops
 * past them. `onBytes(event)` gets download.js's progress events. Throws
 * download.js's errors (NotAModel, DownloadTooLarge, DownloadNoRoom,
 * DownloadRestarted, DownloadInterrupted).
 */
function download(url, gguf, fresh, budget, room, onBytes) {
  return downloadModelFile(url, { gguf, fresh, limit: budget, room, store: MODEL_CACHE, onProgress: onBytes });
}

/**
 * Remove every file of the model at `urls` from wllama's own (OPFS) cache.
 * wllama keeps a copy there whenever it downloads a model itself (even
 * with `useCache: false`) and then never asks the host again, so a bad copy
 * from an older build would be loaded for good. This worker downloads the
 * files itself (see `load`), so that cache holds nothing of napllm's any
 * more. Never throws.
 */
async function forgetWllamaCopies(urls) {
  try {
    const cache = new CacheManager();
    const names = new Set(await Promise.all(urls.map((u) => cache.getNameFromURL(u))));
    const stale = (await cache.list()).some((entry) => names.has(entry.name)
      || urls.includes(entry.metadata && entry.metadata.originalURL));
    if (stale) {
      await cache.deleteMany((entry) => names.has(entry.name)
        || urls.includes(entry.metadata && entry.metadata.originalURL));
    }
  } catch {
    /* no OPFS here, or nothing cached */
  }
}

/**
 * Remove every shard of the model at `urls` from the service worker's model
 * caches (`napllm-models…`; the page removes the first URL too, this covers
 * the other shards of a split model). Never throws.
 */
async function forgetServiceWorkerCopies(urls) {
  if (!("caches" in self)) return;
  try {
    for (const name of await caches.keys()) {
      if (!name.startsWith("napllm-models")) continue;
      const cache = await caches.open(name);
      for (const url of urls) await cache.delete(url);
    }
  } catch {
    /* no Cache Storage here */
  }
}

async function load(key, url, params, roomBytes) {
  // All shards of a split model (`-00001-of-00003.gguf`), in order.
  const urls = ModelManager.parseModelUrl(url);
  const wllama = new Wllama(wasmPaths, { logger: quietLogger, suppressNativeLog: true });
  let stage = "download";
  try {
    await forgetWllamaCopies(urls);
    // The files are downloaded here, not by wllama: wllama's own download
    // keeps an unchecked copy in OPFS that it never fetches again (a
    // fallback page stayed "the model" for good). Here each file is checked
    // as it arrives, and the only kept copy is the service worker's,
    // verified the same way (web/sw-napllm.js).
    const blobs = [];
    let budget = MAX_GGUF_MODEL_BYTES;
    let room = Number.isFinite(roomBytes) && roomBytes >= 0 ? roomBytes : null;
    for (let index = 0; index < urls.length; index += 1) {
      blobs.push(await download(urls[index], true, failed.has(url), budget, room, (event) => {
        const part = event.total ? Math.min(1, event.received / event.total) : 0;
        const detail = describeProgress(event);
        self.postMessage({ op: "progress", key, fraction: (index + part) / urls.length, detail });
      }));
      budget -= blobs[index].size;
      if (room !== null) room -= blobs[index].size;
      self.postMessage({ op: "progress", key, fraction: (index + 1) / urls.length });
    }
    stage = "load";
    await wllama.loadModel(blobs, params);
    const info = wllama.getLoadedContextInfo();
    if (!info || info.success === false || !(info.n_vocab > 0)) {
      throw new Error("llama.cpp could not load the model");
    }
    models.set(key, wllama);
    failed.delete(url);
    return {
      ok: true,
      threads: wllama.getNumThreads(),
      multithread: wllama.isMultithread(),
      nCtx: info.n_ctx,
      nVocab: info.n_vocab,
    };
  } catch (error) {
    console.error("napllm wasm engine: the model could not be loaded", error);
    try {
      await wllama.exit();
    } catch {
      /* already gone */
    }
    await forgetWllamaCopies(urls);
    await forgetServiceWorkerCopies(urls);
    failed.add(url);
    return { ok: false, kind: errorKind(error, stage) };
  }
}

async function chat(id, key, body, merge) {
  const controller = new AbortController();
  chats.set(id, controller);
  let kind = null;
  let rest = [];
  try {
    const wllama = models.get(key);
    if (!wllama) throw new Error("model not loaded");
    const chunks = await wllama.createChatCompletion({
      ...body,
      stream: true,
      abortSignal: controller.signal,
    });
    // wllama's stream rejects its next read after an abort even when nobody
    // reads any more: drained so that rejection is handled (batcher.js).
    rest = await runChat(
      drainedOnExit(chunks),
      (message) => self.postMessage({ ...message, id }),
      controller.signal,
      merge,
    );
  } catch (error) {
    if (!controller.signal.aborted) {
      console.error("napllm wasm engine: generation failed", error);
      kind = errorKind(error, "chat");
    }
  } finally {
    chats.delete(id);
    self.postMessage({ op: "end", id, kind, chunks: rest });
  }
}

self.onmessage = async ({ data }) => {
  if (!data || typeof data !== "object") return;
  if (data.op === "load") {
    const info = await load(String(data.key), String(data.url), data.params || {}, Number(data.roomBytes));
    self.postMessage({ op: "loaded", key: data.key, info });
  } else if (data.op === "chat") {
    chat(String(data.id), String(data.key), data.body || {}, data.merge !== false);
  } else if (data.op === "cancel") {
    const controller = chats.get(String(data.id));
    if (controller) controller.abort();
  } else if (data.op === "unload") {
    const wllama = models.get(String(data.key));
    models.delete(String(data.key));
    if (wllama) await wllama.exit();
    self.postMessage({ op: "unloaded", key: data.key });
  }
};
