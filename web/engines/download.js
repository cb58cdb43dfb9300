/**
 * Resumable model downloads: one module every engine (and the page's
 * "Download for offline use") fetches model files through.
 *
 * Rules (docs/security.md, "Stored data": downloads are bounded and resumed
 * only from verified bytes)
 * - A file is downloaded into *parts*: its bytes so far, already checked,
 *   kept in the Cache Storage cache `napllm-download-parts` together with a
 *   record of the file (`meta`: URL, total length, validator, content type,
 *   the parts' offsets). A part is written before the record that names it,
 *   so a record never names bytes that are not stored. When the download
 *   is cut (the body errors, the tab closes), what arrived stays there.
 * - The next attempt (right away: up to `RETRIES` times while each attempt
 *   adds bytes; a restart from zero adds none; or after a reload, in
 *   another tab, by another engine) asks for the rest only:
 *   `Range: bytes=<received>-` with `If-Range:` the stored validator (a
 *   strong ETag, else a strong Last-Modified: `validatorOf`). It continues
 *   only when the answer is `206` with `Content-Range: bytes <received>-<total-1>/<total>`
 *   for the same total, repeating the stored validator exactly (a `206`
 *   without it or with another is another file: restart `changed`). A `200`
 *   means the file changed (another validator: restart `changed`) or the
 *   host ignores ranges (restart `no-ranges`); the stored parts are then
 *   dropped and the `200` body is the new download from byte 0. A file with
 *   no validator, no declared length or a compressed body is never resumed:
 *   its bytes are not stored as parts (a cut fails the download at once).
 * - Every check of a whole answer holds over the joined bytes: status (200,
 *   or 206 for the rest), a content type that is not text, HTML, JSON or
 *   XML (`binary`), the GGUF magic at byte 0 (`gguf`), exactly the declared
 *   total, and at most `limit` bytes (the ceiling of the file's kind,
 *   limits.js; a declared total above it fails before any byte is read).
 *   Nothing partial is ever handed to an engine: the result is the whole
 *   file or an error.
 * - Once whole, the file is put into the cache `store` (when given: the
 *   cache its engine reads from; not a file a build's precache holds, which
 *   ships with the app), and its parts are deleted. When a file
 *   of a `store` was last used (downloaded, or read from there) is kept in
 *   the cache `napllm-model-use` (`modelUse`), for the Storage panel.
 * - One download per URL across tabs and workers of this origin: the
 *   download runs under the Web Lock `napllm-download <url>`. A second
 *   caller waits for the lock and meanwhile reports the first one's
 *   progress (BroadcastChannel `napllm-downloads`); with the lock it finds
 *   the file in `store` (or resumes from the parts the first one left).
 * - Progress (`onProgress`): `{url, received, total, bytesPerSecond,
 *   secondsLeft, resumedFrom, restarted, shared}`; `restarted` is null or
 *   the reason the download began again from zero; `shared`: the bytes are
 *   another tab's download. At most every `PROGRESS_MS`.
 * - Errors: `NotAModel` (status, type, magic, length; `type:
 *   "download_error"`; the parts are dropped), `DownloadTooLarge`
 *   (bounded.js; dropped too), `DownloadRestarted` (the retries were spent
 *   on restarts from zero; says why) or, when the retries are spent, the network's
 *   error (a cut body, no answer at all, or a host error 5xx/408/429: the
 *   parts stay for the next try). `discardDownload(url)` forgets an
 *   unfinished download (the Storage panel's Delete).
 * - Layout: this module is the fetch and resume loop; the parts store,
 *   the records of use and the lookups of whole copies are
 *   download-store.js.
 * - Own code, not a library: Workbox's range support only answers ranges
 *   from a whole cached copy, and the download libraries for browsers keep
 *   their bytes in memory or hand them to a file picker; none checks bytes
 *   before keeping them or resumes across tabs and reloads.
 */

import { DownloadTooLarge } from "./bounded.js";
import {
  dropParts, inAppCache, partsCache, readMeta, readPart, storedCopy, storePart, touchModel,
} from "./download-store.js";

// The parts store and the records of use live in download-store.js; the
// page and the engines import them from here as before.
export {
  discardDownload, forgetModelUse, modelUse, PARTS_CACHE, touchModel, unfinishedDownloads, USE_CACHE,
} from "./download-store.js";

/** BroadcastChannel name on which downloads report progress to other tabs. */
export const CHANNEL = "napllm-downloads";
/** Bytes gathered in memory before they are stored as one part. */
const PART_BYTES = 8 * 1024 * 1024;
/** Attempts after a cut, each of which must add bytes. */
const RETRIES = 4;
/** Wait before the n-th retry (ms): RETRY_MS * 2^(n-1). */
const RETRY_MS = 300;
const PROGRESS_MS = 100;
const GGUF_MAGIC = [0x47, 0x47, 0x55, 0x46];
const NOT_BINARY = /^text\/|html|json|xml/i;

/** A download that is no model file (status, type, magic or length). */
export class NotAModel extends Error {
  constructor(reason) {
    super(reason);
    this.name = "NotAModel";
    this.type = "download_error";
  }
}

/**
 * The tries ran out while each began again from zero: `reason` is
 * `"changed"` (the file changed on the server at every try) or
 * `"no-ranges"` (the server cannot resume and the body broke off at every
 * try). The parts of the last try stay. The message is this module's own
 * text, fit for the user.
 */
export class DownloadRestarted extends Error {
  constructor(reason, tries) {
    super(reason === "changed"
      ? `the file changed on the server at every try (${tries} tries)`
      : `the server cannot resume downloads and the download broke off at every try (${tries} tries)`);
    this.name = "DownloadRestarted";
    this.type = "download_error";
    this.reason = reason;
  }
}

/** The body broke off before the whole file arrived (the parts are kept). */
class Cut extends Error {
  constructor(cause) {
    super("the download was cut off");
    this.name = "DownloadCut";
    this.cause = cause;
  }
}

// ------------------------------------------------------------ validators

/**
 * The validator `If-Range` may carry (RFC 9110 13.1.5, which compares
 * strongly): a strong ETag; else, only when the file has no ETag at all,
 * Last-Modified when it is strong (8.8.2.2: the answer's Date is at least
 * one second later); else null (the file is not resumed). A weak ETag
 * (`W/`) is never sent, and hides the date too.
 */
function validatorOf(headers) {
  const etag = headers.get("etag");
  if (etag) return etag.startsWith("W/") ? null : { etag, lastModified: null };
  const lastModified = headers.get("last-modified");
  if (!lastModified) return null;
  const modified = Date.parse(lastModified);
  const date = Date.parse(headers.get("date") || "");
  return Number.isFinite(modified) && Number.isFinite(date) && date - modified >= 1000
    ? { etag: null, lastModified }
    : null;
}

/** Whether a 200's `headers` name another version than the stored validator `stored` (for the progress text). */
function changed(stored, headers) {
  if (!stored) return false;
  if (stored.etag) return headers.has("etag") && headers.get("etag") !== stored.etag;
  return headers.has("last-modified") && headers.get("last-modified") !== stored.lastModified;
}

/**
 * Whether a 206's `headers` repeat the stored validator exactly: the same
 * strong ETag (the stored one is strong, so equal text is the strong
 * comparison), else the same Last-Modified. A 206 that lacks it or carries
 * another is of another file, whatever If-Range asked for.
 */
function sameFile(stored, headers) {
  if (!stored) return false;
  if (stored.etag) return headers.get("etag") === stored.etag;
  return Boolean(stored.lastModified) && headers.get("last-modified") === stored.lastModified;
}

/** `[start, end, total]` of a `Content-Range: bytes start-end/total`, else null. */
function contentRange(headers) {
  const match = /^bytes (\d+)-(\d+)\/(\d+)$/.exec(headers.get("content-range") || "");
  if (!match) return null;
  const values = match.slice(1).map(Number);
  return values.every(Number.isSafeInteger) ? values : null;
}

// ------------------------------------------------------------ progress

/** Reports progress at most every PROGRESS_MS, with speed and time left. */
class Meter {
  constructor(url, onProgress, channel) {
    this.url = url;
    this.onProgress = onProgress;
    this.channel = channel;
    this.last = 0;
    this.samples = [];
    this.resumedFrom = 0;
    this.restarted = null;
  }

  report(received, total, force = false) {
    const now = Date.now();
    this.samples.push([now, received]);
    while (this.samples.length > 2 && now - this.samples[0][0] > 3000) this.samples.shift();
    if (!force && now - this.last < PROGRESS_MS) return;
    this.last = now;
    const [t0, b0] = this.samples[0];
    const bytesPerSecond = now > t0 && received >= b0 ? ((received - b0) * 1000) / (now - t0) : 0;
    const secondsLeft = total && bytesPerSecond > 0 ? Math.max(0, (total - received) / bytesPerSecond) : null;
    const event = {
      url: this.url,
      received,
      total,
      bytesPerSecond,
      secondsLeft,
      resumedFrom: this.resumedFrom,
      restarted: this.restarted,
      shared: false,
    };
    try {
      this.onProgress(event);
    } catch {
      /* a failing reporter never breaks a download */
    }
    if (this.channel) this.channel.postMessage({ type: "progress", ...event });
  }
}

function bytesText(bytes) {
  const units = ["B", "kB", "MB", "GB"];
  let amount = Number(bytes) || 0;
  let unit = 0;
  while (amount >= 1000 && unit < units.length - 1) {
    amount /= 1000;
    unit += 1;
  }
  return unit === 0 ? `${amount} B` : `${amount.toFixed(amount < 10 ? 1 : 0)} ${units[unit]}`;
}

/**
 * One line for a progress event (`onProgress`): "12 MB of 40 MB, 2.1 MB/s,
 * 14 s left", with why it began again or where it resumed.
 */
export function describeProgress(event) {
  if (!event) return "";
  const parts = [event.total ? `${bytesText(event.received)} of ${bytesText(event.total)}` : bytesText(event.received)];
  if (event.bytesPerSecond > 0) parts.push(`${bytesText(event.bytesPerSecond)}/s`);
  if (Number.isFinite(event.secondsLeft) && event.secondsLeft !== null) parts.push(`${Math.ceil(event.secondsLeft)} s left`);
  let text = parts.join(", ");
  if (event.restarted === "no-ranges") text += " (the server cannot resume downloads: started again)";
  else if (event.restarted === "changed") text += " (the file changed on the server: started again)";
  else if (event.resumedFrom > 0) text += ` (resumed at ${bytesText(event.resumedFrom)})`;
  if (event.shared) text += " (in another tab)";
  return text;
}

// ------------------------------------------------------------ one attempt

/**
 * Check the headers of an answer that starts at byte 0 (status 200) and
 * return `{total, resumable}`; throws NotAModel / DownloadTooLarge.
 */
function checkWhole(response, { binary, limit }) {
  if (response.status !== 200 || !response.body) throw new NotAModel(`status ${response.status}`);
  if (binary && NOT_BINARY.test(response.headers.get("content-type") || "")) {
    throw new NotAModel("not a model content type");
  }
  const encoding = (response.headers.get("content-encoding") || "identity").toLowerCase();
  const declared = Number(response.headers.get("content-length"));
  const hasLength = response.headers.has("content-length") && Number.isSafeInteger(declared) && declared >= 0;
  if (hasLength && declared > limit) throw new DownloadTooLarge("the declared length is above the ceiling");
  const total = encoding === "identity" && hasLength ? declared : null;
  const ranges = (response.headers.get("accept-ranges") || "").toLowerCase() !== "none";
  return { total, resumable: total !== null && ranges && validatorOf(response.headers) !== null };
}

/**
 * Read `response`'s body into `state` from `state.received` on, checking
 * magic, length and ceiling; stores parts when `state.meta` is set.
 * Resolves when the body ended; throws NotAModel, DownloadTooLarge or Cut.
 */
async function readBody(response, state, options, meter) {
  const { gguf, limit } = options;
  const reader = response.body.getReader();
  let buffered = [];
  let size = 0;
  const flush = async () => {
    if (size === 0) return;
    const bytes = buffered;
    buffered = [];
    size = 0;
    if (state.meta) await storePart(state.cache, state.meta, bytes);
    else state.memory.push(new Blob(bytes));
  };
  let seen = state.received;
  try {
    for (;;) {
      let step;
      try {
        step = await reader.read();
      } catch (error) {
        throw new Cut(error);
      }
      if (step.done) break;
      const value = step.value;
      if (gguf && seen < GGUF_MAGIC.length) {
        for (let i = 0; seen + i < GGUF_MAGIC.length && i < value.byteLength; i += 1) {
          if (value[i] !== GGUF_MAGIC[seen + i]) throw new NotAModel("not a GGUF file");
        }
      }
      seen += value.byteLength;
      if (state.total !== null && seen > state.total) throw new NotAModel("longer than declared");
      if (seen > limit) throw new DownloadTooLarge();
      buffered.push(value);
      size += value.byteLength;
      if (size >= PART_BYTES) {
        await flush();
        state.received = seen;
      }
      meter.report(seen, state.total);
    }
  } catch (error) {
    reader.cancel().catch(() => {});
    if (error instanceof Cut && state.meta) {
      // What arrived is checked so far: keep it for the next attempt.
      await flush().catch(() => {});
      state.received = state.meta.received;
    }
    throw error;
  }
  await flush();
  state.received = seen;
  if (gguf && seen < GGUF_MAGIC.length) throw new NotAModel("not a GGUF file");
  if (state.total !== null && seen !== state.total) throw new NotAModel("incomplete file");
}

/** Start `state` afresh from the 200 `response` (byte 0). */
async function startWhole(response, state, options, meter) {
  const { total, resumable } = checkWhole(response, options);
  if (state.cache) await dropParts(state.cache, state.url);
  state.total = total;
  state.received = 0;
  state.memory = [];
  state.meta = resumable && state.cache
    ? {
      url: state.url,
      total,
      validator: validatorOf(response.headers),
      type: response.headers.get("content-type") || "application/octet-stream",
      parts: [],
      received: 0,
    }
    : null;
  state.type = response.headers.get("content-type") || "application/octet-stream";
  state.validator = validatorOf(response.headers);
  meter.resumedFrom = 0;
  await readBody(response, state, options, meter);
}

/** Note that this attempt begins again from byte 0, and why (`"changed"` or `"no-ranges"`). */
function restarting(state, meter, reason) {
  meter.restarted = reason;
  state.restarted = reason;
}

/** One request: the rest after the stored parts, or the whole file. */
async function attempt(state, options, meter) {
  const { fresh } = options;
  // A request that never got an answer (offline, host unreachable) is a
  // cut: the stored parts stay.
  const fetchFn = (url, init) => options.fetchFn(url, init).catch((error) => {
    throw error instanceof TypeError && !options.signal?.aborted ? new Cut(error) : error;
  });
  const init = { cache: fresh ? "reload" : "default", signal: options.signal, headers: options.headers };
  const meta = state.meta;
  if (!meta || meta.received === 0) {
    await startWhole(await fetchFn(state.url, init), state, options, meter);
    return;
  }
  const validator = meta.validator.etag || meta.validator.lastModified;
  // no-store: a range answer is not worth keeping in the HTTP cache.
  const response = await fetchFn(state.url, {
    ...init,
    cache: "no-store",
    headers: { ...options.headers, Range: `bytes=${meta.received}-`, "If-Range": validator },
  });
  if (response.status === 206) {
    const range = contentRange(response.headers);
    const encoding = (response.headers.get("content-encoding") || "identity").toLowerCase();
    if (!range || range[0] !== meta.received || range[2] !== meta.total || range[1] !== meta.total - 1
      || encoding !== "identity" || !sameFile(meta.validator, response.headers)) {
      // Not the rest of the same file: start again from zero.
      response.body?.cancel().catch(() => {});
      await dropParts(state.cache, state.url);
      state.meta = null;
      restarting(state, meter, "changed");
      await startWhole(await fetchFn(state.url, init), state, options, meter);
      return;
    }
    if (options.binary && NOT_BINARY.test(response.headers.get("content-type") || "")) {
      response.body?.cancel().catch(() => {});
      throw new NotAModel("not a model content type");
    }
    state.total = meta.total;
    state.received = meta.received;
    meter.resumedFrom = meta.received;
    await readBody(response, state, options, meter);
    return;
  }
  if (response.status === 200) {
    restarting(state, meter, changed(meta.validator, response.headers) ? "changed" : "no-ranges");
    await startWhole(response, state, options, meter);
    return;
  }
  response.body?.cancel().catch(() => {});
  if (response.status >= 500 || response.status === 408 || response.status === 429) {
    // The host is unwell for now: the stored parts stay, the attempt counts as cut.
    throw new Cut(new NotAModel(`status ${response.status}`));
  }
  if (response.status === 416) {
    await dropParts(state.cache, state.url);
    state.meta = null;
    restarting(state, meter, "changed");
    await startWhole(await fetchFn(state.url, init), state, options, meter);
    return;
  }
  throw new NotAModel(`status ${response.status}`);
}

/** The whole file as a Blob: the stored parts (or the bytes kept in memory). */
async function joined(state) {
  if (!state.meta) return new Blob(state.memory, { type: state.type });
  const blobs = [];
  for (const [offset] of state.meta.parts) {
    const part = await readPart(state.cache, state.url, offset);
    if (!part) throw new Cut(new Error("a stored part is gone"));
    blobs.push(await part.blob());
  }
  const blob = new Blob(blobs, { type: state.type });
  if (blob.size !== state.total) throw new NotAModel("the stored parts do not add up to the file");
  return blob;
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(signal.reason);
    });
  });
}

/** The download itself (the caller holds the lock). */
async function run(url, options, meter) {
  const state = {
    url, cache: null, meta: null, memory: [], total: null, received: 0, type: "", validator: null, restarted: null,
  };
  if ("caches" in self) {
    try {
      state.cache = await partsCache();
    } catch {
      state.cache = null;
    }
  }
  if (state.cache) {
    // Parts survive `fresh` too: they are checked bytes (a bad answer
    // drops them at once), and a retry after a cut must not start again.
    state.meta = await readMeta(state.cache, url);
    if (state.meta && (!state.meta.validator || state.meta.total > options.limit)) {
      await dropParts(state.cache, url);
      state.meta = null;
    }
  }
  let tries = 0;
  // Why the tries since the last real progress began again from zero.
  let restartedFor = null;
  for (;;) {
    const before = state.meta ? state.meta.received : 0;
    state.restarted = null;
    try {
      await attempt(state, options, meter);
      break;
    } catch (error) {
      const aborted = Boolean(options.signal?.aborted);
      if (!(error instanceof Cut) || aborted) {
        // A bad answer: none of its bytes are kept (an abort keeps them).
        if (state.cache && !(error instanceof Cut) && !aborted) await dropParts(state.cache, url).catch(() => {});
        throw error instanceof Cut ? error.cause : error;
      }
      // A restart from zero is no progress, however far it got: a host
      // whose file changes at every try would otherwise be tried forever.
      const progressed = !state.restarted && state.meta && state.meta.received > before;
      if (state.restarted) restartedFor = state.restarted;
      else if (progressed) restartedFor = null;
      tries = progressed ? 1 : tries + 1;
      if (tries > RETRIES && restartedFor) throw new DownloadRestarted(restartedFor, tries);
      if (!state.meta || tries > RETRIES) throw error.cause;
      await sleep(RETRY_MS * 2 ** (tries - 1), options.signal);
    }
  }
  meter.report(state.received, state.total, true);
  const blob = await joined(state);
  if (options.store && "caches" in self && !(await inAppCache(url))) {
    const headers = { "content-type": state.type || "application/octet-stream", "content-length": String(blob.size) };
    if (state.validator?.etag) headers.etag = state.validator.etag;
    if (state.validator?.lastModified) headers["last-modified"] = state.validator.lastModified;
    await (await caches.open(options.store)).put(url, new Response(blob, { status: 200, headers }));
  }
  if (state.cache) await dropParts(state.cache, url);
  return blob;
}

/**
 * Download the model file at `url` and resolve with it as a Blob, resuming
 * what an earlier attempt left (module rules).
 * Options: `limit` (bytes, required: the ceiling of the file's kind),
 * `gguf` (check the magic), `binary` (refuse text types; default true),
 * `fresh` (past the HTTP cache and not from `store`: a retry after a failed
 * load; stored parts are still resumed), `store` (Cache Storage
 * name the whole file is put into under `url`, and looked up in first),
 * `onProgress(event)`, `signal` (AbortSignal), `fetchFn` (default `fetch`),
 * `headers` (sent with every request, besides `Range`/`If-Range`).
 * Throws NotAModel, DownloadTooLarge, or the network's error.
 */
export async function downloadModelFile(url, options) {
  url = new URL(String(url), self.location.href).href;
  const opts = {
    binary: true,
    gguf: false,
    fresh: false,
    store: null,
    onProgress: () => {},
    fetchFn: (input, init) => fetch(input, init),
    ...options,
  };
  // The caller's own request headers (a token, say), as a plain object.
  opts.headers = Object.fromEntries(new Headers(options.headers || {}).entries());
  if (!Number.isSafeInteger(opts.limit) || opts.limit <= 0) throw new TypeError("downloadModelFile needs a limit");
  if (!opts.fresh) {
    const stored = await storedCopy(opts.store, url);
    if (stored) {
      await touchModel(url);
      return stored;
    }
  }
  const channel = typeof BroadcastChannel === "function" ? new BroadcastChannel(CHANNEL) : null;
  const meter = new Meter(url, opts.onProgress, channel);
  const locks = self.navigator?.locks;
  try {
    if (!locks) return await run(url, opts, meter);
    // Another tab or worker downloading the same file: show its progress.
    let holding = false;
    const listener = ({ data }) => {
      if (holding || !data || data.type !== "progress" || data.url !== url) return;
      try {
        opts.onProgress({ ...data, shared: true });
      } catch {
        /* a failing reporter never breaks a download */
      }
    };
    channel?.addEventListener("message", listener);
    return await locks.request(`napllm-download ${url}`, { signal: opts.signal }, async () => {
      holding = true;
      if (!opts.fresh) {
        const stored = await storedCopy(opts.store, url);
        if (stored) return stored;
      }
      const blob = await run(url, opts, meter);
      if (opts.store) await touchModel(url);
      return blob;
    });
  } finally {
    channel?.close();
  }
}

/**
 * A `fetch` replacement for a library that fetches model files itself
 * (transformers.js, WebLLM): GET requests for which `isModelFile(url)`
 * holds are downloaded through `downloadModelFile` (with
 * `limitFor(url)`) and answered as a whole `200` from the joined bytes;
 * every other request goes to `fetchFn` unchanged.
 */
export function resumableFetch(fetchFn, isModelFile, limitFor, extra = {}) {
  return async (input, init = {}) => {
    const url = typeof input === "string" ? input : input instanceof URL ? input.href : input.url;
    const method = (init.method || (typeof input === "object" && input.method) || "GET").toUpperCase();
    const headers = new Headers(init.headers || (typeof input === "object" && !(input instanceof URL) ? input.headers : {}));
    if (method !== "GET" || headers.has("range") || !isModelFile(url)) return fetchFn(input, init);
    const blob = await downloadModelFile(url, {
      ...extra,
      headers,
      limit: limitFor(url),
      fresh: init.cache === "reload" || extra.fresh === true,
      fetchFn,
      signal: init.signal || undefined,
    });
    return new Response(blob, {
      status: 200,
      headers: { "content-type": blob.type || "application/octet-stream", "content-length": String(blob.size) },
    });
  };
}
