/**
 * The page side of every engine: one host per engine kind, driven by
 * napllm.providers.engine (Python) through napllm.browser.engines, and
 * parameterised by the plain data the engine's spec declares
 * (`EngineSpec.page`, e.g. providers/engine_wasm.py). An engine is a worker
 * of ours around a library (wllama-worker.js, transformers-worker.js,
 * webllm-worker.js) that speaks the one engine-worker protocol
 * (worker-bridge.js); this module does each engine's model bookkeeping once.
 *
 * Rules (docs/design.md, "The data path" and "Adding an engine")
 * - `hostFor(declarationJson)` gives the host of the declaration's `kind`
 *   (made once per kind and kept for the page's lifetime). A declaration:
 *   `{kind, worker?, workers?: "shared" | "per-model", oneModel?, report,
 *   urlFields?, room?, adapter?}`:
 *   `worker`: the worker's URL relative to the shell's folder (the one
 *   above engines/, so a page elsewhere on the origin reaches it too);
 *   `workers`: one worker for every model of the engine (`shared`, the
 *   default), or one per model key (`per-model`: a failed load ends its
 *   worker, so the next try starts afresh);
 *   `oneModel`: loading a model unloads every other one first (frees GPU memory);
 *   `report`: the device report Python reads: `environment` (cross-origin
 *   isolation, logical cores), `webgpu` (the adapter probe, without
 *   starting any worker or library), or `adapter` (the adapter's `report`);
 *   `urlFields`: load fields (dotted paths) holding URLs relative to the
 *   shell page, sent to the worker as absolute URLs;
 *   `room`: the load field with the model file's URL that must fit in the
 *   browser's storage before a download (room.js `roomCheck`: one
 *   copy, the service worker's); the worker gets the space found as the
 *   load field `roomBytes`, where its download stops;
 *   `progressVerb`: the first word of its progress labels (default `Loading`);
 *   `adapter`: a page module (relative to the shell's folder) for an engine
 *   whose worker is driven by its library's own page-side client (WebLLM):
 *   it exports `report()`, `connect(key, fields, onProgress, onFailure)` ->
 *   `{target, close()}` (`target`: a MessagePort speaking the worker
 *   protocol's chats; `onFailure()`: to call when the worker behind it
 *   fails) or a thrown error, `failureKind(error)`,
 *   `classify(error)` (a chat error's kind) and `forget(key, kind)` (after
 *   a failed load).
 * - Models are keyed by the key Python gives. Concurrent loads of one key
 *   share one promise; a failed load is forgotten, so the next request
 *   tries again (with `fresh: true` in its load fields: the worker fetches
 *   every file afresh).
 * - Load progress goes to `napllmHost.engineProgress` (page.js); a page
 *   without that hook gets one `napllmHost.notice` per load.
 * - A worker that dies ends its open chats with `inference` and its pending
 *   loads with `load` (worker-bridge.js) and forgets the models it held.
 *   A worker whose load goes `WORKER_IDLE_MS` (limits.js) without a
 *   message is ended the same way, that load answering `stalled`; an
 *   adapter's `connect` is bounded by the adapter (webllm-engine.js). The
 *   failed entry is forgotten either way, so the next request loads again.
 *   An adapter's worker that fails is handled the same way (`connect` gets
 *   `onFailure`).
 * - Unloading a model (`unloadModel`, and a `oneModel` load unloading the
 *   others) ends its open chats with `unloaded` before the worker is told
 *   or stopped, so a chat on it always gets its end.
 * - Every value crossing to Python is JSON text or a plain string:
 *   `ensureModel` answers `{"ok": true, ...}` or `{"ok": false, "kind"}`;
 *   a chat is started with `startChat` (a stream id), read with
 *   `nextChunks(id)` (streams.js batches) and stopped with `abort(id)`,
 *   which posts `cancel` to the worker. Chats carry `key` and `merge`
 *   (batcher.js: false while a delivery delay hands chunks over one by one).
 */

import { advance } from "./lifecycle.js";
import { roomCheck } from "./room.js";
import { isFallback, requestAdapter, vendorOf } from "./gpu.js";
import { WORKER_IDLE_MS } from "./limits.js";
import { loadingNotice, progress } from "./page.js";
import * as streams from "./streams.js";
import { WorkerBridge, cancelChat } from "./worker-bridge.js";

export { nextChunks, openStreams } from "./worker-bridge.js";

/**
 * A model entry's states and the events each accepts (lifecycle.js): it is
 * `loading` from the first `ensureModel` of its key, `loaded` when the
 * load answered ok, and `gone` for good when the load failed, the model
 * was unloaded, or the worker that held it died. A `gone` entry has left
 * `models`; a later `ensureModel` of the key makes a new one.
 */
export const MODEL_TRANSITIONS = Object.freeze({
  loading: Object.freeze({ loaded: "loaded", failed: "gone", unloaded: "gone" }),
  loaded: Object.freeze({ unloaded: "gone", workerDied: "gone" }),
  gone: Object.freeze({}),
});

/** kind -> its host. */
const hosts = new Map();

/** The host of `declarationJson`'s kind (made on the first call; module rules). */
export function hostFor(declarationJson) {
  const declaration = JSON.parse(String(declarationJson));
  const kind = String(declaration.kind);
  let host = hosts.get(kind);
  if (!host) {
    host = new EngineHost(declaration);
    hosts.set(kind, host);
  }
  return host;
}

/** An absolute URL for `path`, read against the page. */
function pageUrl(path) {
  return new URL(String(path), document.baseURI).href;
}

/** An absolute URL for `path`, read against the shell's folder (the one above engines/). */
function shellUrl(path) {
  return new URL(String(path), new URL("../", import.meta.url)).href;
}

/** A new module worker at `path` (relative to the shell's folder). */
export function startWorker(path) {
  return new Worker(shellUrl(path), { type: "module" });
}

/**
 * Post `message` to a worker of its own at `path` (relative to the shell's
 * folder) and resolve with the first answer whose `op` is `answerOp`, then end
 * the worker; null when it fails or does not answer within `timeoutMs`.
 * Never rejects. (A question that needs no model, e.g. the files of one.)
 */
export function askWorker(path, message, answerOp, timeoutMs = 60_000) {
  return new Promise((resolve) => {
    let worker;
    try {
      worker = startWorker(path);
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
      if (data && data.op === answerOp) finish(data);
    };
    worker.onerror = () => finish(null);
    worker.postMessage(message);
  });
}

/** The device reports a declaration can name (module rules). */
const REPORTS = {
  environment: async () => ({
    crossOriginIsolated: globalThis.crossOriginIsolated === true,
    hardwareConcurrency: Number(navigator.hardwareConcurrency) || 1,
  }),
  webgpu: async () => {
    const { adapter, reason } = await requestAdapter();
    if (!adapter) return { webgpu: false, reason };
    return { webgpu: true, fallback: isFallback(adapter), vendor: vendorOf(adapter) };
  },
};

/** Replace each dotted path of `paths` in `fields` by its URL read against the page. */
function resolveUrls(fields, paths) {
  for (const path of paths) {
    const names = String(path).split(".");
    let place = fields;
    for (const name of names.slice(0, -1)) place = place && typeof place === "object" ? place[name] : null;
    const last = names[names.length - 1];
    if (place && typeof place === "object" && typeof place[last] === "string") place[last] = pageUrl(place[last]);
  }
  return fields;
}

class EngineHost {
  constructor(declaration) {
    this.kind = String(declaration.kind);
    this.declaration = declaration;
    /** key -> {key, state (MODEL_TRANSITIONS), promise, info, bridge, close}. */
    this.models = new Map();
    /** The shared worker's bridge (`workers: "shared"`), or null before a load or after a failure. */
    this.shared = null;
    /** Keys whose last load failed: their next load fetches every file afresh. */
    this.failed = new Set();
    this.reported = null;
    this.adapterModule = null;
  }

  async adapter() {
    if (!this.adapterModule) this.adapterModule = import(shellUrl(this.declaration.adapter));
    return this.adapterModule;
  }

  /** The device report as JSON text (module rules; read once). */
  async report() {
    if (!this.reported) {
      const name = String(this.declaration.report || "");
      this.reported = name === "adapter" ? this.adapter().then((m) => m.report()) : (REPORTS[name] || (async () => ({})))().then(JSON.stringify);
      this.reported.catch(() => {
        this.reported = null;
      });
    }
    return String(await this.reported);
  }

  /** The bridge of the worker that loads `entry`'s model. */
  bridgeFor(entry) {
    if (this.declaration.workers === "per-model") {
      return new WorkerBridge(startWorker(this.declaration.worker), { loadIdleMs: WORKER_IDLE_MS, onFailure: () => this.forgetLoaded(entry.bridge) });
    }
    if (!this.shared) {
      const bridge = new WorkerBridge(startWorker(this.declaration.worker), {
        loadIdleMs: WORKER_IDLE_MS,
        onFailure: () => {
          if (this.shared === bridge) this.shared = null;
          this.forgetLoaded(bridge);
        },
      });
      this.shared = bridge;
    }
    return this.shared;
  }

  /** A worker died: forget the loaded models it held (pending loads were answered by the bridge). */
  forgetLoaded(bridge) {
    for (const [key, entry] of this.models) {
      if (entry.bridge === bridge && advance(entry, MODEL_TRANSITIONS, "workerDied")) this.models.delete(key);
    }
  }

  /**
   * Load (or reuse) the model of `key` with the worker's load `fieldsJson`
   * (a JSON object); `connectionId` and `label` name it in progress
   * reports. Resolves with JSON text `{"ok": true, ...}` or `{"ok": false,
   * "kind"}`; never rejects.
   */
  async ensureModel(key, fieldsJson, connectionId, label) {
    key = String(key);
    let entry = this.models.get(key);
    if (!entry) {
      entry = { key, state: "loading", promise: null, info: null, bridge: null, close: null };
      const others = this.declaration.oneModel ? [...this.models.values()] : [];
      this.models.set(key, entry);
      entry.promise = this.load(entry, JSON.parse(String(fieldsJson)), String(connectionId), String(label), others).then((info) => {
        const ok = info.ok === true;
        if (ok) {
          entry.info = info;
          this.failed.delete(key);
        } else {
          this.failed.add(key);
        }
        // An entry unloaded while it loaded is gone already: its model is
        // unloaded by `unloadModel`, which waits for this answer.
        if (advance(entry, MODEL_TRANSITIONS, ok ? "loaded" : "failed") === "gone" && this.models.get(key) === entry) {
          this.models.delete(key);
        }
        return info;
      });
    }
    return JSON.stringify(await entry.promise);
  }

  async load(entry, fields, connectionId, label, others) {
    for (const other of others) await this.unloadModel(other.key);
    const declaration = this.declaration;
    resolveUrls(fields, Array.isArray(declaration.urlFields) ? declaration.urlFields : []);
    if (declaration.room && typeof fields[declaration.room] === "string") {
      const { ok, room } = await roomCheck(fields[declaration.room], { copies: 1, connectionId });
      if (!ok) {
        progress(connectionId, `${label} does not fit in this browser's storage`, -1);
        return { ok: false, kind: "storage" };
      }
      // The download stops at the space found, whatever size a HEAD reported.
      if (room !== null) fields.roomBytes = room;
    }
    const verb = String(declaration.progressVerb || "Loading");
    loadingNotice(`Loading the model of ${label}…`, connectionId);
    progress(connectionId, `${verb} ${label}`, 0);
    const onProgress = (fraction, detail = "") => progress(connectionId, `${verb} ${label}${detail}`, fraction);
    const info = declaration.adapter ? await this.connect(entry, fields, onProgress) : await this.loadInWorker(entry, fields, onProgress);
    if (info.ok === true) {
      progress(connectionId, `${label} is ready`, 1);
      return info;
    }
    progress(connectionId, `${label} could not be loaded`, -1);
    return { ok: false, kind: String(info.kind || "load") };
  }

  /** A load through the engine-worker protocol (`load` -> `loaded`). */
  async loadInWorker(entry, fields, onProgress) {
    entry.bridge = this.bridgeFor(entry);
    const info = await entry.bridge.load(entry.key, { ...fields, fresh: this.failed.has(entry.key) }, onProgress);
    const ok = info && info.ok === true;
    if (!ok && this.declaration.workers === "per-model") entry.bridge.terminate();
    return ok ? info : { ok: false, kind: (info && info.kind) || "load" };
  }

  /** A load through the adapter's library client (module rules). */
  async connect(entry, fields, onProgress) {
    const adapter = await this.adapter();
    try {
      // The adapter's worker failing ends the chats on its port (and forgets the model).
      let bridge = null;
      const onFailure = () => {
        if (bridge) bridge.fail();
      };
      const connection = await adapter.connect(entry.key, fields, onProgress, onFailure);
      bridge = new WorkerBridge(connection.target, {
        classify: (error) => adapter.classify(error),
        onFailure: () => this.forgetLoaded(bridge),
      });
      entry.bridge = bridge;
      entry.close = () => connection.close();
      return { ok: true };
    } catch (error) {
      console.error(`napllm ${this.kind} engine: the model could not be loaded`, error);
      const kind = adapter.failureKind(error);
      await adapter.forget(entry.key, kind);
      return { ok: false, kind };
    }
  }

  /** Whether the model of `key` is loaded and ready (synchronous). */
  isLoaded(key) {
    const entry = this.models.get(String(key));
    return Boolean(entry && entry.state === "loaded");
  }

  /** JSON text: the loaded models' load answers, each with its `key`. */
  loadedModels() {
    return JSON.stringify([...this.models.values()].filter((e) => e.state === "loaded").map((e) => ({ key: e.key, ...e.info })));
  }

  /** Unload the model of `key` (its worker forgets it, or ends when it held only that model). */
  async unloadModel(key) {
    const entry = this.models.get(String(key));
    this.models.delete(String(key));
    if (!entry) return;
    const loading = entry.state === "loading";
    if (loading) advance(entry, MODEL_TRANSITIONS, "unloaded");
    let info = entry.info;
    try {
      info = await entry.promise;
    } catch {
      /* a load never rejects */
    }
    if (!loading && !advance(entry, MODEL_TRANSITIONS, "unloaded")) return; // gone already
    if (!info || info.ok !== true || !entry.bridge) return; // nothing was loaded
    // Its open chats end now, with a result, whatever the engine does next.
    entry.bridge.endChats(entry.key, "unloaded");
    if (entry.close) await entry.close();
    else if (this.declaration.workers === "per-model") entry.bridge.terminate("unloaded");
    else entry.bridge.unload(entry.key);
  }

  /**
   * Start a streamed chat completion on the loaded model `key` with the
   * OpenAI chat body `bodyJson`; returns the stream id. Throws when the
   * model is not loaded (the Python side calls `ensureModel` first).
   */
  startChat(key, bodyJson, deliveryDelayMs = 0) {
    const entry = this.models.get(String(key));
    if (!entry || entry.state !== "loaded" || !entry.bridge) throw new Error("model not loaded");
    const body = JSON.parse(String(bodyJson));
    const stream = streams.open(this.kind, deliveryDelayMs);
    entry.bridge.chat(stream, body, { key: entry.key, merge: stream.delayMs === 0 });
    return stream.id;
  }

  nextChunks(id) {
    return streams.next(id);
  }

  /** Cancel stream `id`: its bridge posts `cancel` to the worker. */
  abort(id) {
    return cancelChat(id);
  }

  openStreams() {
    return streams.openCount();
  }
}
