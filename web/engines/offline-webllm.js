/**
 * "Download for offline use" of a WebLLM connection (the spec's `offline`;
 * web/js/offline.js calls it; the interface is offline-gguf.js's).
 *
 * Rules
 * - The files are what WebLLM reads for the model record, in WebLLM's
 *   cache scopes, keyed by URL, where it looks before any download: the
 *   record's `mlc-chat-config.json` (cache `webllm/config`), the tokenizer
 *   it names, `tensor-cache.json` and every parameter shard it lists
 *   (`webllm/model`), and the model library (`webllm/wasm`). The two lists
 *   are downloaded first (`first`), then read to list the rest (`rest()`).
 * - A shard is kept only at the size (`nbytes`) the list names for it; a
 *   list naming files outside the model's folder, or more than
 *   `MAX_SHARDS`, is refused (`NotAModel`).
 * - The list of kept files is recorded (`recorded`).
 */

import { NotAModel } from "./download.js";
import { MAX_WEBLLM_FILE_BYTES } from "./limits.js";
import { MAX_SHARDS } from "./offline-gguf.js";

export const recorded = true;

/** The model record's files (webllm-engine.js reads them without the bundle), or null. */
async function recordOf(connection) {
  const engine = await import("./webllm-engine.js");
  return engine.modelRecordFiles(String(connection?.model ?? ""));
}

/** A JSON file kept by the download, read back (`{}` when unreadable). */
async function keptJson(file) {
  try {
    const response = await (await caches.open(file.store)).match(file.url);
    return response ? await response.json() : {};
  } catch {
    return {};
  }
}

/** Nothing is computed from the connection alone: the kept list is recorded. */
export function modelFiles() {
  return [];
}

/** The record's folder and its model library. */
export async function readPlaces(connection) {
  const record = await recordOf(connection);
  return record ? { urls: [record.library], folders: [record.folder] } : { urls: [], folders: [] };
}

/** The two lists first, then the files they name (module rules), or null. */
export async function offlinePlan(connection) {
  const record = await recordOf(connection);
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
