/**
 * Model files an older build let wllama keep in its own OPFS cache (the
 * wasm engine now downloads each file itself into the model cache). The
 * wasm spec declares this module as its `leftovers`; the storage panel
 * (web/js/pwa.js) lists and deletes such files through it, as through any
 * engine's (`list(verified)`, `remove(name)`), without naming the engine.
 */

/** The OPFS folder wllama keeps its own downloads in. */
const WLLAMA_FOLDER = "cache";

async function cacheManager() {
  const { CacheManager } = await import("../vendor/wllama/wllama.js");
  return new CacheManager();
}

/**
 * The files wllama kept: `[{name, url, bytes}]`. Those whose URL is in
 * `verified` (a Set of URLs with a verified copy in the model cache) are
 * removed here, once. Never rejects; `[]` without OPFS or without wllama's folder.
 */
export async function list(verified) {
  try {
    const root = await navigator.storage.getDirectory();
    await root.getDirectoryHandle(WLLAMA_FOLDER); // throws when wllama never stored anything
    const cache = await cacheManager();
    const files = (await cache.list()).map((entry) => ({
      name: entry.name,
      url: String(entry.metadata?.originalURL || entry.name),
      bytes: Number(entry.size),
    }));
    const replaced = files.filter((file) => verified.has(file.url));
    if (replaced.length > 0) {
      const names = new Set(replaced.map((file) => file.name));
      await cache.deleteMany((entry) => names.has(entry.name));
    }
    return files.filter((file) => !verified.has(file.url));
  } catch {
    return [];
  }
}

/** Delete the kept file `name`. Rejects when it cannot. */
export async function remove(name) {
  await (await cacheManager()).delete(name);
}
