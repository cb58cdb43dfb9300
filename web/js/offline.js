/**
 * "Download for offline use": a connection's model files downloaded into
 * the cache its engine reads from, without loading the model (so a device
 * that cannot run the engine now can still store the model for later).
 *
 * Rules
 * - Nothing here names an engine. An engine whose spec declares `offline`
 *   (web/engines/declarations.js `offlineModuleOf`: a module under
 *   engines/) is offered the download; its module says what its engine
 *   reads (web/engines/offline-gguf.js states the interface): `recorded`
 *   (whether the kept list is recorded, or computed from the connection by
 *   `modelFiles`), `readPlaces`, `offlinePlan` (`{files | first + rest(),
 *   limit(url), budget?}`, `budget`: bytes all its files share). Other
 *   kinds: nothing (no button).
 * - JSON files are kept only when they parse as a JSON object.
 * - Once every file is kept, a recorded list goes into the cache
 *   `napllm-offline-files` (per connection id), which says "Stored for
 *   offline use" later, offline too, and what removing the connection
 *   may delete.
 * - The download goes through web/engines/download.js (resumable, checked,
 *   one per URL across tabs, every wait bounded); the space check
 *   (engines/room.js `roomCheck`, over every file not yet kept) comes before
 *   the first byte of the weights and tells the user when they do not
 *   fit; the downloads then stop at the space it found, whatever size a
 *   HEAD reported.
 * - Progress goes to `onProgress(label, fraction)` (fraction 0..1, 1 done,
 *   -1 failed), the same contract as an engine's load progress.
 * - Removing a connection offers to delete its stored files
 *   (`fileRemovalOffer`), except those another connection reads: any
 *   connection whose engine would read the same files (its module's
 *   `readPlaces`), whether or not it pressed "Download for offline use"
 *   (`connectionFileUrls`, which the Storage panel's "Used by" reads too).
 * - Nothing here is shown as markup; no text of a host reaches the page.
 */

import { timedFetch } from "../engines/bounded.js";
import { offlineModuleOf } from "../engines/declarations.js";
import { describeProgress, downloadModelFile, forgetModelUse, NotAModel } from "../engines/download.js";
import { el, whileBusy } from "./dom.js";
import { formatBytes, MODEL_CACHE, roomCheck } from "../engines/room.js";

/**
 * The offline module of `connection`'s engine (module rules), or null when
 * its kind declares none. Never rejects.
 */
async function engineOf(connection) {
  try {
    const path = await offlineModuleOf(connection?.kind);
    return path ? await import(new URL(`../${path}`, import.meta.url).href) : null;
  } catch {
    return null;
  }
}

/** Cache Storage name of the lists of files kept for offline use, per connection id. */
export const OFFLINE_CACHE = "napllm-offline-files";
const JSON_FILE = /\.json$/i;

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
 * file its engine would read for its model, downloaded by it or not (its
 * engine module's `readPlaces`). Never rejects.
 */
export async function connectionFileUrls(connection) {
  const engine = await engineOf(connection);
  const recorded = engine && engine.recorded ? (await recordedFiles(connection)) || [] : [];
  let places = { urls: [], folders: [] };
  try {
    if (engine) places = await engine.readPlaces(connection);
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
  const engine = await engineOf(connection);
  if (!("caches" in globalThis) || !engine) return false;
  try {
    const files = engine.recorded ? await recordedFiles(connection) : engine.modelFiles(connection);
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

/**
 * Download every file of `connection` for offline use. Resolves with
 * `"stored"`, `"no-room"` (the space check refused; the user was told) or
 * `"failed"`; never rejects. `onProgress(label, fraction)`: see the rules.
 */
export async function downloadForOffline(connection, onProgress = () => {}) {
  const name = typeof connection?.name === "string" ? connection.name : "the model";
  try {
    onProgress(`Downloading ${name} for offline use`, 0);
    const engine = await engineOf(connection);
    const plan = engine ? await engine.offlinePlan(connection) : null;
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
    // A plan with a `budget` (bytes) holds its files to it all together.
    const budgeted = Number.isSafeInteger(plan.budget) && plan.budget > 0;
    let budget = budgeted ? plan.budget : 0;
    for (let index = 0; index < files.length; index += 1) {
      const file = files[index];
      onProgress(`Downloading ${name} for offline use`, index / files.length);
      const size = await keepFile(file, budgeted ? budget : plan.limit(file.url), (event) => {
        const part = event.total ? Math.min(1, event.received / event.total) : 0;
        // Never 1 before the last file is stored (1 means done).
        const fraction = Math.min(0.999, (index + part) / files.length);
        onProgress(`Downloading ${name} for offline use — ${describeProgress(event)}`, fraction);
      }, left);
      if (budgeted) budget -= size;
      if (left !== null) left = Math.max(0, left - size);
      kept.push(file);
    }
    if (engine.recorded) await recordFiles(connection, kept);
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
  const id = String(connection?.id);
  const button = el("button", { type: "button", class: "offline secondary", hidden: true }, "Download for offline use");
  const done = el("span", { class: "muted offline-stored", hidden: true }, "Stored for offline use");
  const box = el("p", { class: "offline-control", hidden: true }, button, done);
  const show = (stored) => {
    button.hidden = stored;
    done.hidden = !stored;
    box.dataset.stored = String(stored);
  };
  // Offered once the engine's declaration says so (and it names files).
  engineOf(connection).then(async (engine) => {
    if (!engine || (!engine.recorded && engine.modelFiles(connection).length === 0)) {
      box.remove();
      return;
    }
    box.hidden = false;
    show(await storedForOffline(connection));
  });
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
  const engine = await engineOf(connection);
  if (!engine || !(await storedForOffline(connection))) return null;
  // Only model files in a model cache: never the engine's or the app's own files.
  let files = (engine.recorded ? (await recordedFiles(connection)) || [] : engine.modelFiles(connection)).filter((file) => file.store);
  for (const other of connections || []) {
    if (!other || other.id === connection.id) continue;
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
      if (engine.recorded) await (await caches.open(OFFLINE_CACHE)).delete(listKey(connection));
      document.dispatchEvent(new Event(STORAGE_CHANGED));
    },
  };
}
