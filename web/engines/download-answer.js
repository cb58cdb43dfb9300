/**
 * How download.js reads one answer of a model host: its status,
 * `Content-Range`, `Content-Length`, `Content-Encoding` and validators
 * together, never one of them alone (RFC 9110 sections 8.6, 8.8, 13.1.5,
 * 14.4, 15.3.7; docs/security.md, "A model file is stored only whole").
 *
 * Rules
 * - `readAnswer(response, asked)` gives a verdict, without reading the
 *   body. `asked`: `{start, validator, total}`: the byte the request asked
 *   from (0: no `Range`), and the stored validator and total of the bytes
 *   kept so far. Verdicts:
 *   - `whole`: the body is the file from byte 0; `total` the size the
 *     host announced for the whole file (`Content-Range`'s total, else an
 *     uncompressed `Content-Length`; null when the host announced none:
 *     compressed or without a length), `validator` (`validatorOf`) and
 *     `restarted` (null, `"changed"` or `"no-ranges"`: why a request for
 *     the rest got the whole file).
 *   - `rest`: a `206` that continues the kept bytes of the same file:
 *     `Content-Range: bytes <start>-<total-1>/<total>` for the stored
 *     total, uncompressed, a `Content-Length` (when sent) equal to the
 *     range's length, repeating the stored validator exactly.
 *   - `restart` (`reason`): the answer cannot be used but a request for
 *     the whole file from zero may be: a `200` whose `Content-Range` names
 *     a slice (some servers and proxies answer a `Range` so), a `206`
 *     that is not the asked rest of the same file, a `416`, an answer whose
 *     lengths disagree.
 *   - `retry` (`wait`: ms or null for the usual backoff, `why`): the host is
 *     unwell for now: `5xx`, `408`, `429` (`Retry-After` in seconds or as a
 *     date gives `wait`).
 *   - `fail` (`why`): any other status; no fresh request can cure it.
 * - Nothing here trusts a length without its encoding: a compressed body's
 *   `Content-Length` counts the bytes on the wire, not the file's.
 */

/**
 * The validator `If-Range` may carry (RFC 9110 13.1.5, which compares
 * strongly): a strong ETag; else, only when the file has no ETag at all,
 * Last-Modified when it is strong (8.8.2.2: the answer's Date is at least
 * one second later); else null (the file is not resumed, only restarted).
 * A weak ETag (`W/`) is never sent, and hides the date too.
 */
export function validatorOf(headers) {
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

/** Whether a 200's `headers` name another version than the stored validator `stored`. */
function changed(stored, headers) {
  if (!stored) return false;
  if (stored.etag) return headers.has("etag") && headers.get("etag") !== stored.etag;
  return headers.has("last-modified") && headers.get("last-modified") !== stored.lastModified;
}

/**
 * Whether a 206's `headers` repeat the stored validator exactly (the
 * stored one is strong, so equal text is the strong comparison). A 206
 * that lacks it or carries another is of another file, whatever If-Range
 * asked for.
 */
function sameFile(stored, headers) {
  if (!stored) return false;
  if (stored.etag) return headers.get("etag") === stored.etag;
  return Boolean(stored.lastModified) && headers.get("last-modified") === stored.lastModified;
}

/** `[start, end, total]` of a `Content-Range: bytes start-end/total` (end < total), null when absent, false when malformed. */
function contentRange(headers) {
  if (!headers.has("content-range")) return null;
  const match = /^bytes (\d+)-(\d+)\/(\d+)$/.exec((headers.get("content-range") || "").trim());
  if (!match) return false;
  const values = match.slice(1).map(Number);
  const [start, end, total] = values;
  return values.every(Number.isSafeInteger) && start <= end && end < total ? values : false;
}

/** `Content-Length` as a number, or null when absent or malformed. */
function contentLength(headers) {
  const text = headers.get("content-length");
  if (text === null || !/^\d+$/.test(text.trim())) return null;
  const value = Number(text);
  return Number.isSafeInteger(value) ? value : null;
}

/** Whether the body is sent as it is (`Content-Encoding` absent or `identity`). */
export function identity(headers) {
  return (headers.get("content-encoding") || "identity").trim().toLowerCase() === "identity";
}

/** ms to wait from `Retry-After` (seconds or an HTTP date), null when absent or unreadable. */
function retryAfter(headers) {
  const text = (headers.get("retry-after") || "").trim();
  if (!text) return null;
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const when = Date.parse(text);
  return Number.isFinite(when) ? Math.max(0, when - Date.now()) : null;
}

/** Statuses a fresh request may cure (the host is unwell for now). */
function passing(status) {
  return status >= 500 || status === 408 || status === 429;
}

/** The verdict on an answer to a request for the whole file (see the rules). */
function wholeVerdict(response, restarted) {
  const { headers, status } = response;
  const range = contentRange(headers);
  const length = contentLength(headers);
  const plain = identity(headers);
  let total = plain ? length : null;
  if (range === false) return { use: "restart", reason: "inconsistent", why: "a malformed Content-Range" };
  if (range) {
    // Only a range that is the whole file is the whole file, whatever the status says.
    if (range[0] !== 0 || range[1] !== range[2] - 1) {
      return { use: "restart", reason: "slice", why: "part of the file sent as the whole file" };
    }
    if (plain && length !== null && length !== range[2]) {
      return { use: "restart", reason: "inconsistent", why: "Content-Length and Content-Range disagree" };
    }
    total = range[2];
  } else if (status === 206) {
    return { use: "restart", reason: "inconsistent", why: "a 206 without Content-Range" };
  }
  return { use: "whole", total, validator: validatorOf(headers), restarted };
}

/**
 * The verdict on `response`, the answer to a request from byte
 * `asked.start` (module rules). Never reads the body.
 */
export function readAnswer(response, asked) {
  const { status, headers } = response;
  if (!response.body && status !== 416 && !passing(status)) return { use: "fail", why: `status ${status} without a body` };
  if (passing(status)) return { use: "retry", wait: retryAfter(headers), why: `status ${status}` };
  if (asked.start === 0) {
    if (status === 200 || status === 206) return wholeVerdict(response, null);
    return { use: "fail", why: `status ${status}` };
  }
  if (status === 200) {
    return wholeVerdict(response, changed(asked.validator, headers) ? "changed" : "no-ranges");
  }
  if (status === 416) return { use: "restart", reason: "changed", why: "the kept bytes are past the file's end" };
  if (status !== 206) return { use: "fail", why: `status ${status}` };
  const range = contentRange(headers);
  if (range && range[0] === 0) return wholeVerdict(response, "changed");
  if (!range || range[0] !== asked.start || range[2] !== asked.total || range[1] !== asked.total - 1
    || !identity(headers) || !sameFile(asked.validator, headers)) {
    return { use: "restart", reason: "changed", why: "not the rest of the same file" };
  }
  const length = contentLength(headers);
  if (length !== null && length !== range[1] - range[0] + 1) {
    return { use: "restart", reason: "inconsistent", why: "Content-Length and Content-Range disagree" };
  }
  return { use: "rest", total: range[2] };
}
