/**
 * "Download for offline use" of a GGUF connection (the spec's `offline`;
 * web/js/offline.js calls it): the GGUF URL, every shard of a split model
 * (`-00001-of-0000N.gguf`), checked as GGUF and kept in the service
 * worker's model cache `napllm-models` under each URL (the cache the
 * engine looks in first).
 *
 * Rules (the interface every engine's offline module exports)
 * - `recorded`: whether the list of kept files is recorded once downloaded
 *   (false here: a connection's files follow from its URL alone, so a GGUF
 *   the engine loaded counts as stored too).
 * - `modelFiles(connection)`: the files computed from the connection
 *   (`[{url, gguf, store}]`, `[]` when its URL names none: no button).
 * - `readPlaces(connection)`: where the engine reads the model, downloaded
 *   or not (`{urls, folders, paths?}`).
 * - `offlinePlan(connection)`: what the download keeps (`{files, limit(url),
 *   budget}`, `budget`: bytes all shards share), or null.
 */

import { MAX_GGUF_MODEL_BYTES } from "./limits.js";

import { MODEL_CACHE } from "./room.js";
const SPLIT = /-(\d{5})-of-(\d{5})\.gguf$/i;
/** More shards than any real split model has: a URL claiming more is refused. */
export const MAX_SHARDS = 512;

export const recorded = false;

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

/** The files `connection` (a public summary: `{settings: {url}}`) reads: `[{url, gguf, store}]`. */
export function modelFiles(connection) {
  const settings = connection && typeof connection.settings === "object" && connection.settings ? connection.settings : {};
  if (typeof settings.url !== "string") return [];
  return ggufShards(settings.url).map((url) => ({ url, gguf: true, store: MODEL_CACHE }));
}

/** The exact URLs the engine reads. */
export async function readPlaces(connection) {
  return { urls: modelFiles(connection).map((file) => file.url), folders: [] };
}

/** Every shard, under one byte ceiling for all of them together. */
export async function offlinePlan(connection) {
  const files = modelFiles(connection);
  return files.length ? { files, limit: () => MAX_GGUF_MODEL_BYTES, budget: MAX_GGUF_MODEL_BYTES } : null;
}
