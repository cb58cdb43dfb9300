/**
 * Converting a napplet's postMessage data into the bridge's `wireJson` text.
 *
 * Rules (bridge contract, "wireJson"; NAP-LLM, Schemas: explicit null and
 * invalid types are `invalid-request`)
 * - postMessage uses structured clone, which carries values JSON cannot
 *   (undefined, Map, Set, Date, RegExp, ArrayBuffer and typed arrays, Blob,
 *   BigInt, cyclic objects, NaN/Infinity, sparse arrays). Plain JSON data
 *   becomes `{"json": "<the data as JSON text>"}` (a string, which the
 *   runtime parses strictly itself); anything else becomes
 *   `{"unclonable": true, "type", "id"}` so the runtime can still answer
 *   `invalid-request` to a usable id. `null` stays `null`.
 * - Data larger than `MAX_WIRE_CHARS` of JSON text, or nested deeper than
 *   `MAX_DEPTH`, becomes `{"tooLarge": true, "type", "id"}` instead.
 * - The walk is iterative and stops as soon as a limit is passed, so a
 *   hostile message cannot exhaust the shell's stack or memory; it walks
 *   each object once (shared references are counted, not walked again),
 *   so its time is linear in what was cloned, not in the JSON text.
 * - A message's cost to its frame's traffic budget (`measureWire`) is what
 *   it holds, not what is forwarded: its JSON text, with binary values
 *   (ArrayBuffer, typed arrays and DataView (their whole buffer, once; a
 *   resizable buffer its maximum length),
 *   Blob, ImageData, and the platform objects structured clone copies with
 *   their pixels or samples: ImageBitmap, VideoFrame, AudioData, FileList's
 *   files) counted one unit per byte, and the contents of Map
 *   and Set walked like arrays (one unit per entry, counted before any
 *   entry is listed); a value JSON cannot carry still makes the
 *   message a small `unclonable` marker, but never a cheap one.
 *
 * Own code rather than a library: the check is specific to what structured
 * clone can produce in this realm, and it must never throw.
 */

import { isObject, parseJsonOr } from "./json.js";

/** Largest accepted envelope, in UTF-16 code units of JSON text (8 MiB). */
export const MAX_WIRE_CHARS = 8 * 1024 * 1024;
/** Deepest accepted nesting of arrays/objects. */
export const MAX_DEPTH = 128;
/** Longest `type`/`id` copied into a marker; longer ones are not usable. */
const MAX_MARKER_FIELD = 256;

const OK = 0;
const UNCLONABLE = 1;
const TOO_LARGE = 2;

function isPlainObject(value) {
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

/** What a value no JSON text can carry costs when it has no size of its own. */
const OPAQUE_COST = 16;

/**
 * The bytes a binary value brings (module rules: one unit per byte), or -1
 * for a value that is not binary. A view counts its whole buffer (structured
 * clone copies the buffer, not the view's window), once per message: the
 * buffers already counted are in `buffers`; a resizable buffer counts its
 * `maxByteLength` (the receiver reserves that much).
 */
function binaryBytes(value, buffers) {
  let buffer = null;
  if (value instanceof ArrayBuffer) buffer = value;
  else if (ArrayBuffer.isView(value)) buffer = value.buffer;
  else if (typeof SharedArrayBuffer === "function" && value instanceof SharedArrayBuffer) buffer = value;
  if (buffer !== null) {
    if (buffers.has(buffer)) return 0;
    buffers.add(buffer);
    // A resizable (or growable) buffer is cloned resizable: the receiver
    // reserves its maximum whatever its length now.
    return bytesOf(() => (buffer.resizable || buffer.growable ? Math.max(buffer.maxByteLength, buffer.byteLength) : buffer.byteLength));
  }
  if (typeof Blob === "function" && value instanceof Blob) return value.size;
  if (typeof ImageData === "function" && value instanceof ImageData) return value.data.byteLength;
  return mediaBytes(value);
}

/** A count of bytes read off a platform object: a whole number, else 0 (never throws). */
function bytesOf(read) {
  try {
    const bytes = read();
    return Number.isFinite(bytes) && bytes > 0 ? Math.ceil(bytes) : 0;
  } catch {
    return 0;
  }
}

/**
 * The bytes a serializable platform object holds beyond its own fields
 * (module rules), or -1 for none of these kinds: an ImageBitmap's pixels
 * (4 bytes each), a VideoFrame's coded pixels (4 each, at least what any
 * of its formats holds), an AudioData's samples (4 bytes each), a
 * FileList's files (their sizes, as Blobs; never read).
 */
function mediaBytes(value) {
  if (typeof ImageBitmap === "function" && value instanceof ImageBitmap) {
    return bytesOf(() => value.width * value.height * 4);
  }
  if (typeof VideoFrame === "function" && value instanceof VideoFrame) {
    return bytesOf(() => value.codedWidth * value.codedHeight * 4);
  }
  if (typeof AudioData === "function" && value instanceof AudioData) {
    return bytesOf(() => value.numberOfFrames * value.numberOfChannels * 4);
  }
  if (typeof FileList === "function" && value instanceof FileList) {
    return bytesOf(() => {
      let total = 0;
      for (let i = 0; i < value.length; i += 1) total += value[i]?.size || 0;
      return total;
    });
  }
  return -1;
}

/** The entries of a Map or Set (its `size`), else 0; never throws. */
function entryCount(value) {
  return value instanceof Map || value instanceof Set ? bytesOf(() => value.size) : 0;
}

/**
 * The children of a non-plain object structured clone copies with their
 * contents (Map, Set), or null; and the text an object of another kind
 * carries (a String object's, a RegExp's source, an Error's message).
 */
function opaqueParts(value) {
  if (value instanceof Map) {
    const parts = [];
    for (const [key, item] of value) parts.push(key, item);
    return { children: parts, cost: 2 };
  }
  if (value instanceof Set) return { children: [...value], cost: 2 };
  if (value instanceof String) return { children: null, cost: value.length + 2 };
  if (value instanceof RegExp) return { children: null, cost: value.source.length + OPAQUE_COST };
  if (value instanceof Error) return { children: null, cost: String(value.message).length + OPAQUE_COST };
  return { children: null, cost: OPAQUE_COST };
}

/**
 * Classify `data` without throwing: `{verdict, size}` with verdict OK,
 * UNCLONABLE or TOO_LARGE and `size` a lower bound of what the message
 * holds (module rules: its JSON text, or for a binary value its bytes).
 *
 * `size` grows as values are met; passing `maxChars` proves the text
 * would be too large and ends the walk (the value that passed it counted
 * whole: one large string or buffer costs its length or bytes). A value
 * JSON cannot carry makes the message unclonable but does not end the
 * walk: what follows it (and what a Map or Set holds) is still counted,
 * so a message cannot hide its bytes behind a marker.
 *
 * Structured clone keeps shared references, so a message of a few hundred
 * bytes can be a graph whose JSON text is exponential (`d = [d, d]` forty
 * times). Walking such a graph value by value costs time in proportion to
 * its JSON text, up to the budget: a second of the shell's only thread per
 * message. Each object is therefore walked once: when it is met again, its
 * text length and the depth below it (kept when its walk ended) are added
 * without walking it again, so the walk is linear in what was cloned.
 */
function classify(data, maxChars, maxDepth) {
  let budget = 0;
  let unclonable = false;
  const buffers = new Set();
  // Each frame: [value, depth, leaving]. `path` holds the ancestor chain
  // (records of the objects being walked), `onPath` the same objects, to
  // detect cycles; `done` the objects already walked: {chars, height}.
  const stack = [[data, 0, false]];
  const path = [];
  const onPath = new Set();
  const done = new Map();
  const result = (verdict) => ({ verdict, size: budget });
  // Note that an object at `depth` exists below the innermost open object.
  const reach = (depth) => {
    const top = path[path.length - 1];
    if (top && depth > top.deepest) top.deepest = depth;
  };
  // Walk `value`'s `children` (pushed in order) below it at `depth`.
  const open = (value, depth, record, children) => {
    path.push(record);
    onPath.add(value);
    stack.push([value, depth, true]);
    for (let i = children.length - 1; i >= 0; i -= 1) stack.push([children[i], depth + 1, false]);
  };
  while (stack.length > 0) {
    const [value, depth, leaving] = stack.pop();
    if (leaving) {
      const record = path.pop();
      onPath.delete(value);
      done.set(value, { chars: budget - record.start, height: record.deepest - depth });
      reach(record.deepest);
      continue;
    }
    if (value === null) {
      budget += 4;
    } else {
      switch (typeof value) {
        case "string":
          budget += value.length + 2;
          break;
        case "boolean":
          budget += 4;
          break;
        case "number":
          if (!Number.isFinite(value)) unclonable = true;
          budget += String(value).length; // what JSON writes for it
          break;
        case "object": {
          const seen = done.get(value);
          if (seen !== undefined) {
            if (depth + seen.height >= maxDepth) return result(TOO_LARGE);
            budget += seen.chars;
            reach(depth + seen.height);
            break;
          }
          if (depth >= maxDepth) return result(TOO_LARGE);
          if (onPath.has(value)) {
            unclonable = true;
            break;
          }
          const record = { start: budget, deepest: depth };
          reach(depth);
          const bytes = binaryBytes(value, buffers);
          if (bytes >= 0) {
            unclonable = true;
            budget += bytes;
            done.set(value, { chars: 0, height: 0 });
            break;
          }
          if (Array.isArray(value)) {
            // Brackets and commas; each element counts its own text when visited.
            budget += 2 + Math.max(0, value.length - 1);
            if (budget > maxChars) return result(TOO_LARGE);
            const keys = Object.keys(value);
            // A hole or an extra named property would be lost or changed by JSON.
            if (Object.getPrototypeOf(value) !== Array.prototype || keys.length !== value.length) unclonable = true;
            const children = [];
            for (const key of keys) {
              const descriptor = Object.getOwnPropertyDescriptor(value, key);
              if (descriptor && "value" in descriptor) children.push(descriptor.value);
              else unclonable = true;
            }
            open(value, depth, record, children);
          } else if (isPlainObject(value)) {
            const keys = Object.keys(value);
            budget += 2 + keys.length * 3; // quotes and colon per key
            if (budget > maxChars) return result(TOO_LARGE);
            const children = [];
            for (const key of keys) {
              const descriptor = Object.getOwnPropertyDescriptor(value, key);
              budget += key.length;
              if (descriptor && "value" in descriptor) children.push(descriptor.value);
              else unclonable = true;
            }
            open(value, depth, record, children);
          } else {
            // Map, Set, Date, RegExp, Error, wrappers, platform objects.
            unclonable = true;
            // A Map or Set costs a separator per entry, like an array,
            // before its entries are listed: one too large is never expanded.
            budget += entryCount(value);
            if (budget > maxChars) return result(TOO_LARGE);
            const parts = opaqueParts(value);
            budget += parts.cost;
            if (parts.children) open(value, depth, record, parts.children);
            else done.set(value, { chars: parts.cost, height: 0 });
          }
          break;
        }
        case "bigint":
          unclonable = true;
          budget += String(value).length;
          break;
        default:
          // undefined (symbols and functions never survive structured clone).
          unclonable = true;
          budget += 4;
      }
    }
    if (budget > maxChars) return result(TOO_LARGE);
  }
  return result(unclonable ? UNCLONABLE : OK);
}

function markerField(data, name) {
  if (typeof data !== "object" || data === null || Array.isArray(data)) return null;
  let value;
  try {
    value = data[name];
  } catch {
    return null;
  }
  return typeof value === "string" && value.length <= MAX_MARKER_FIELD ? value : null;
}

function marker(kind, data) {
  return JSON.stringify({ [kind]: true, type: markerField(data, "type"), id: markerField(data, "id") });
}

/**
 * The bridge's `wireJson` for one received message, and what the message
 * costs the frame's traffic budget (module rules).
 *
 * @param {*} data `MessageEvent.data` as received from a napplet frame.
 * @param {{maxChars?: number, maxDepth?: number}} [limits] for tests.
 * @returns {{wire: string, cost: number}} `wire`: `{"json": "..."}`,
 *   `{"unclonable": true, ...}` or `{"tooLarge": true, ...}`, always valid
 *   JSON text; `cost`: at least the wire text's length and the message's
 *   measured size (its bytes for binary values), and at least `maxChars`
 *   for a message refused as too large. Never throws.
 */
export function measureWire(data, limits = {}) {
  const maxChars = limits.maxChars ?? MAX_WIRE_CHARS;
  const maxDepth = limits.maxDepth ?? MAX_DEPTH;
  let verdict;
  let size = 0;
  try {
    ({ verdict, size } = classify(data, maxChars, maxDepth));
  } catch {
    verdict = UNCLONABLE;
  }
  const refuse = (kind) => {
    const wire = marker(kind, data);
    return { wire, cost: Math.max(wire.length, size, kind === "tooLarge" ? maxChars : 0) };
  };
  if (verdict === UNCLONABLE) return refuse("unclonable");
  if (verdict === TOO_LARGE) return refuse("tooLarge");
  let text;
  try {
    text = JSON.stringify(data);
  } catch {
    return refuse("unclonable");
  }
  // Escapes can make the text longer than the walk's estimate.
  if (text.length > maxChars) {
    size = Math.max(size, text.length);
    return refuse("tooLarge");
  }
  const wire = JSON.stringify({ json: text });
  return { wire, cost: wire.length };
}

/**
 * The bridge's `wireJson` for one received message (`measureWire`'s `wire`).
 *
 * @param {*} data `MessageEvent.data` as received from a napplet frame.
 * @param {{maxChars?: number, maxDepth?: number}} [limits] for tests.
 * @returns {string} `{"json": "..."}`, `{"unclonable": true, ...}` or
 *   `{"tooLarge": true, ...}`, always valid JSON text.
 */
export function toWireJson(data, limits = {}) {
  return measureWire(data, limits).wire;
}

/** The request types of the llm domain (NAP-LLM, Wire Protocol). */
const REQUEST_TYPES = new Set(["llm.select", "llm.describe", "llm.generate", "llm.cancel"]);
/** What a request gets while the llm domain is not available to its frame. */
export const WITHOUT_LLM = Object.freeze({ code: "unsupported", message: "The llm domain is not available to this napplet." });

/** An id the runtime could answer (napllm.wire `usable_id`): 1 to 256 code units, no lone surrogate. */
function usableId(id) {
  return typeof id === "string" && id.length > 0 && id.length <= MAX_MARKER_FIELD && id.isWellFormed();
}

/**
 * The answer to one metered message of a frame whose llm domain is off
 * (the tab's LLM access): for a request envelope (a request type with a
 * usable id, read from the `wireJson` text or its marker) its result with
 * `WITHOUT_LLM` as error, whatever else it holds; null for anything else
 * (the rule the runtime applies to unknown types and ids it cannot use).
 * NAP-LLM, Error Handling (`unsupported`: domain unavailable).
 *
 * @param {string} wire `measureWire`'s `wire`.
 * @returns {{type: string, id: string, error: {code: string, message: string}} | null}
 */
export function refusalWithoutLlm(wire) {
  let envelope = parseJsonOr(wire, null, isObject);
  if (envelope && typeof envelope.json === "string") envelope = parseJsonOr(envelope.json, null, isObject);
  if (!envelope || !REQUEST_TYPES.has(envelope.type) || !usableId(envelope.id)) return null;
  return { type: `${envelope.type}.result`, id: envelope.id, error: { ...WITHOUT_LLM } };
}

/**
 * A short label for an envelope in the inspector: its `type`, or a marker name.
 *
 * @param {string} wireOrEnvelopeJson JSON text.
 * @returns {string}
 */
export function envelopeLabel(wireOrEnvelopeJson) {
  try {
    const value = JSON.parse(wireOrEnvelopeJson);
    if (value && typeof value === "object") {
      if (value.unclonable) return "(unclonable" + (typeof value.type === "string" ? " " + value.type : "") + ")";
      if (value.tooLarge) return "(too large" + (typeof value.type === "string" ? " " + value.type : "") + ")";
      let inner = value;
      if (typeof value.json === "string" && Object.keys(value).length === 1) inner = JSON.parse(value.json);
      if (inner && typeof inner === "object" && typeof inner.type === "string") return inner.type;
      if (inner && typeof inner === "object" && typeof inner.dropped === "string") return "(dropped)";
    }
  } catch {
    // Fall through.
  }
  return "(no type)";
}

/**
 * The envelope text inside a `wireJson` (`{"json": "..."}`), or `text` itself
 * for anything else (markers, runtime envelopes).
 *
 * @param {string} text
 * @returns {string}
 */
export function unwrapWire(text) {
  // Not JSON, or not a wire wrapper: shown as is.
  const value = parseJsonOr(text, null, isObject);
  if (value && typeof value.json === "string" && Object.keys(value).length === 1) return value.json;
  return text;
}
