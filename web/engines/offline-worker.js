/**
 * "Download for offline use" for an engine whose worker lists the files
 * (its spec declares `offline: "engines/offline-worker.js"`; web/js/offline.js
 * calls it; the interface is offline-gguf.js's). A new engine needs no
 * module of its own for it: its worker answers one more message.
 *
 * Rules
 * - The question, asked of a worker of its own that loads no model
 *   (engine-host.js `askWorker`, bounded in time), is `{op: "files",
 *   model, settings, base}` (`base`: the shell page's URL); the answer
 *   `{op: "files", ok: true, files: [{url, store}]}`: each file's URL
 *   (relative ones are read against the page) and the Cache Storage name
 *   the engine reads it from (null: fetched through the service worker).
 * - At most `MAX_FILES` files, each of http(s) only; anything else (no
 *   answer, a malformed one) lists nothing, so nothing is offered.
 * - A file's ceiling is its engine's `weights` rule for it (the spec's), or
 *   limits.js `MAX_ONNX_OTHER_BYTES` for a file no rule names.
 * - The list of kept files is recorded (`recorded`); other connections of
 *   the same model are not known to read them (`readPlaces` names none).
 */

import { declarationOf } from "./declarations.js";
import { askWorker } from "./engine-host.js";
import { MAX_ONNX_OTHER_BYTES } from "./limits.js";

/** More files than an engine's model has: a list naming more is refused. */
export const MAX_FILES = 512;

export const recorded = true;

/** Nothing is computed from the connection alone: the kept list is recorded. */
export function modelFiles() {
  return [];
}

/** No file is known to be read without the recorded list. */
export async function readPlaces() {
  return { urls: [], folders: [] };
}

/** The ceiling of `url` by the declaration's `weights` rules. */
function limitFor(declaration, url) {
  let path = "";
  try {
    path = new URL(url).pathname.toLowerCase();
  } catch {
    return MAX_ONNX_OTHER_BYTES;
  }
  for (const rule of Array.isArray(declaration.weights) ? declaration.weights : []) {
    if (!rule || !Number.isSafeInteger(rule.limit)) continue;
    if (typeof rule.suffix === "string" && path.endsWith(rule.suffix.toLowerCase())) return rule.limit;
    try {
      if (typeof rule.pattern === "string" && new RegExp(rule.pattern, "i").test(path)) return rule.limit;
    } catch {
      // a malformed pattern names nothing
    }
  }
  return MAX_ONNX_OTHER_BYTES;
}

/** The worker's list (module rules), or null. */
export async function offlinePlan(connection) {
  const declaration = await declarationOf(connection?.kind);
  if (!declaration || typeof declaration.worker !== "string") return null;
  const question = {
    op: "files",
    model: String(connection.model ?? ""),
    settings: connection.settings && typeof connection.settings === "object" ? connection.settings : {},
    base: document.baseURI,
  };
  const data = await askWorker(declaration.worker, question, "files");
  if (!data || data.ok !== true || !Array.isArray(data.files) || data.files.length > MAX_FILES) return null;
  const files = [];
  for (const file of data.files) {
    let url;
    try {
      url = new URL(String(file?.url), document.baseURI);
    } catch {
      return null;
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") return null;
    files.push({ url: url.href, store: typeof file.store === "string" && file.store ? file.store : null });
  }
  return files.length ? { files, limit: (url) => limitFor(declaration, url) } : null;
}
