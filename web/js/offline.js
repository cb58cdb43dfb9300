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
 *   in first). Other kinds have no files listed here yet (empty list: no
 *   button).
 * - The download goes through web/engines/download.js (resumable, checked,
 *   one per URL across tabs); the space check (storage.js `roomForModel`)
 *   comes before the first byte and tells the user when it does not fit.
 * - Progress goes to `onProgress(label, fraction)` (fraction 0..1, 1 done,
 *   -1 failed), the same contract as an engine's load progress.
 * - Removing a connection offers to delete its stored files
 *   (`fileRemovalOffer`), unless another connection uses them.
 * - Nothing here is shown as markup; no text of a host reaches the page.
 */

import { describeProgress, downloadModelFile, forgetModelUse } from "../engines/download.js";
import { MAX_GGUF_MODEL_BYTES } from "../engines/limits.js";
import { el, whileBusy } from "./dom.js";
import { formatBytes, MODEL_CACHE, roomForModel } from "./storage.js";

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

/** Whether every file of `connection` is stored whole. Never rejects. */
export async function storedForOffline(connection) {
  const files = modelFiles(connection);
  if (files.length === 0 || !("caches" in globalThis)) return false;
  try {
    const precaches = (await caches.keys()).filter((name) => name.includes("-precache-"));
    for (const file of files) {
      if (await (await caches.open(file.store)).match(file.url)) continue;
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
 * Download every file of `connection` for offline use. Resolves with
 * `"stored"`, `"no-room"` (the space check refused; the user was told) or
 * `"failed"`; never rejects. `onProgress(label, fraction)`: see the rules.
 */
export async function downloadForOffline(connection, onProgress = () => {}) {
  const files = modelFiles(connection);
  const name = typeof connection?.name === "string" ? connection.name : "the model";
  if (files.length === 0) return "failed";
  if (!(await roomForModel(files[0].url, { copies: 1, connectionId: connection.id }))) {
    onProgress(`${name} does not fit in this browser's storage`, -1);
    return "no-room";
  }
  let budget = MAX_GGUF_MODEL_BYTES;
  try {
    for (let index = 0; index < files.length; index += 1) {
      const file = files[index];
      onProgress(`Downloading ${name} for offline use`, index / files.length);
      const blob = await downloadModelFile(file.url, {
        gguf: file.gguf,
        limit: budget,
        store: file.store,
        onProgress: (event) => {
          const part = event.total ? Math.min(1, event.received / event.total) : 0;
          // Never 1 before the last file is stored (1 means done).
          const fraction = Math.min(0.999, (index + part) / files.length);
          onProgress(`Downloading ${name} for offline use — ${describeProgress(event)}`, fraction);
        },
      });
      budget -= blob.size;
    }
  } catch (error) {
    console.error("napllm: the download for offline use failed", error?.name ?? "");
    // Why it gave up, when download.js says so in its own words (never a host's text).
    const why = error?.name === "DownloadRestarted" ? `: ${error.message}` : "";
    onProgress(`${name} could not be downloaded${why}`, -1);
    const page = globalThis.napllmHost;
    if (page && typeof page.notice === "function") {
      const text = why
        ? `${name} could not be downloaded for offline use${why}. Try again later.`
        : `${name} could not be downloaded for offline use. What arrived is kept: try again to continue.`;
      page.notice(JSON.stringify({ level: "error", text, connectionId: String(connection.id) }));
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
  if (modelFiles(connection).length === 0) return null;
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
 * model files too, or null when it has none or another connection of
 * `connections` uses one of them. `{element, remove()}`: `element` is a
 * checkbox with its label (checked by default), `remove()` deletes the
 * files when it is still checked and tells the Storage panel. Never rejects.
 */
export async function fileRemovalOffer(connection, connections) {
  const files = modelFiles(connection);
  if (files.length === 0 || !(await storedForOffline(connection))) return null;
  const urls = new Set(files.map((file) => file.url));
  const shared = (connections || []).some((other) => other && other.id !== connection.id
    && modelFiles(other).some((file) => urls.has(file.url)));
  if (shared) return null;
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
      document.dispatchEvent(new Event(STORAGE_CHANGED));
    },
  };
}
