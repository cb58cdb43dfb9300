/**
 * The wasm engine's worker: hosts @wllama/wllama (llama.cpp compiled to
 * WebAssembly) off the page's main thread and runs whole chat completions
 * here, so the token loop never waits for the page or for Python.
 *
 * Rules (DESIGN notes in the README, "Generation off the main thread")
 * - Loaded as a module worker by wllama-engine.js; holds no napllm policy.
 *   wllama starts its own llama.cpp worker from here (a nested worker), and
 *   its per-token round trips stay between the two workers.
 * - Messages from the page (all plain data):
 *   `{op: "load", key, url, params}`, `{op: "unload", key}`,
 *   `{op: "chat", id, key, body}`, `{op: "abort", id}`.
 * - Messages to the page:
 *   `{op: "progress", key, fraction}` while downloading (at most every 100 ms),
 *   `{op: "loaded", key, info}` or `{op: "loaded", key, info: {ok: false, kind}}`,
 *   `{op: "chunks", id, chunks: [JSON text, ...]}` with the chunks wllama
 *   yielded (each already serialized, so the page only concatenates): every
 *   chunk at once until the first text, then batches at most every
 *   `BATCH_MS` (batcher.js),
 *   `{op: "end", id, kind: null | text, chunks: [JSON text, ...]}` once per
 *   chat, with the chunks that had not been posted yet.
 * - Errors are classified into kinds (`download`, `load`, `context`,
 *   `inference`, `unknown`); no engine text leaves this worker.
 */

import { Wllama, wasmPaths } from "../vendor/wllama/wllama.js";
import { runChat } from "./batcher.js";

/** key -> Wllama */
const models = new Map();
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
  if (type === "load_error" || type === "version_mismatch") return "load";
  if (stage === "download") return "download";
  if (stage === "load") return "load";
  if (type === "inference_error") return "inference";
  return stage === "chat" ? "inference" : "unknown";
}

async function load(key, url, params) {
  const sameOrigin = new URL(url).origin === self.location.origin;
  const wllama = new Wllama(wasmPaths, { logger: quietLogger, suppressNativeLog: true });
  let stage = "download";
  let lastReport = 0;
  try {
    await wllama.loadModelFromUrl(url, {
      ...params,
      // Same-origin files are revalidated by the HTTP cache; only models
      // from elsewhere are kept in wllama's own (OPFS) cache.
      useCache: !sameOrigin,
      progressCallback: ({ loaded, total }) => {
        const now = performance.now();
        if (total > 0 && (now - lastReport > 100 || loaded >= total)) {
          lastReport = now;
          self.postMessage({ op: "progress", key, fraction: Math.min(1, loaded / total) });
        }
        if (total > 0 && loaded >= total) stage = "load";
      },
    });
    stage = "load";
    const info = wllama.getLoadedContextInfo();
    if (!info || info.success === false || !(info.n_vocab > 0)) {
      throw new Error("llama.cpp could not load the model");
    }
    models.set(key, wllama);
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
    if (!sameOrigin) {
      try {
        await wllama.cacheManager.delete(url);
      } catch {
        /* nothing cached */
      }
    }
    return { ok: false, kind: errorKind(error, stage) };
  }
}

async function chat(id, key, body) {
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
    rest = await runChat(chunks, (message) => self.postMessage({ ...message, id }), controller.signal);
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
    const info = await load(String(data.key), String(data.url), data.params || {});
    self.postMessage({ op: "loaded", key: data.key, info });
  } else if (data.op === "chat") {
    chat(String(data.id), String(data.key), data.body || {});
  } else if (data.op === "abort") {
    const controller = chats.get(String(data.id));
    if (controller) controller.abort();
  } else if (data.op === "unload") {
    const wllama = models.get(String(data.key));
    models.delete(String(data.key));
    if (wllama) await wllama.exit();
    self.postMessage({ op: "unloaded", key: data.key });
  }
};
