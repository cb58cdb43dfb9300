/**
 * Reading JSON text the runtime, storage or the page handed over, with a
 * default: the one helper for every "parse, or use this instead" in web/.
 *
 * Rules
 * - Never throws: text that is not JSON gives the fallback, and so does a
 *   parsed value that `accept` refuses (a list where an object was meant).
 * - The text is converted with `String()` first, so a Pyodide string proxy
 *   or a stored non-string reads like its text.
 * - Only for text the shell reads for itself; envelopes from napplets go
 *   through the runtime's one strict reader (napllm.jsontext), not this.
 */

/**
 * The value of JSON `text` when `accept(value)` holds, else `fallback`.
 *
 * @template T
 * @param {unknown} text JSON text.
 * @param {T} fallback returned for text that is not JSON or a value `accept` refuses.
 * @param {(value: unknown) => boolean} [accept] which parsed values are usable (default: all).
 * @returns {unknown | T}
 */
export function parseJsonOr(text, fallback, accept = () => true) {
  let value;
  try {
    value = JSON.parse(String(text));
  } catch (error) {
    if (!(error instanceof SyntaxError)) throw error;
    return fallback;
  }
  return accept(value) ? value : fallback;
}

/** True for a plain JSON object (not null, not an array). */
export const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);

/** True for a JSON object or array (anything `typeof` calls "object", except null). */
export const isObjectOrArray = (value) => value !== null && typeof value === "object";
