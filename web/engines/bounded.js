/**
 * The one check every engine path applies to a model file as it arrives:
 * its bytes are bounded by the ceiling of its kind (limits.js) and, when
 * it is not compressed, by its declared length.
 *
 * Rules (docs/security.md, "Stored data": downloads are bounded)
 * - A declared length above the ceiling fails before any byte is read.
 * - A body that goes past its bound errors with `DownloadTooLarge` (which
 *   cancels the download); the engine reports its usual download failure
 *   and evicts the URL, as for any bad download.
 * - Time (`timedFetch`; docs/security.md, "Every wait on a model host or a
 *   worker is bounded"): an answer's headers come within
 *   `HEADERS_TIMEOUT_MS`, its body never goes `IDLE_TIMEOUT_MS` without
 *   a byte, and each `MIN_RATE_WINDOW_MS` of waiting on the body brings at
 *   least `MIN_RATE_BYTES` (limits.js; the time the reader itself takes
 *   between reads is not counted), else the request is aborted and fails
 *   with `DownloadStalled`, which a fresh request may cure.
 */

import {
  HEADERS_TIMEOUT_MS, IDLE_TIMEOUT_MS, MAX_ONNX_OTHER_BYTES, MAX_ONNX_WEIGHTS_BYTES, MIN_RATE_BYTES, MIN_RATE_WINDOW_MS,
} from "./limits.js";

/** Statuses whose answers have no body (a Response with one cannot be made). */
const NULL_BODY_STATUS = new Set([101, 103, 204, 205, 304]);

/** A download that delivered (or declared) more bytes than it may. */
export class DownloadTooLarge extends Error {
  constructor(message = "the model file is larger than allowed") {
    super(message);
    this.name = "DownloadTooLarge";
    this.type = "download_error";
  }
}

/** A request whose answer or body stopped coming (`timedFetch`): a fresh request may cure it. */
export class DownloadStalled extends Error {
  constructor(what, ms, bytes = 0) {
    const time = ms >= 1000 ? `${Math.round(ms / 1000)} s` : `${ms} ms`;
    const texts = {
      headers: `the host sent no answer within ${time}`,
      body: `the host sent nothing for ${time}`,
      slow: `the host sent less than ${bytes >= 1024 ? `${Math.round(bytes / 1024)} KiB` : `${bytes} bytes`} in ${time}`,
    };
    super(texts[what] || texts.body);
    this.name = "DownloadStalled";
    this.type = "download_error";
    this.retryable = true;
  }
}

/**
 * `fetchFn` bounded in time (module rules): its promise rejects with
 * `DownloadStalled` when no answer came within `headersMs`, and the
 * answer's body errors with it when it goes `idleMs` without a byte or
 * when `rateMs` spent waiting on it brought fewer than `rateBytes` bytes
 * (the progress floor: ms and bytes); the request is aborted either way. The caller's `init.signal` still aborts
 * it. The answer keeps its status, headers, `type` and `url`.
 */
export function timedFetch(fetchFn, {
  headersMs = HEADERS_TIMEOUT_MS, idleMs = IDLE_TIMEOUT_MS, rateMs = MIN_RATE_WINDOW_MS, rateBytes = MIN_RATE_BYTES,
} = {}) {
  // `undefined` (a caller passing its own option through) means the default.
  headersMs ??= HEADERS_TIMEOUT_MS;
  idleMs ??= IDLE_TIMEOUT_MS;
  rateMs ??= MIN_RATE_WINDOW_MS;
  rateBytes ??= MIN_RATE_BYTES;
  return async (input, init = {}) => {
    const controller = new AbortController();
    const outer = init.signal || (input && typeof input === "object" && input.signal) || null;
    const follow = () => controller.abort(outer.reason);
    if (outer?.aborted) controller.abort(outer.reason);
    else outer?.addEventListener("abort", follow, { once: true });
    const done = () => outer?.removeEventListener("abort", follow);
    // Ends the wait whether or not `fetchFn` honours the abort.
    let give = () => {};
    const given = new Promise((resolve, reject) => {
      give = reject;
    });
    given.catch(() => {});
    const stall = (what, ms) => {
      const stalled = new DownloadStalled(what, ms);
      controller.abort(stalled);
      give(stalled);
    };
    let timer = setTimeout(() => stall("headers", headersMs), headersMs);
    let response;
    try {
      response = await Promise.race([fetchFn(input, { ...init, signal: controller.signal }), given]);
    } catch (error) {
      done();
      throw error;
    } finally {
      clearTimeout(timer);
    }
    if (!response || !response.body) {
      done();
      return response;
    }
    const reader = response.body.getReader();
    // The progress floor: time spent waiting on the host and bytes it sent in the current window.
    let waited = 0;
    let brought = 0;
    const body = new ReadableStream({
      async pull(stream) {
        const next = new Promise((resolve, reject) => {
          give = reject;
        });
        timer = setTimeout(() => stall("body", idleMs), idleMs);
        const began = Date.now();
        try {
          const step = await Promise.race([reader.read(), next]);
          clearTimeout(timer);
          if (step.done) {
            done();
            stream.close();
            return;
          }
          waited += Date.now() - began;
          brought += step.value?.byteLength ?? 0;
          if (waited >= rateMs) {
            if (brought < rateBytes) throw new DownloadStalled("slow", rateMs, rateBytes);
            waited = 0;
            brought = 0;
          }
          stream.enqueue(step.value);
        } catch (error) {
          clearTimeout(timer);
          done();
          if (error instanceof DownloadStalled) controller.abort(error);
          reader.cancel(error).catch(() => {});
          stream.error(error);
        }
      },
      cancel(reason) {
        clearTimeout(timer);
        done();
        return reader.cancel(reason);
      },
    });
    const timed = new Response(NULL_BODY_STATUS.has(response.status) ? null : body, {
      status: response.status,
      statusText: response.statusText,
      headers: response.headers,
    });
    for (const name of ["type", "url", "redirected"]) Object.defineProperty(timed, name, { value: response[name] });
    return timed;
  };
}

/**
 * The most bytes `response`'s body may deliver: `limit`, or the declared
 * length when it is smaller and the body is known not to be compressed
 * (its `Content-Encoding` is readable and absent or `identity`; a CORS
 * answer hides that header unless the host exposes it, and a compressed
 * body's declared length counts wire bytes, not the decoded ones). Throws
 * `DownloadTooLarge` when the declared length is above `limit`, whatever
 * the encoding (a body that large on the wire is refused at once).
 */
export function allowedBytes(response, limit) {
  const declared = Number(response.headers.get("content-length"));
  const hasLength = response.headers.has("content-length") && Number.isSafeInteger(declared) && declared >= 0;
  if (hasLength && declared > limit) throw new DownloadTooLarge("the declared length is above the ceiling");
  const encoding = response.headers.get("content-encoding");
  const plain = encoding === null ? response.type !== "cors" : encoding.toLowerCase() === "identity";
  return hasLength && plain ? declared : limit;
}

/**
 * A TransformStream that passes at most `allowed` bytes and errors with
 * `DownloadTooLarge` on the first chunk beyond them (calling `onExcess()`
 * first, so the caller can name the failure whoever reads the body).
 */
export function byteCeiling(allowed, onExcess = () => {}) {
  let seen = 0;
  return new TransformStream({
    transform(chunk, controller) {
      seen += chunk.byteLength;
      if (seen > allowed) {
        onExcess();
        controller.error(new DownloadTooLarge());
        return;
      }
      controller.enqueue(chunk);
    },
  });
}

/**
 * `response` with its body bounded (`allowedBytes`, `byteCeiling`): the
 * body errors with `DownloadTooLarge` once it goes past the bound, which
 * cancels the download. A response without a body (or with a status that
 * has none) is returned as it is.
 * Throws `DownloadTooLarge` (after `onExcess()`, the body cancelled) for a
 * declared length above `limit`.
 */
export function limitResponse(response, limit, onExcess = () => {}) {
  // No body to bound (an opaque answer, 204, 304): returned as it is.
  if (!response || !response.body || NULL_BODY_STATUS.has(response.status)) return response;
  let allowed;
  try {
    allowed = allowedBytes(response, limit);
  } catch (error) {
    onExcess();
    response.body.cancel().catch(() => {});
    throw error;
  }
  const body = response.body.pipeThrough(byteCeiling(allowed, onExcess));
  return new Response(body, { status: response.status, statusText: response.statusText, headers: response.headers });
}

/** `fetchFn` whose answers are bounded by `limitFor(url)` bytes (`limitResponse`). */
export function limitedFetch(fetchFn, limitFor, onExcess = () => {}) {
  return async (input, init) => {
    const url = typeof input === "string" ? input : input instanceof URL ? input.href : input.url;
    return limitResponse(await fetchFn(input, init), limitFor(url), onExcess);
  };
}

/** The ceiling of a file of an ONNX model, by its URL's path. */
export function onnxLimit(url) {
  let path = "";
  try {
    path = new URL(String(url), self.location.href).pathname.toLowerCase();
  } catch {
    path = String(url).toLowerCase();
  }
  return /\.(onnx|onnx_data|bin|safetensors)$/.test(path) ? MAX_ONNX_WEIGHTS_BYTES : MAX_ONNX_OTHER_BYTES;
}
