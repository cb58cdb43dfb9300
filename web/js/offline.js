/**
 * "Download for offline use": a connection's model files downloaded into
 * the cache its engine reads from, without loading the model (so a device
 * that cannot run the engine now can still store the model for later).
 *
 * Rules
 * - `modelFiles(connection)` lists what a connection's engine reads:
 *   kind `wasm`: its GGUF URL (every shard of a split model,
 *   `-00001-of-0000N.gguf`), checked as GGUF, kept in the service worker's
 *   model cache `napllm-models` under each URL (the cache the engine looks
 *   in first).
 * - `offlineFiles(connection)` lists, for kinds `onnx` and `webllm` too,
 *   what each engine will read, where it looks first, without loading the
 *   model (no WebGPU needed): `onnx`: transformers.js's own list
 *   (`ModelRegistry.get_files`, in a worker of the engine, for WebGPU and
 *   the connection's dtype) put into the library's cache
 *   `transformers-cache` for a folder of another origin or the hub, and,
 *   for the engine, its bundle and onnxruntime's wasm, which the service
 *   worker keeps once fetched (so are the files of a model folder of this
 *   origin the service worker keeps); `webllm`: the record's
 *   `mlc-chat-config.json` (cache `webllm/config`), the tokenizer it names,
 *   `tensor-cache.json` and every parameter shard it lists (`webllm/model`),
 *   and the model library (`webllm/wasm`): WebLLM's cache scopes, keyed by
 *   URL, where it looks before any download; a shard is kept only at the
 *   size (`nbytes`) the list names for it. JSON files are kept only when
 *   they parse as a JSON object. Other kinds: nothing (no button).
 * - Once every file is kept, the list is recorded in the cache
 *   `napllm-offline-files` (per connection id), which says "Stored for
 *   offline use" later, offline too, and what removing the connection
 *   may delete.
 * - The download goes through web/engines/download.js (resumable, checked,
 *   one per URL across tabs, every wait bounded); the space check
 *   (storage.js `roomCheck`, over every file not yet kept) comes before
 *   the first byte of the weights and tells the user when they do not
 *   fit; the downloads then stop at the space it found, whatever size a
 *   HEAD reported.
 * - Progress goes to `onProgress(label, fraction)` (fraction 0..1, 1 done,
 *   -1 failed), the same contract as an engine's load progress.
 * - Removing a connection offers to delete its stored files
 *   (`fileRemovalOffer`), except those another connection reads: any
 *   connection whose engine would read the same files (the same GGUF
 *   shards, WebLLM model record or onnx model folder), whether or not it
 *   pressed "Download for offline use" (`connectionFileUrls`, which the
 *   Storage panel's "Used by" reads too).
 * - Nothing here is shown as markup; no text of a host reaches the page.
 */

import { onnxLimit, timedFetch } from "../engines/bounded.js";
import { describeProgress, downloadModelFile, forgetModelUse, NotAModel } from "../engines/download.js";
import { MAX_GGUF_MODEL_BYTES, MAX_WEBLLM_FILE_BYTES } from "../engines/limits.js";
import { el, whileBusy } from "./dom.js";
import { formatBytes, MODEL_CACHE, roomCheck } from "./storage.js";

const SPLIT = /-(\d{5})-of-(\d{5})\.gguf$/i;
/** More shards than any real split model has: a URL claiming more is refused. */
const MAX_SHARDS = 512;

/**
 * The URLs of every shard of the GGUF model at `url` (the URL alone when it
 * is not split; `[]` when it is no http(s) URL or names too many shards).
 */
export function ggufShards(url) {
  let parsed;
  try {
    parsed = new URL(String(url));
  } catch {
    return [];
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") return [];
  const match = SPLIT.exec(parsed.pathname);
  if (!match) return [parsed.href];
  const count = Number(match[2]);
  if (!(count >= 1 && count <= MAX_SHARDS)) return [];
  const width = match[1].length;
  const stem = parsed.pathname.slice(0, match.index);
  return Array.from({ length: count }, (_, i) => {
    const shard = new URL(parsed.href);
    shard.pathname = `${stem}-${String(i + 1).padStart(width, "0")}-of-${match[2]}.gguf`;
    return shard.href;
  });
}

/**
 * The files `connection` (a public summary: `{kind, settings, ...}`) reads:
 * `[{url, gguf, store}]`, `[]` for a kind whose files are not listed.
 */
export function modelFiles(connection) {
  const settings = connection && typeof connection.settings === "object" && connection.settings ? connection.settings : {};
  if (connection?.kind === "wasm" && typeof settings.url === "string") {
    return ggufShards(settings.url).map((url) => ({ url, gguf: true, store: MODEL_CACHE }));
  }
  return [];
}

/** Cache Storage name of the lists of files kept for offline use, per connection id. */
export const OFFLINE_CACHE = "napllm-offline-files";
/** Connection kinds "Download for offline use" is offered for. */
const KINDS = new Set(["wasm", "onnx", "webllm"]);
const JSON_FILE = /\.json$/i;

function settingsOf(connection) {
  return connection && typeof connection.settings === "object" && connection.settings ? connection.settings : {};
}

/**
 * Where the onnx engine reads `connection`'s model (the rule of the
 * runtime's `onnx_source`): `settings.source`, else a model folder URL
 * (the folder above it and its name), else a Hugging Face hub id; null.
 */
export function onnxSource(connection) {
  const settings = settingsOf(connection);
  const source = settings.source;
  if (source && typeof source === "object") {
    return source.kind === "path" && typeof source.base === "string" && typeof source.model === "string"
      ? { kind: "path", base: source.base, model: source.model }
      : null;
  }
  const model = typeof connection?.model === "string" ? connection.model.trim() : "";
  if (/^https?:\/{2}/i.test(model)) {
    let url;
    try {
      url = new URL(model);
    } catch {
      return null;
    }
    const path = url.pathname.replace(/\/+$/, "");
    const cut = path.lastIndexOf("/");
    const name = path.slice(cut + 1);
    if (!name || url.search || url.hash) return null;
    return { kind: "path", base: `${url.origin}${path.slice(0, cut)}/`, model: name };
  }
  return /^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(\/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$/.test(model) && !model.includes("..")
    ? { kind: "hub", model }
    : null;
}

/** The record key of `connection`'s list of kept files. */
function listKey(connection) {
  return new URL(`napllm-offline-files/${encodeURIComponent(String(connection.id))}`, self.location.origin).href;
}

/** The recorded list `[{url, store}]` of `connection`'s kept files, or null. Never rejects. */
async function recordedFiles(connection) {
  if (!("caches" in globalThis) || !connection || connection.id === undefined) return null;
  try {
    const response = await (await caches.open(OFFLINE_CACHE)).match(listKey(connection));
    const value = response ? await response.json() : null;
    const files = value && Array.isArray(value.files) ? value.files : null;
    if (!files || value.model !== String(connection.model ?? "")) return null;
    return files.filter((f) => f && typeof f.url === "string").map((f) => ({ url: f.url, store: typeof f.store === "string" ? f.store : null }));
  } catch {
    return null;
  }
}

async function recordFiles(connection, files) {
  const body = JSON.stringify({ model: String(connection.model ?? ""), files: files.map(({ url, store }) => ({ url, store })) });
  await (await caches.open(OFFLINE_CACHE)).put(listKey(connection), new Response(body, { headers: { "content-type": "application/json" } }));
}

/**
 * Where `connection`'s engine reads its model files, whether or not it ever
 * downloaded them (module rules): `{urls, folders, paths?}`, the exact URLs (GGUF
 * shards, WebLLM's model library) and the folders every file under which it
 * reads (WebLLM's record folder, the onnx model folder or hub repository).
 */
async function readPlaces(connection) {
  if (connection?.kind === "wasm") return { urls: modelFiles(connection).map((file) => file.url), folders: [] };
  if (connection?.kind === "webllm") {
    const engine = await import("../engines/webllm-engine.js");
    const record = await engine.modelRecordFiles(String(connection.model ?? ""));
    return record ? { urls: [record.library], folders: [record.folder] } : { urls: [], folders: [] };
  }
  const source = connection?.kind === "onnx" ? onnxSource(connection) : null;
  if (!source) return { urls: [], folders: [] };
  // A hub id's files live on transformers.js's own default host, which the
  // page does not name: they are matched by their path (`/<id>/...`) on any
  // host, which can only count a file as read by more connections, never less.
  if (source.kind === "hub") return { urls: [], folders: [], paths: [`/${source.model}/`] };
  try {
    return { urls: [], folders: [`${new URL(source.base, document.baseURI).href}${source.model}/`] };
  } catch {
    return { urls: [], folders: [] };
  }
}

/** Whether `url`'s path starts with one of `paths` (hub files, see readPlaces). */
function onPaths(url, paths) {
  if (!paths || paths.length === 0) return false;
  try {
    const path = new URL(String(url)).pathname;
    return paths.some((prefix) => path.startsWith(prefix));
  } catch {
    return false;
  }
}

/**
 * Which model files `connection` reads: `{has(url)}`, true for every file
 * "Download for offline use" kept for it (its recorded list) and for every
 * file its engine would read for its model, downloaded by it or not (the
 * same GGUF shards; WebLLM's files of the same model record; the files of
 * the same onnx model folder or hub repository). Never rejects.
 */
export async function connectionFileUrls(connection) {
  const recorded = connection?.kind === "wasm" ? [] : (await recordedFiles(connection)) || [];
  let places = { urls: [], folders: [] };
  try {
    places = await readPlaces(connection);
  } catch {
    // Not listed: the recorded files still count.
  }
  const urls = new Set([...recorded.map((file) => file.url), ...places.urls]);
  return Object.freeze({
    has: (url) => urls.has(url) || places.folders.some((folder) => String(url).startsWith(folder)) || onPaths(url, places.paths),
  });
}

/** Whether `url` is kept: in `store`, or (store null: the service worker's) in any cache, a build's precache included. */
async function isKept(url, store) {
  if (store) return Boolean(await (await caches.open(store)).match(url));
  return Boolean(await caches.match(url, { ignoreSearch: true }));
}

/** Whether every file of `connection` is stored whole. Never rejects. */
export async function storedForOffline(connection) {
  if (!("caches" in globalThis) || !KINDS.has(connection?.kind)) return false;
  try {
    const files = connection.kind === "wasm" ? modelFiles(connection) : await recordedFiles(connection);
    if (!files || files.length === 0) return false;
    const precaches = (await caches.keys()).filter((name) => name.includes("-precache-"));
    for (const file of files) {
      if (await isKept(file.url, file.store)) continue;
      // A file that ships with the app (TinyChat) is in a build's precache.
      let shipped = false;
      for (const name of precaches) {
        if (await (await caches.open(name)).match(file.url, { ignoreSearch: true })) shipped = true;
      }
      if (!shipped) return false;
    }
    return true;
  } catch {
    return false;
  }
}

/**
 * Download one file and keep it where its engine looks (`file.store`), or
 * fetch it through the service worker (store null), which keeps it.
 * `room`: the bytes the storage check left (null: unknown), where the
 * download stops. Resolves with its size in bytes; throws download.js's
 * errors, or bounded.js's `DownloadStalled` for a file of the service
 * worker's.
 */
async function keepFile(file, limit, onEvent, room = null) {
  if (!file.store) {
    const response = await timedFetch(fetch.bind(globalThis))(file.url);
    if (!response.ok) throw new NotAModel(`status ${response.status}`);
    return (await response.blob()).size;
  }
  const json = JSON_FILE.test(new URL(file.url).pathname);
  const options = { gguf: Boolean(file.gguf), binary: !json, limit, room, size: file.size ?? null, onProgress: onEvent };
  if (!json) return (await downloadModelFile(file.url, { ...options, store: file.store })).size;
  const cache = await caches.open(file.store);
  const kept = await cache.match(file.url);
  if (kept) return (await kept.blob()).size;
  const blob = await downloadModelFile(file.url, options);
  // A host's fallback page is no config: kept only when it is a JSON object.
  let value = null;
  try {
    value = JSON.parse(await blob.text());
  } catch {
    value = null;
  }
  if (value === null || typeof value !== "object") throw new NotAModel("not a JSON file");
  await cache.put(file.url, new Response(blob, { headers: { "content-type": "application/json", "content-length": String(blob.size) } }));
  return blob.size;
}

/** A JSON file kept by `keepFile`, read back (`{}` when unreadable). */
async function keptJson(file) {
  try {
    const response = await (await caches.open(file.store)).match(file.url);
    return response ? await response.json() : {};
  } catch {
    return {};
  }
}

/**
 * The files the onnx model of `source` (`{kind: "path", base, model}` or
 * `{kind: "hub", model}`; a relative `base` is read against the page)
 * needs on WebGPU with `dtype` ("" for the model's default), listed by a
 * transformers.js worker of its own that loads no model (its `files`
 * answer), then ends. Resolves with `{urls, cache, engine}` or null when
 * they cannot be listed; never rejects.
 */
async function onnxFileList(source, dtype) {
  const { askWorker } = await import("../engines/engine-host.js");
  const copy = { ...source };
  if (copy.kind === "path") copy.base = new URL(String(copy.base), document.baseURI).href;
  const data = await askWorker("engines/transformers-worker.js", { op: "files", source: copy, device: "webgpu", dtype: String(dtype || "") }, "files");
  if (!data || data.ok !== true || !Array.isArray(data.urls) || !Array.isArray(data.engine)) return null;
  return { urls: data.urls.map(String), cache: data.cache ? String(data.cache) : null, engine: data.engine.map(String) };
}

/**
 * What "Download for offline use" keeps for `connection` (module rules):
 * `{files: [{url, store, gguf?}], limit(url), first: [...]}` where `first`
 * are small files read to list the rest (WebLLM's config and tensor cache
 * list), or null when its files cannot be listed. Never rejects.
 */
async function offlinePlan(connection) {
  if (connection?.kind === "wasm") {
    const files = modelFiles(connection);
    return files.length ? { files, limit: () => MAX_GGUF_MODEL_BYTES, budget: true } : null;
  }
  if (connection?.kind === "onnx") {
    const source = onnxSource(connection);
    if (!source) return null;
    const dtype = typeof settingsOf(connection).dtype === "string" ? settingsOf(connection).dtype : "";
    const listed = await onnxFileList(source, dtype);
    if (!listed) return null;
    const files = [
      ...listed.engine.map((url) => ({ url, store: null })),
      ...listed.urls.map((url) => ({ url, store: listed.cache })),
    ];
    return { files, limit: onnxLimit };
  }
  if (connection?.kind === "webllm") {
    const engine = await import("../engines/webllm-engine.js");
    const record = await engine.modelRecordFiles(String(connection.model ?? ""));
    if (!record) return null;
    const config = { url: record.config, store: "webllm/config" };
    const tensors = { url: new URL("tensor-cache.json", record.folder).href, store: "webllm/model" };
    return {
      first: [config, tensors],
      async rest() {
        const chat = await keptJson(config);
        const tokenizers = Array.isArray(chat.tokenizer_files) ? chat.tokenizer_files : [];
        const tokenizer = tokenizers.includes("tokenizer.json") ? "tokenizer.json" : tokenizers.includes("tokenizer.model") ? "tokenizer.model" : null;
        const list = await keptJson(tensors);
        const records = Array.isArray(list.records) ? list.records : [];
        const shards = records.map((r) => (r && typeof r.dataPath === "string" ? new URL(r.dataPath, record.folder).href : null));
        // The size the list names for each shard: the download must have exactly it.
        const sizes = records.map((r) => (r && Number.isSafeInteger(r.nbytes) && r.nbytes > 0 ? r.nbytes : null));
        // A hostile list must not name files elsewhere, or thousands of them.
        if (shards.length > MAX_SHARDS || shards.some((url) => !url || !url.startsWith(record.folder))) {
          throw new NotAModel("not a tensor cache list of this model");
        }
        return [
          ...(tokenizer ? [{ url: new URL(tokenizer, record.folder).href, store: "webllm/model" }] : []),
          ...shards.map((url, i) => ({ url, store: "webllm/model", size: sizes[i] })),
          { url: record.library, store: "webllm/wasm" },
        ];
      },
      limit: () => MAX_WEBLLM_FILE_BYTES,
    };
  }
  return null;
}

/**
 * Download every file of `connection` for offline use. Resolves with
 * `"stored"`, `"no-room"` (the space check refused; the user was told) or
 * `"failed"`; never rejects. `onProgress(label, fraction)`: see the rules.
 */
export async function downloadForOffline(connection, onProgress = () => {}) {
  const name = typeof connection?.name === "string" ? connection.name : "the model";
  try {
    onProgress(`Downloading ${name} for offline use`, 0);
    const plan = await offlinePlan(connection);
    if (!plan) throw new NotAModel("the model's files could not be listed");
    const kept = [];
    for (const file of plan.first || []) {
      await keepFile(file, plan.limit(file.url), () => {});
      kept.push(file);
    }
    const files = plan.rest ? await plan.rest() : plan.files;
    const missing = [];
    for (const file of files) if (!(await isKept(file.url, file.store))) missing.push(file.url);
    const { ok, room } = missing.length ? await roomCheck(missing, { copies: 1, connectionId: connection.id }) : { ok: true, room: null };
    if (!ok) {
      onProgress(`${name} does not fit in this browser's storage`, -1);
      return "no-room";
    }
    // The downloads stop at the space found, whatever sizes a HEAD reported.
    let left = room;
    let budget = MAX_GGUF_MODEL_BYTES;
    for (let index = 0; index < files.length; index += 1) {
      const file = files[index];
      onProgress(`Downloading ${name} for offline use`, index / files.length);
      const size = await keepFile(file, plan.budget ? budget : plan.limit(file.url), (event) => {
        const part = event.total ? Math.min(1, event.received / event.total) : 0;
        // Never 1 before the last file is stored (1 means done).
        const fraction = Math.min(0.999, (index + part) / files.length);
        onProgress(`Downloading ${name} for offline use — ${describeProgress(event)}`, fraction);
      }, left);
      if (plan.budget) budget -= size;
      if (left !== null) left = Math.max(0, left - size);
      kept.push(file);
    }
    if (connection.kind !== "wasm") await recordFiles(connection, kept);
  } catch (error) {
    console.error("napllm: the download for offline use failed", error?.name ?? "");
    // Why it gave up, when download.js says so in its own words (never a host's text).
    const why = ["DownloadRestarted", "DownloadInterrupted", "DownloadNoRoom", "DownloadStalled"].includes(error?.name) ? `: ${error.message}` : "";
    onProgress(`${name} could not be downloaded${why}`, -1);
    const page = globalThis.napllmHost;
    if (page && typeof page.notice === "function") {
      const text = why && error?.name !== "DownloadInterrupted"
        ? `${name} could not be downloaded for offline use${why}. Try again later.`
        : `${name} could not be downloaded for offline use${why}. What arrived is kept: try again to continue.`;
      page.notice(JSON.stringify({ level: "error", text, connectionId: String(connection?.id ?? "") }));
    }
    return "failed";
  }
  onProgress(`${name} is stored for offline use`, 1);
  return "stored";
}

/** The event (detail: the connection summaries) connections.js sends when the list changed. */
export const CONNECTIONS_LISTED = "napllm-connections-listed";

/** The event the page gets when a download changed what is stored (the Storage panel re-reads). */
export const STORAGE_CHANGED = "napllm-storage-changed";

/**
 * The "Download for offline use" control of a connection entry: a button
 * while some file is not stored, "Stored for offline use" once all are;
 * null for a connection without listed files. `setProgress(connectionId,
 * label, fraction)` shows the download in the entry (connections.js).
 */
export function offlineControl(connection, setProgress) {
  if (!KINDS.has(connection?.kind) || (connection.kind === "wasm" && modelFiles(connection).length === 0)) return null;
  const id = String(connection.id);
  const button = el("button", { type: "button", class: "offline secondary" }, "Download for offline use");
  const done = el("span", { class: "muted offline-stored", hidden: true }, "Stored for offline use");
  const box = el("p", { class: "offline-control" }, button, done);
  const show = (stored) => {
    button.hidden = stored;
    done.hidden = !stored;
    box.dataset.stored = String(stored);
  };
  storedForOffline(connection).then(show);
  button.addEventListener("click", () => {
    whileBusy(button, async () => {
      await downloadForOffline(connection, (label, fraction) => setProgress(id, label, fraction));
      show(await storedForOffline(connection));
      document.dispatchEvent(new Event(STORAGE_CHANGED));
    });
  });
  return box;
}

/**
 * When `connection` is about to be removed: an offer to delete its stored
 * model files too, those no other connection of `connections` reads
 * (`connectionFileUrls`: every connection of the same model counts, not
 * only one that downloaded it), or null when none is left.
 * `{element, remove()}`: `element` is a checkbox with its label (checked by
 * default), `remove()` deletes the files when it is still checked and tells
 * the Storage panel. Never rejects.
 */
export async function fileRemovalOffer(connection, connections) {
  if (!KINDS.has(connection?.kind) || !(await storedForOffline(connection))) return null;
  // Only model files in a model cache: never the engine's or the app's own files.
  let files = (connection.kind === "wasm" ? modelFiles(connection) : (await recordedFiles(connection)) || []).filter((file) => file.store);
  for (const other of connections || []) {
    if (!other || other.id === connection.id || !KINDS.has(other.kind)) continue;
    const reads = await connectionFileUrls(other);
    files = files.filter((file) => !reads.has(file.url));
  }
  if (files.length === 0) return null;
  let bytes = 0;
  for (const file of files) {
    const response = await (await caches.open(file.store)).match(file.url);
    bytes += Number(response?.headers.get("content-length")) || 0;
  }
  const box = el("input", { type: "checkbox", class: "remove-files", checked: true });
  const element = el("label", { class: "remove-files-label" }, box, ` Also delete its downloaded model (${formatBytes(bytes)})`);
  return {
    element,
    async remove() {
      if (!box.checked) return;
      for (const file of files) {
        await (await caches.open(file.store)).delete(file.url);
        await forgetModelUse(file.url);
      }
      if (connection.kind !== "wasm") await (await caches.open(OFFLINE_CACHE)).delete(listKey(connection));
      document.dispatchEvent(new Event(STORAGE_CHANGED));
    },
  };
}
