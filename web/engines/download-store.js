/**
 * The store behind web/engines/download.js: the parts of unfinished
 * downloads, the record of when each stored model file was last used, and
 * the lookups of whole copies (a model cache, a build's precache).
 *
 * Rules (download.js, "Rules"; docs/security.md, "Stored data")
 * - Parts live in the Cache Storage cache `napllm-download-parts`: the
 *   record of a file (`meta`: URL, total length, validator, content type,
 *   the parts' offsets) under `<origin>/napllm-download-parts/<url>/meta`,
 *   each part under `.../part-<offset>`. A part is written before the
 *   record that names it; a record naming a part that is not stored is
 *   read back cut to the parts before it (`readMeta`).
 * - Nothing here checks bytes: download.js stores only bytes it checked.
 * - Every exported reader never rejects unless it says so.
 */

/** Cache Storage name of the parts of unfinished downloads. */
export const PARTS_CACHE = "napllm-download-parts";

// ------------------------------------------------------------ the parts store

function origin() {
  return self.location.origin;
}

/** The Cache Storage key of `url`'s record (`which` "meta") or of its part at `offset`. */
function partKey(url, which) {
  return `${origin()}/napllm-download-parts/${encodeURIComponent(url)}/${which}`;
}

export async function partsCache() {
  return caches.open(PARTS_CACHE);
}

/**
 * The stored record of an unfinished download of `url`, with only the
 * parts that are really stored (a record naming a missing part is cut back
 * to the parts before it). null when there is none or it is unreadable.
 */
export async function readMeta(cache, url) {
  try {
    const response = await cache.match(partKey(url, "meta"));
    if (!response) return null;
    const meta = await response.json();
    if (!meta || meta.url !== url || !Number.isSafeInteger(meta.total) || !Array.isArray(meta.parts)) return null;
    const parts = [];
    let next = 0;
    for (const [offset, length] of meta.parts) {
      if (offset !== next || !Number.isSafeInteger(length) || length <= 0) break;
      const part = await cache.match(partKey(url, `part-${offset}`));
      if (!part || Number(part.headers.get("content-length")) !== length) break;
      parts.push([offset, length]);
      next += length;
    }
    return { ...meta, parts, received: next };
  } catch {
    return null;
  }
}

async function writeMeta(cache, meta) {
  const { received, ...stored } = meta;
  await cache.put(
    partKey(meta.url, "meta"),
    new Response(JSON.stringify({ ...stored, updated: Date.now() }), { headers: { "content-type": "application/json" } }),
  );
}

/** Store `bytes` (an array of Uint8Array) as the part at `meta.received`, then the record naming it. */
export async function storePart(cache, meta, bytes) {
  const blob = new Blob(bytes);
  if (blob.size === 0) return;
  const offset = meta.received;
  await cache.put(
    partKey(meta.url, `part-${offset}`),
    new Response(blob, { headers: { "content-type": "application/octet-stream", "content-length": String(blob.size) } }),
  );
  meta.parts.push([offset, blob.size]);
  meta.received += blob.size;
  await writeMeta(cache, meta);
}

/** The stored part of `url` at `offset` (a Response), or undefined. */
export async function readPart(cache, url, offset) {
  return cache.match(partKey(url, `part-${offset}`));
}

/** Delete the record and every part of `url`'s unfinished download. */
export async function dropParts(cache, url) {
  const prefix = partKey(url, "");
  for (const request of await cache.keys()) {
    if (request.url.startsWith(prefix)) await cache.delete(request);
  }
}

/**
 * Forget the unfinished download of `url` (its parts), so the next
 * download starts from byte 0. Called by an engine whose load failed on
 * bytes that were complete. Never rejects.
 */
export async function discardDownload(url) {
  if (!("caches" in self)) return;
  try {
    await dropParts(await partsCache(), String(url));
  } catch {
    /* nothing stored */
  }
}

/**
 * The unfinished downloads: `[{url, received, total, updated}]` (bytes;
 * `updated` in ms since the epoch). Never rejects.
 */
export async function unfinishedDownloads() {
  if (!("caches" in self)) return [];
  try {
    const cache = await partsCache();
    const found = [];
    for (const request of await cache.keys()) {
      if (!request.url.endsWith("/meta")) continue;
      const meta = await (await cache.match(request)).json();
      const checked = await readMeta(cache, meta.url);
      if (checked) found.push({ url: checked.url, received: checked.received, total: checked.total, updated: checked.updated });
    }
    return found;
  } catch {
    return [];
  }
}

// ------------------------------------------------------------ when each file was last used

/** Cache Storage name of the record of when each stored model file was last used. */
export const USE_CACHE = "napllm-model-use";

function useKey(url) {
  return `${origin()}/napllm-model-use/${encodeURIComponent(url)}`;
}

/** Record that the stored file `url` was used (downloaded or read by an engine) now. Never rejects. */
export async function touchModel(url) {
  if (!("caches" in self)) return;
  try {
    const body = JSON.stringify({ url: String(url), lastUsed: Date.now() });
    await (await caches.open(USE_CACHE)).put(useKey(String(url)), new Response(body, { headers: { "content-type": "application/json" } }));
  } catch {
    /* no record: the panel says "not recorded" */
  }
}

/** When each file was last used: a Map URL -> ms since the epoch. Never rejects. */
export async function modelUse() {
  const found = new Map();
  if (!("caches" in self)) return found;
  try {
    const cache = await caches.open(USE_CACHE);
    for (const request of await cache.keys()) {
      const value = await (await cache.match(request)).json();
      if (value && typeof value.url === "string" && Number.isFinite(value.lastUsed)) found.set(value.url, value.lastUsed);
    }
  } catch {
    /* unreadable: nothing known */
  }
  return found;
}

/** Forget when `url` was last used (its file was deleted). Never rejects. */
export async function forgetModelUse(url) {
  if (!("caches" in self)) return;
  try {
    await (await caches.open(USE_CACHE)).delete(useKey(String(url)));
  } catch {
    /* nothing stored */
  }
}

/**
 * Whether a build's precache holds `url` (a file that ships with the app,
 * such as TinyChat): it is not copied into `store` as well. Precache keys
 * carry a revision query, hence `ignoreSearch`.
 */
export async function inAppCache(url) {
  try {
    for (const name of await caches.keys()) {
      if (name.includes("-precache-") && (await (await caches.open(name)).match(url, { ignoreSearch: true }))) return true;
    }
  } catch {
    /* unreadable: treated as not held */
  }
  return false;
}

/** The whole stored copy of `url` in cache `store`, or null (and deleted) when it is not `size` bytes long (null: any). */
export async function storedCopy(store, url, size = null) {
  if (!store || !("caches" in self)) return null;
  try {
    const cache = await caches.open(store);
    const response = await cache.match(url);
    if (!response) return null;
    const blob = await response.blob();
    if (size !== null && blob.size !== size) {
      // Not the file the caller expects (kept by a refused attempt, say):
      // never used, and not kept either.
      await cache.delete(url).catch(() => {});
      return null;
    }
    return blob;
  } catch {
    return null;
  }
}

