/**
 * "Download for offline use" of an ONNX connection (the spec's `offline`;
 * web/js/offline.js calls it; the interface is offline-gguf.js's).
 *
 * Rules
 * - Where the model is read comes from the connection's settings: the
 *   runtime resolved it once (`settings.source`: `{kind: "path", base,
 *   model}` or `{kind: "hub", model}`, providers/engine_onnx.py
 *   `onnx_settings`); this module keeps no copy of that rule. A connection
 *   without it offers nothing.
 * - The files are transformers.js's own list (`ModelRegistry.get_files`),
 *   asked of a transformers.js worker of its own that loads no model (its
 *   `files` answer), for WebGPU and the connection's dtype: the model's
 *   files go into the library's cache `transformers-cache` for a folder of
 *   another origin or the hub; the engine's bundle and onnxruntime's wasm
 *   (and a model folder of this origin) are fetched through the service
 *   worker, which keeps them once fetched (store null).
 * - The list of kept files is recorded (`recorded`).
 */

import { askWorker } from "./engine-host.js";
import { onnxLimit } from "./bounded.js";

/** The onnx engine's worker (its spec's `worker`). */
const WORKER = "engines/transformers-worker.js";

export const recorded = true;

/** The source the runtime resolved for `connection`, or null. */
function sourceOf(connection) {
  const settings = connection && typeof connection.settings === "object" && connection.settings ? connection.settings : {};
  const source = settings.source;
  if (!source || typeof source !== "object" || typeof source.model !== "string") return null;
  if (source.kind === "path" && typeof source.base === "string") return { kind: "path", base: source.base, model: source.model };
  return source.kind === "hub" ? { kind: "hub", model: source.model } : null;
}

/** Nothing is computed from the connection alone: the kept list is recorded. */
export function modelFiles() {
  return [];
}

/**
 * The model folder (or, for a hub id, the path `/<id>/` on any host: the
 * page does not name transformers.js's default host, which can only count a
 * file as read by more connections, never less).
 */
export async function readPlaces(connection) {
  const source = sourceOf(connection);
  if (!source) return { urls: [], folders: [] };
  if (source.kind === "hub") return { urls: [], folders: [], paths: [`/${source.model}/`] };
  try {
    return { urls: [], folders: [`${new URL(source.base, document.baseURI).href}${source.model}/`] };
  } catch {
    return { urls: [], folders: [] };
  }
}

/** transformers.js's list for the connection's source and dtype, or null. */
export async function offlinePlan(connection) {
  const source = sourceOf(connection);
  if (!source) return null;
  if (source.kind === "path") source.base = new URL(String(source.base), document.baseURI).href;
  const settings = connection.settings;
  const dtype = typeof settings.dtype === "string" ? settings.dtype : "";
  const data = await askWorker(WORKER, { op: "files", source, device: "webgpu", dtype }, "files");
  if (!data || data.ok !== true || !Array.isArray(data.urls) || !Array.isArray(data.engine)) return null;
  const cache = data.cache ? String(data.cache) : null;
  const files = [
    ...data.engine.map((url) => ({ url: String(url), store: null })),
    ...data.urls.map((url) => ({ url: String(url), store: cache })),
  ];
  return { files, limit: onnxLimit };
}
