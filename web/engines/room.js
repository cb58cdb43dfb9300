/**
 * A model's room in the browser's storage: the service worker's model cache
 * (its name, every copy of a model removed), persistent storage, and the
 * check before a download that it fits (`roomCheck`). Used by the engines
 * (engine-host.js, webllm-engine.js) and by the page's shared code
 * (offline.js, pwa.js); it imports nothing of the page's (web/js/).
 *
 * Rules
 * - A size a HEAD reports is a hint only; each HEAD waits at most
 *   `HEAD_TIMEOUT_MS`. The download itself stops at the room found
 *   (download.js `room`), whatever a HEAD said.
 * - When a model does not fit, the user is told (model size, space left)
 *   through `napllmHost.notice`; nothing here rejects.
 */

/** Cache Storage name of the models the service worker keeps (build.py MODEL_CACHE). */
export const MODEL_CACHE = "napllm-models";

/**
 * Remove every copy of the model at `url` that the shell's service worker
 * keeps (the model cache and any other napllm runtime cache), so the next
 * load downloads it again. Called by an engine after a failed load.
 * Resolves with the number of entries removed; never rejects.
 */
export async function forgetCachedModel(url) {
  if (!("caches" in globalThis)) return 0;
  let removed = 0;
  try {
    for (const name of await caches.keys()) {
      if (name !== MODEL_CACHE && !name.startsWith("napllm-models")) continue;
      const cache = await caches.open(name);
      if (await cache.delete(String(url))) removed += 1;
    }
  } catch (error) {
    console.error("napllm: could not clear a cached model", error);
  }
  return removed;
}

// ---------------------------------------------------------------- storage limits

/** Bytes as text with a decimal unit: 1234567 -> "1.2 MB". */
export function formatBytes(bytes) {
  const value = Number(bytes);
  if (!Number.isFinite(value) || value < 0) return "unknown size";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let amount = value;
  let unit = 0;
  while (amount >= 1000 && unit < units.length - 1) {
    amount /= 1000;
    unit += 1;
  }
  return unit === 0 ? `${amount} B` : `${amount.toFixed(amount < 10 ? 1 : 0)} ${units[unit]}`;
}

let persistRequest = null;

/**
 * Ask the browser (once per page) to keep this origin's data under storage
 * pressure (`navigator.storage.persist()`), so models and connections are
 * not evicted. Resolves with whether storage is persistent; never rejects.
 */
export function requestPersistentStorage() {
  const storage = globalThis.navigator?.storage;
  if (!storage || typeof storage.persist !== "function") return Promise.resolve(false);
  persistRequest ??= Promise.resolve(typeof storage.persisted === "function" ? storage.persisted() : false)
    .then((already) => already || storage.persist())
    .then((granted) => granted === true)
    .catch(() => false);
  return persistRequest;
}

/** The most a HEAD request for a model's size waits for its answer (ms). */
const HEAD_TIMEOUT_MS = 15_000;

/**
 * Before a model download: does it fit? `url`: the model file's URL, or a
 * list of them (their sizes add up). Reads each size (HEAD, bounded by
 * `HEAD_TIMEOUT_MS`; a size a HEAD reports is a hint only) and
 * `navigator.storage.estimate()`; asks for persistent storage on the way.
 * `copies`: how many copies the engine stores (the wasm engine keeps one,
 * the service worker's). A model already in the model cache needs no room.
 * When it does not fit, tells the user (model size, space left) through
 * `napllmHost.notice`. Resolves with `{ok, room}`: `ok` false when it does
 * not fit (true when it fits or the size or quota is unknown); `room`: the
 * bytes one copy of the download may take (the free space over `copies`),
 * or null when the quota is unknown. The download itself stops at `room`
 * whatever a HEAD said (download.js `room`). Never rejects.
 */
export async function roomCheck(url, { copies = 1, connectionId = null } = {}) {
  requestPersistentStorage();
  try {
    const storage = globalThis.navigator?.storage;
    if (!storage || typeof storage.estimate !== "function") return { ok: true, room: null };
    const { usage, quota } = await storage.estimate();
    const free = Math.max(0, Number(quota) - Number(usage));
    const room = Number.isFinite(free) ? Math.floor(free / Math.max(1, copies)) : null;
    let size = 0;
    for (const each of Array.isArray(url) ? url : [url]) {
      if ("caches" in globalThis && (await (await caches.open(MODEL_CACHE)).match(String(each)))) continue;
      try {
        const head = await fetch(String(each), { method: "HEAD", signal: AbortSignal.timeout(HEAD_TIMEOUT_MS) });
        const bytes = Number(head.headers.get("content-length"));
        if (head.ok && Number.isSafeInteger(bytes) && bytes > 0) size += bytes;
      } catch {
        /* no size known: the download checks what it announces */
      }
    }
    if (size <= 0 || room === null || size * copies <= free) return { ok: true, room };
    const text = `Not enough storage to download the model: it needs ${formatBytes(size * copies)}`
      + ` and this browser has ${formatBytes(free)} left for napllm. Delete cached models in Storage`
      + " or free disk space, then try again.";
    const page = globalThis.napllmHost;
    if (page && typeof page.notice === "function") {
      const notice = { level: "error", text };
      if (connectionId) notice.connectionId = String(connectionId);
      page.notice(JSON.stringify(notice));
    }
    return { ok: false, room };
  } catch {
    return { ok: true, room: null };
  }
}

/** Whether the model at `url` fits (`roomCheck`'s `ok`). Never rejects. */
export async function roomForModel(url, options = {}) {
  return (await roomCheck(url, options)).ok;
}
