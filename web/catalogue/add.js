/**
 * One click from a catalogue entry to a ready connection.
 *
 * Rules (docs/security.md, "A catalogue download is the file the catalogue names")
 * - Nothing is fetched before the user's click; a licence-gated entry is
 *   added only once the user ticked that they accept its licence (view.js).
 * - An engine whose files the catalogue lists (`files: "listed"` in the
 *   catalogue's engine table, e.g. a GGUF for llama.cpp):
 *   1. the size of every file is asked of the host first (`HEAD`, bounded
 *      in time): a host that names no size, or a size other than one the
 *      catalogue confirms (an entry not marked estimate), is refused before
 *      any byte of the weights;
 *   2. the space check (storage.js `roomCheck`) comes next;
 *   3. every size is checked against the ceiling its engine names
 *      (limits.js) before any file is downloaded; each file then goes
 *      through the resumable download (engines/download.js) into the
 *      engine's store, at exactly the confirmed size;
 *   4. where the catalogue publishes a sha256, the stored file is hashed
 *      part by part (hash-wasm): a mismatch deletes the file (and any
 *      unfinished parts), says so, and no connection is made; a refusal
 *      also deletes the entry's other files that this attempt or an
 *      earlier unfinished attempt of the same entry stored (a file stored
 *      otherwise stays: another connection may use it). Which files an
 *      unfinished attempt stored is kept in this browser's `localStorage`
 *      (`ATTEMPTS_KEY`, by entry id, only URLs of that entry's files), so
 *      a download cut in one attempt and refused in the next leaves
 *      nothing behind. A refusal is a `CatalogueRefusal` or a
 *      `DownloadNoRoom` (the entry does not fit: no file of it is kept);
 *      any other failure keeps the files this attempt verified and the
 *      cut file's parts (recorded, to resume), but never a stored copy of
 *      a file this attempt did not verify (the service worker keeps any
 *      answer it found self-consistent, including one the page refused);
 *   5. only then is the connection added, its settings from the entry.
 * - An engine that lists its own files (WebLLM, transformers.js): the
 *   connection is added, then its files downloaded for offline use
 *   (offline.js), with that path's own checks (sizes a WebLLM list names).
 * - Every failure is a fixed sentence of ours; no text of a host is shown.
 */

import * as limits from "../engines/limits.js";
import { timedFetch } from "../engines/bounded.js";
import { describeProgress, downloadModelFile, forgetModelUse } from "../engines/download.js";
import { discardDownload } from "../engines/download-store.js";
import { downloadForOffline } from "../js/offline.js";
import { roomCheck } from "../engines/room.js";
import { isCeilingName } from "./fit.js";

/** How long a host may take to answer the size request. */
export const SIZE_TIMEOUT_MS = 15_000;

/** A refusal with a sentence to show. */
export class CatalogueRefusal extends Error {}

/** The size (bytes) the host names for `url`, or null; never rejects. */
export async function hostSize(url, fetchFn = (input, init) => fetch(input, init)) {
  try {
    const timed = timedFetch(fetchFn, { headersMs: SIZE_TIMEOUT_MS });
    const response = await timed(url, { method: "HEAD", cache: "no-store" });
    if (!response.ok) return null;
    const size = Number(response.headers.get("content-length"));
    return Number.isSafeInteger(size) && size > 0 ? size : null;
  } catch {
    return null;
  }
}

/** SHA-256 of `blob` as 64 hex digits, read part by part. */
export async function sha256Of(blob) {
  const { createSHA256 } = await import("../vendor/hash-wasm/hash-wasm.js");
  const hasher = await createSHA256();
  hasher.init();
  const reader = blob.stream().getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    hasher.update(value);
  }
  return hasher.digest("hex");
}

/** `localStorage` key: `{entryId: [url, ...]}`, the files unfinished attempts stored. */
export const ATTEMPTS_KEY = "napllm.catalogue.unfinished";

function readAttempts() {
  try {
    const value = JSON.parse(localStorage.getItem(ATTEMPTS_KEY) ?? "{}");
    return value && typeof value === "object" && !Array.isArray(value) ? value : {};
  } catch {
    return {};
  }
}

/** The URLs of `entry`'s files that an earlier unfinished attempt stored. */
function earlierAttempt(entry) {
  const urls = readAttempts()[entry.id];
  const own = new Set(entry.files.map((file) => file.url));
  return Array.isArray(urls) ? urls.filter((url) => typeof url === "string" && own.has(url)) : [];
}

/** Record (or, with none, forget) the files `entry`'s unfinished attempts stored. */
function keepAttempt(entry, urls) {
  try {
    const attempts = readAttempts();
    if (urls.length) attempts[entry.id] = [...new Set(urls)];
    else delete attempts[entry.id];
    if (Object.keys(attempts).length) localStorage.setItem(ATTEMPTS_KEY, JSON.stringify(attempts));
    else localStorage.removeItem(ATTEMPTS_KEY);
  } catch {
    // No storage: a later refusal keeps what this attempt stored.
  }
}

/** Delete `url`'s stored copy from `store` (its unfinished parts stay, to resume). */
async function dropStoredCopy(url, store) {
  if (store && "caches" in globalThis) await (await caches.open(store)).delete(url);
  await forgetModelUse(url);
}

/** Delete `url`'s stored copy and its unfinished parts. */
async function forgetFile(url, store) {
  await dropStoredCopy(url, store);
  await discardDownload(url);
}

async function isStored(url, store) {
  if (!store || !("caches" in globalThis)) return false;
  return Boolean(await (await caches.open(store)).match(url));
}

/**
 * Confirm, check room for, download and verify the listed files of `entry`.
 * `fresh` (an array) receives the URL of each file this attempt starts to
 * store that was not stored before, so a refusal can take them back;
 * `verified` the URL of each file that passed every check.
 */
async function downloadListed(entry, engine, onProgress, fresh, verified) {
  // Only a byte ceiling of limits.js (fit.js keeps no other name).
  const named = isCeilingName(engine.ceiling) && Object.hasOwn(limits, engine.ceiling) ? limits[engine.ceiling] : null;
  const ceiling = Number.isSafeInteger(named) && named > 0 ? named : limits.MAX_GGUF_MODEL_BYTES;
  const sizes = [];
  for (const file of entry.files) {
    const size = await hostSize(file.url);
    if (size === null) throw new CatalogueRefusal(`The model host did not say how large ${entry.name} is, so nothing was downloaded. Try again later.`);
    if (!file.estimate && size !== file.bytes) {
      throw new CatalogueRefusal(`The model host offers a file of another size than the catalogue lists for ${entry.name}, so nothing was downloaded.`);
    }
    sizes.push(size);
  }
  // Every size against the ceiling before any byte of any file.
  if (sizes.some((size) => size > ceiling)) throw new CatalogueRefusal(`${entry.name} is larger than this shell accepts for its engine.`);
  const { ok, room } = await roomCheck(entry.files.map((file) => file.url));
  if (!ok) throw new CatalogueRefusal(`${entry.name} does not fit in this browser's storage.`);
  let left = room;
  for (let index = 0; index < entry.files.length; index += 1) {
    const file = entry.files[index];
    // Counted before its bytes come: a cut leaves parts to take back too.
    const stored = await isStored(file.url, engine.store);
    if (!stored) fresh.push(file.url);
    const blob = await downloadModelFile(file.url, {
      // A file not stored is asked of the host past the HTTP cache, which
      // may hold an answer an earlier attempt refused (its parts still resume).
      fresh: !stored,
      limit: ceiling,
      size: sizes[index],
      gguf: engine.gguf,
      store: engine.store,
      room: left,
      onProgress: (event) => {
        const part = event.total ? Math.min(1, event.received / event.total) : 0;
        onProgress(`Downloading ${entry.name} — ${describeProgress(event)}`, Math.min(0.99, (index + part) / entry.files.length));
      },
    });
    if (left !== null) left = Math.max(0, left - blob.size);
    if (file.sha256) {
      onProgress(`Checking ${entry.name}`, 0.99);
      if ((await sha256Of(blob)) !== file.sha256) {
        await forgetFile(file.url, engine.store);
        throw new CatalogueRefusal(`The downloaded file of ${entry.name} does not match the checksum the catalogue publishes, so it was deleted and no connection was made.`);
      }
    }
    verified.push(file.url);
  }
}

/** The connection the form would send for `entry` (JSON text for `addConnection`). */
export function connectionJson(entry, engine) {
  const settings = { ...entry.settings };
  if (engine.urlSetting) settings[engine.urlSetting] = entry.files[0].url;
  return JSON.stringify({
    name: entry.name, kind: entry.engine, model: entry.model, settings,
    credential: null, capabilities: {}, charges: false,
  });
}

/**
 * Add `entry` of `catalogue` (fit.js's records) as a ready connection
 * (module rules). `runtime`: the page API (`addConnection`);
 * `onProgress(label, fraction)`: fraction 0..1. Resolves with `{ok: true,
 * connection}` (the summary) or `{ok: false, text}`; never rejects.
 */
export async function addFromCatalogue(entry, catalogue, runtime, onProgress = () => {}) {
  const engine = catalogue.engines[entry.engine];
  const fresh = [];
  const verified = [];
  const hasFiles = Array.isArray(entry?.files);
  const earlier = hasFiles ? earlierAttempt(entry) : [];
  try {
    if (!engine || !runtime) throw new CatalogueRefusal("This model cannot be added here.");
    if (engine.files === "listed") await downloadListed(entry, engine, onProgress, fresh, verified);
    const answer = JSON.parse(await runtime.addConnection(connectionJson(entry, engine)));
    if (!answer || typeof answer.id !== "string") {
      throw new CatalogueRefusal(typeof answer?.error === "string" ? answer.error : "The connection could not be added.");
    }
    if (engine.files !== "listed") {
      const stored = await downloadForOffline(answer, onProgress);
      if (stored !== "stored") return { ok: false, connection: answer, text: `The connection ${entry.name} was added, but its model is not downloaded yet.` };
    }
    keepAttempt(entry, []);
    onProgress(`${entry.name} is ready`, 1);
    return { ok: true, connection: answer };
  } catch (error) {
    const text = error instanceof CatalogueRefusal
      ? error.message
      : ["DownloadRestarted", "DownloadInterrupted", "DownloadNoRoom", "DownloadStalled", "DownloadTooLarge", "NotAModel"].includes(error?.name)
        ? `${entry.name} could not be downloaded: ${error.message}.`
        : `${entry.name} could not be added.`;
    if (error instanceof CatalogueRefusal || error?.name === "DownloadNoRoom") {
      // A refused entry never becomes a connection: the files this attempt
      // stored go too (one file of two is no model).
      for (const url of new Set([...earlier, ...fresh])) await forgetFile(url, engine?.store).catch(() => {});
      if (hasFiles) keepAttempt(entry, []);
    } else {
      // The files this attempt verified stay, to resume on the next click,
      // and so do a cut file's parts (recorded, so that a refusal of a
      // later attempt takes them back); a stored copy this attempt did not
      // verify does not (the page never accepted it).
      for (const url of fresh) {
        if (!verified.includes(url)) await dropStoredCopy(url, engine?.store).catch(() => {});
      }
      if (hasFiles) keepAttempt(entry, [...earlier, ...fresh]);
      console.error("napllm: a catalogue download failed", error?.name ?? "");
    }
    onProgress(text, -1);
    return { ok: false, text };
  }
}
