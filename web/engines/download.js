/**
 * Resumable model downloads: one module every engine (and the page's
 * "Download for offline use") fetches model files through.
 *
 * Rules (docs/security.md, "Stored data": a model file is stored only
 * whole, downloads are bounded, every wait is bounded)
 * - Every answer is read by its status, `Content-Range`, `Content-Length`,
 *   `Content-Encoding` and validators together (download-answer.js
 *   `readAnswer`), before any byte of its body is used.
 * - A file is downloaded into *parts*: its bytes so far, already checked,
 *   kept in the Cache Storage cache `napllm-download-parts` together with a
 *   record of the file (`meta`: URL, total length, validator, content type,
 *   the parts' offsets; download-store.js). A part is written before the
 *   record that names it. When the download is cut, what arrived stays.
 *   Only a file with a strong validator (a strong ETag, else a strong
 *   Last-Modified), an announced length and an uncompressed body is kept
 *   in parts and *resumed*: `Range: bytes=<received>-` with `If-Range:`
 *   the validator, continued only by a `206` that is the rest of the same
 *   file. Any other file is *restarted* from zero after a cut (a weak ETag,
 *   no validator, a compressed body, no length): nothing says the next
 *   answer is the same file, so no bytes of an earlier try are joined.
 * - A `200` to a request for the rest is the whole file again (the host
 *   ignores ranges, or the file changed): the parts are dropped and it is
 *   the new download from byte 0. An answer that cannot be used but a
 *   request from zero may cure (a `200` carrying a slice's
 *   `Content-Range`, a `206` that is not the asked rest, a `416`, lengths
 *   that disagree) drops the parts; the next try asks for the whole file.
 * - Stored only whole: the file handed over (and put into `store`) has
 *   exactly the length the host announced for the whole file
 *   (`Content-Range`'s total, else an uncompressed `Content-Length`; a
 *   compressed or unannounced body is whole when its transfer ended
 *   cleanly), and `size` when the caller knows it (a catalogue). Besides:
 *   a content type that is not text, HTML, JSON or XML (`binary`), the
 *   GGUF magic at byte 0 (`gguf`), at most `limit` bytes (the ceiling of
 *   the file's kind, limits.js) and at most `room` bytes (the space the
 *   storage check found, room.js; an announced size above it fails
 *   before any byte is read). A body longer than announced fails.
 * - Tries: every failure a fresh request may cure is tried again, whatever
 *   validators the host sends: a cut, a reset, no answer, a stall
 *   (bounded.js `timedFetch`: no headers within `HEADERS_TIMEOUT_MS`, no
 *   byte for `IDLE_TIMEOUT_MS`, fewer than `MIN_RATE_BYTES` in
 *   `MIN_RATE_WINDOW_MS`), a `5xx`/`408`/`429` (after its
 *   `Retry-After`, when at most `MAX_RETRY_AFTER_MS`; a longer one fails at
 *   once), an unusable answer (a restart). Each waits `RETRY_BASE_MS *
 *   2^(n-1)` before the n-th try in a row without progress; a try that
 *   stored `MIN_PROGRESS` bytes of the same file starts the count again.
 *   At most `RETRIES` tries in a row without progress and `MAX_REQUESTS`
 *   requests in all. The user's `signal` cancels at any time (the parts
 *   stay). Each retry is reported (`retrying`), each restart says why.
 * - Errors: `NotAModel` (status, type, magic, a length beyond the
 *   announced one or the catalogue's; `type: "download_error"`; the parts
 *   are dropped), `DownloadTooLarge` (bounded.js; dropped too),
 *   `DownloadNoRoom` (`type: "storage_error"`), `DownloadRestarted` (the
 *   tries were spent on restarts from zero; says why) or
 *   `DownloadInterrupted` (the tries were spent on cuts, stalls or host
 *   errors; the parts stay for the next call). Every message is this
 *   module's own text. `discardDownload(url)` forgets an unfinished
 *   download (the Storage panel's Delete).
 * - Once whole, the file is put into the cache `store` (when given: the
 *   cache its engine reads from; not a file a build's precache holds, which
 *   ships with the app), and its parts are deleted. When a file of a
 *   `store` was last used is kept in `napllm-model-use` (`modelUse`).
 * - One download per URL across tabs and workers of this origin: the
 *   download runs under the Web Lock `napllm-download <url>`, released when
 *   it ends, which every bound above makes happen. A second caller waits
 *   for the lock and meanwhile reports the first one's progress
 *   (BroadcastChannel `napllm-downloads`); with the lock it finds the file
 *   in `store` (or resumes from the parts the first one left).
 * - Progress (`onProgress`): download-progress.js.
 * - Own code, not a library: Workbox's range support only answers ranges
 *   from a whole cached copy, and the download libraries for browsers keep
 *   their bytes in memory or hand them to a file picker; none checks bytes
 *   before keeping them or resumes across tabs and reloads.
 */

import { DownloadStalled, DownloadTooLarge, timedFetch } from "./bounded.js";
import { readAnswer, validatorOf } from "./download-answer.js";
import { Meter, RESTART_TEXT } from "./download-progress.js";
import {
  dropParts, inAppCache, partsCache, readMeta, readPart, storedCopy, storePart, touchModel,
} from "./download-store.js";
import {
  HEADERS_TIMEOUT_MS, IDLE_TIMEOUT_MS, MAX_RETRY_AFTER_MS, MIN_RATE_BYTES, MIN_RATE_WINDOW_MS, RETRY_BASE_MS,
} from "./limits.js";

// The parts store and the records of use live in download-store.js, the
// progress texts in download-progress.js; the page and the engines import
// them from here as before.
export {
  discardDownload, forgetModelUse, modelUse, PARTS_CACHE, touchModel, unfinishedDownloads, USE_CACHE,
} from "./download-store.js";
export { describeProgress } from "./download-progress.js";

/** BroadcastChannel name on which downloads report progress to other tabs. */
export const CHANNEL = "napllm-downloads";
/** Bytes gathered in memory before they are stored as one part. */
const PART_BYTES = 8 * 1024 * 1024;
/** Tries in a row without progress after the first. */
const RETRIES = 4;
/** Requests of one download call, however much each added. */
const MAX_REQUESTS = 64;
/** Bytes a try must add to the kept parts to count as progress. */
const MIN_PROGRESS = 256 * 1024;
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

/** The file is larger than the space the storage check found (`room`). */
export class DownloadNoRoom extends Error {
  constructor(total) {
    super(`the file (${total} bytes or more) does not fit in the space this browser has left`);
    this.name = "DownloadNoRoom";
    this.type = "storage_error";
  }
}

/**
 * The tries ran out while each began again from zero: `reason` is a key of
 * download-progress.js `RESTART_TEXT` (`"changed"`, `"no-ranges"`,
 * `"slice"`, `"inconsistent"`, `"cut"`). The message is this module's own
 * text, fit for the user.
 */
export class DownloadRestarted extends Error {
  constructor(reason, tries) {
    const text = reason === "no-ranges"
      ? "the server cannot resume downloads and the download broke off"
      : RESTART_TEXT[reason] || "the download began again";
    super(`${text} at every try (${tries} tries)`);
    this.name = "DownloadRestarted";
    this.type = "download_error";
    this.reason = reason;
  }
}

/**
 * The tries ran out on cuts, stalls or host errors (`why`: the last one,
 * in this module's words). What arrived of a resumable file is kept: the
 * next call continues. `retryable`: always true.
 */
export class DownloadInterrupted extends Error {
  constructor(why, tries) {
    super(`${why} (${tries} ${tries === 1 ? "try" : "tries"})`);
    this.name = "DownloadInterrupted";
    this.type = "download_error";
    this.why = why;
    this.retryable = true;
  }
}

/**
 * A try that a fresh request may cure: `why` (text), `wait` (ms asked by
 * `Retry-After`, or null), `restart` (null, or why the next try starts from zero).
 */
class Retry extends Error {
  constructor(why, { wait = null, restart = null, cause = null } = {}) {
    super(why);
    this.name = "DownloadRetry";
    this.wait = wait;
    this.restart = restart;
    this.cause = cause;
  }
}

// ------------------------------------------------------------ one try

/**
 * Read `response`'s body into `state` from `state.received` on, checking
 * magic, length, ceiling and room; stores parts when `state.meta` is set.
 * Resolves when the whole file arrived; throws NotAModel,
 * DownloadTooLarge, DownloadNoRoom or Retry (a cut, a stall, a body that
 * ended early).
 */
async function readBody(response, state, options, meter) {
  const { gguf, limit, room } = options;
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
        throw new Retry(error instanceof DownloadStalled ? error.message : "the download was cut off", {
          restart: state.meta ? null : "cut",
          cause: error,
        });
      }
      if (step.done) break;
      const value = step.value;
      if (gguf && seen < GGUF_MAGIC.length) {
        for (let i = 0; seen + i < GGUF_MAGIC.length && i < value.byteLength; i += 1) {
          if (value[i] !== GGUF_MAGIC[seen + i]) throw new NotAModel("not a GGUF file");
        }
      }
      seen += value.byteLength;
      if (state.total !== null && seen > state.total) throw new NotAModel("longer than the host announced");
      if (options.size !== null && seen > options.size) throw new NotAModel("not the size its catalogue names");
      if (seen > limit) throw new DownloadTooLarge();
      if (room !== null && seen > room) throw new DownloadNoRoom(seen);
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
    if (error instanceof Retry && state.meta) {
      // What arrived is checked so far: keep it for the next try.
      await flush().catch(() => {});
      state.received = state.meta.received;
    }
    throw error;
  }
  await flush();
  state.received = seen;
  if (gguf && seen < GGUF_MAGIC.length) throw new NotAModel("not a GGUF file");
  if (state.total !== null && seen < state.total) {
    // The body ended cleanly before the announced size: the connection closed early.
    throw new Retry("the download ended before the whole file arrived", { restart: state.meta ? null : "cut" });
  }
  // A host that announced no total (a chunked answer) is held to the size
  // the caller expects all the same: exactly that many bytes, never fewer.
  if (options.size !== null && seen !== options.size) throw new NotAModel("not the size its catalogue names");
}

/** The size checks of an announced `total` (null: none) before any byte is read. */
function checkTotal(total, options) {
  if (total === null) return;
  if (total > options.limit) throw new DownloadTooLarge("the announced length is above the ceiling");
  if (options.size !== null && total !== options.size) throw new NotAModel("not the size its catalogue names");
  if (options.room !== null && total > options.room) throw new DownloadNoRoom(total);
}

/** Refuse a text answer where a binary file is expected (`binary`). */
function checkType(response, options) {
  if (options.binary && NOT_BINARY.test(response.headers.get("content-type") || "")) {
    throw new NotAModel("not a model content type");
  }
}

/** Start `state` afresh from `response`, whose body is the whole file (`verdict`: readAnswer's `whole`). */
async function startWhole(response, verdict, state, options, meter) {
  checkType(response, options);
  checkTotal(verdict.total, options);
  if (state.cache) await dropParts(state.cache, state.url);
  if (verdict.restarted) {
    meter.restarted = verdict.restarted;
    state.restarted = verdict.restarted;
  }
  state.total = verdict.total;
  state.received = 0;
  state.memory = [];
  state.type = response.headers.get("content-type") || "application/octet-stream";
  state.validator = verdict.validator;
  // Resumed later only with a strong validator, an announced total and a plain body.
  const encoding = (response.headers.get("content-encoding") || "identity").toLowerCase();
  const ranges = (response.headers.get("accept-ranges") || "").toLowerCase() !== "none";
  const resumable = verdict.validator !== null && verdict.total !== null && encoding === "identity" && ranges;
  state.meta = resumable && state.cache
    ? { url: state.url, total: verdict.total, validator: verdict.validator, type: state.type, parts: [], received: 0 }
    : null;
  meter.resumedFrom = 0;
  await readBody(response, state, options, meter);
}

/** One request: the rest after the stored parts, or the whole file; throws Retry for another try. */
async function attempt(state, options, meter, retry) {
  const meta = state.meta;
  const start = meta && meta.received > 0 ? meta.received : 0;
  // A retry goes past the HTTP cache, which may hold the answer that failed.
  const init = { cache: options.fresh || retry ? "reload" : "default", signal: options.signal, headers: options.headers };
  if (start > 0) {
    // no-store: a range answer is not worth keeping in the HTTP cache.
    init.cache = "no-store";
    init.headers = { ...options.headers, Range: `bytes=${start}-`, "If-Range": meta.validator.etag || meta.validator.lastModified };
  }
  let response;
  try {
    response = await options.fetchFn(state.url, init);
  } catch (error) {
    // No answer at all (offline, host unreachable, a stall): the parts stay.
    if (options.signal?.aborted || !(error instanceof TypeError || error instanceof DownloadStalled)) throw error;
    throw new Retry(error instanceof DownloadStalled ? error.message : "no answer from the host", { cause: error });
  }
  const verdict = readAnswer(response, { start, validator: meta?.validator ?? null, total: meta?.total ?? null });
  if (verdict.use !== "whole" && verdict.use !== "rest") response.body?.cancel().catch(() => {});
  if (verdict.use === "whole") {
    try {
      await startWhole(response, verdict, state, options, meter);
    } catch (error) {
      response.body?.cancel().catch(() => {});
      throw error;
    }
  } else if (verdict.use === "rest") {
    checkType(response, options);
    state.total = meta.total;
    state.received = meta.received;
    meter.resumedFrom = meta.received;
    await readBody(response, state, options, meter);
  } else if (verdict.use === "restart") {
    throw new Retry(verdict.why, { restart: verdict.reason });
  } else if (verdict.use === "retry") {
    throw new Retry(verdict.why, { wait: verdict.wait });
  } else {
    throw new NotAModel(verdict.why);
  }
}

/** The whole file as a Blob: the stored parts (or the bytes kept in memory). */
async function joined(state) {
  if (!state.meta) return new Blob(state.memory, { type: state.type });
  const blobs = [];
  for (const [offset] of state.meta.parts) {
    const part = await readPart(state.cache, state.url, offset);
    if (!part) throw new Retry("a stored part is gone", { restart: "inconsistent" });
    blobs.push(await part.blob());
  }
  const blob = new Blob(blobs, { type: state.type });
  if (blob.size !== state.total) throw new Retry("the stored parts do not add up to the file", { restart: "inconsistent" });
  return blob;
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(signal.reason);
    }, { once: true });
  });
}

/** The download itself (the caller holds the lock): tries until whole or spent (module rules). */
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
  let requests = 0;
  // Why the tries since the last real progress began again from zero.
  let restartedFor = null;
  let blob = null;
  while (blob === null) {
    const before = state.meta ? state.meta.received : 0;
    state.restarted = null;
    requests += 1;
    try {
      await attempt(state, options, meter, requests > 1);
      meter.report(state.received, state.total, true);
      blob = await joined(state);
    } catch (error) {
      if (options.signal?.aborted) throw error instanceof Retry && error.cause ? error.cause : error;
      if (!(error instanceof Retry)) {
        // A bad answer: none of its bytes are kept.
        if (state.cache) await dropParts(state.cache, url).catch(() => {});
        throw error;
      }
      if (error.restart) {
        if (state.cache) await dropParts(state.cache, url).catch(() => {});
        state.meta = null;
        state.restarted = error.restart;
        meter.restarted = error.restart;
      }
      // A restart from zero is no progress, however far it got: a host
      // whose file changes at every try would otherwise be tried forever.
      const progressed = !state.restarted && state.meta !== null && state.meta.received - before >= MIN_PROGRESS;
      if (state.restarted) restartedFor = state.restarted;
      else if (progressed) restartedFor = null;
      tries = progressed ? 1 : tries + 1;
      const tooLong = error.wait !== null && error.wait > options.maxRetryAfterMs;
      if (tries > RETRIES || requests >= MAX_REQUESTS || tooLong) {
        if (tooLong) throw new DownloadInterrupted(`${error.message}: the host asks to wait ${Math.ceil(error.wait / 1000)} s`, requests);
        if (restartedFor) throw new DownloadRestarted(restartedFor, tries);
        throw new DownloadInterrupted(`${error.message} at every try`, tries);
      }
      const wait = error.wait ?? options.retryMs * 2 ** (tries - 1);
      meter.retry(error.message, wait, requests);
      await sleep(wait, options.signal);
    }
  }
  if (options.size !== null && blob.size !== options.size) {
    if (state.cache) await dropParts(state.cache, url).catch(() => {});
    throw new NotAModel("not the size its catalogue names");
  }
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
 * `size` (bytes: the length a catalogue names, or null), `room` (bytes the
 * storage check allows, or null), `fresh` (past the HTTP cache and not
 * from `store`: a retry after a failed load; stored parts are still
 * resumed), `store` (Cache Storage name the whole file is put into under
 * `url`, and looked up in first: a stored copy of another length than
 * `size` is deleted and downloaded again), `onProgress(event)`, `signal`
 * (AbortSignal: cancels at any time), `fetchFn` (default `fetch`),
 * `headers` (sent with every request, besides `Range`/`If-Range`), and the
 * time bounds `headersMs`, `idleMs`, `rateMs` with `rateBytes`, `retryMs`, `maxRetryAfterMs`
 * (default: limits.js).
 * Throws NotAModel, DownloadTooLarge, DownloadNoRoom, DownloadRestarted,
 * DownloadInterrupted, or the signal's reason.
 */
export async function downloadModelFile(url, options) {
  url = new URL(String(url), self.location.href).href;
  const opts = {
    binary: true,
    gguf: false,
    fresh: false,
    store: null,
    size: null,
    room: null,
    onProgress: () => {},
    fetchFn: (input, init) => fetch(input, init),
    headersMs: HEADERS_TIMEOUT_MS,
    idleMs: IDLE_TIMEOUT_MS,
    rateMs: MIN_RATE_WINDOW_MS,
    rateBytes: MIN_RATE_BYTES,
    retryMs: RETRY_BASE_MS,
    maxRetryAfterMs: MAX_RETRY_AFTER_MS,
    ...options,
  };
  // The caller's own request headers (a token, say), as a plain object.
  opts.headers = Object.fromEntries(new Headers(options.headers || {}).entries());
  if (!Number.isSafeInteger(opts.limit) || opts.limit <= 0) throw new TypeError("downloadModelFile needs a limit");
  if (!Number.isSafeInteger(opts.size) || opts.size < 0) opts.size = null;
  if (!Number.isFinite(opts.room) || opts.room < 0) opts.room = null;
  opts.fetchFn = timedFetch(opts.fetchFn, {
    headersMs: opts.headersMs, idleMs: opts.idleMs, rateMs: opts.rateMs, rateBytes: opts.rateBytes,
  });
  if (!opts.fresh) {
    const stored = await storedCopy(opts.store, url, opts.size);
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
        const stored = await storedCopy(opts.store, url, opts.size);
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
 * holds are downloaded through `downloadModelFile` (with `limitFor(url)`
 * and `extra`'s options) and answered as a whole `200` from the joined
 * bytes; every other request goes to `fetchFn` bounded in time (bounded.js
 * `timedFetch`).
 */
export function resumableFetch(fetchFn, isModelFile, limitFor, extra = {}) {
  const timed = timedFetch(fetchFn, {
    headersMs: extra.headersMs, idleMs: extra.idleMs, rateMs: extra.rateMs, rateBytes: extra.rateBytes,
  });
  return async (input, init = {}) => {
    const url = typeof input === "string" ? input : input instanceof URL ? input.href : input.url;
    const method = (init.method || (typeof input === "object" && input.method) || "GET").toUpperCase();
    const headers = new Headers(init.headers || (typeof input === "object" && !(input instanceof URL) ? input.headers : {}));
    if (method !== "GET" || headers.has("range") || !isModelFile(url)) return timed(input, init);
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
