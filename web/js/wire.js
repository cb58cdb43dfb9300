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

/**
 * Classify `data` without throwing: OK, UNCLONABLE or TOO_LARGE.
 *
 * `budget` is a lower bound of the JSON text length; passing it proves the
 * text would be too large.
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
  // Each frame: [value, depth, leaving]. `path` holds the ancestor chain
  // (records of the objects being walked), `onPath` the same objects, to
  // detect cycles; `done` the objects already walked: {chars, height}.
  const stack = [[data, 0, false]];
  const path = [];
  const onPath = new Set();
  const done = new Map();
  // Note that an object at `depth` exists below the innermost open object.
  const reach = (depth) => {
    const top = path[path.length - 1];
    if (top && depth > top.deepest) top.deepest = depth;
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
          if (!Number.isFinite(value)) return UNCLONABLE;
          budget += String(value).length; // what JSON writes for it
          break;
        case "object": {
          const seen = done.get(value);
          if (seen !== undefined) {
            if (depth + seen.height >= maxDepth) return TOO_LARGE;
            budget += seen.chars;
            reach(depth + seen.height);
            break;
          }
          if (depth >= maxDepth) return TOO_LARGE;
          if (onPath.has(value)) return UNCLONABLE;
          const record = { start: budget, deepest: depth };
          reach(depth);
          if (Array.isArray(value)) {
            if (Object.getPrototypeOf(value) !== Array.prototype) return UNCLONABLE;
            // Brackets and commas; each element counts its own text when visited.
            budget += 2 + Math.max(0, value.length - 1);
            if (budget > maxChars) return TOO_LARGE;
            const keys = Object.keys(value);
            // A hole or an extra named property would be lost or changed by JSON.
            if (keys.length !== value.length) return UNCLONABLE;
            path.push(record);
            onPath.add(value);
            stack.push([value, depth, true]);
            for (let i = value.length - 1; i >= 0; i -= 1) {
              if (!Object.prototype.hasOwnProperty.call(value, i)) return UNCLONABLE;
              stack.push([value[i], depth + 1, false]);
            }
          } else {
            if (!isPlainObject(value)) return UNCLONABLE;
            const keys = Object.keys(value);
            budget += 2 + keys.length * 3; // quotes and colon per key
            if (budget > maxChars) return TOO_LARGE;
            path.push(record);
            onPath.add(value);
            stack.push([value, depth, true]);
            for (let i = keys.length - 1; i >= 0; i -= 1) {
              const key = keys[i];
              const descriptor = Object.getOwnPropertyDescriptor(value, key);
              if (!descriptor || !("value" in descriptor)) return UNCLONABLE;
              budget += key.length;
              stack.push([descriptor.value, depth + 1, false]);
            }
          }
          break;
        }
        default:
          // undefined, bigint, symbol, function.
          return UNCLONABLE;
      }
    }
    if (budget > maxChars) return TOO_LARGE;
  }
  return OK;
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
 * The bridge's `wireJson` for one received message.
 *
 * @param {*} data `MessageEvent.data` as received from a napplet frame.
 * @param {{maxChars?: number, maxDepth?: number}} [limits] for tests.
 * @returns {string} `{"json": "..."}`, `{"unclonable": true, ...}` or
 *   `{"tooLarge": true, ...}`, always valid JSON text.
 */
export function toWireJson(data, limits = {}) {
  const maxChars = limits.maxChars ?? MAX_WIRE_CHARS;
  const maxDepth = limits.maxDepth ?? MAX_DEPTH;
  let verdict;
  try {
    verdict = classify(data, maxChars, maxDepth);
  } catch {
    verdict = UNCLONABLE;
  }
  if (verdict === UNCLONABLE) return marker("unclonable", data);
  if (verdict === TOO_LARGE) return marker("tooLarge", data);
  let text;
  try {
    text = JSON.stringify(data);
  } catch {
    return marker("unclonable", data);
  }
  // Escapes can make the text longer than the walk's estimate.
  if (text.length > maxChars) return marker("tooLarge", data);
  return JSON.stringify({ json: text });
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
