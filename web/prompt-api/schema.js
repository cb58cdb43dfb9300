/**
 * JSON Schemas a napplet gives (a `responseConstraint`, a tool's
 * `inputSchema`) and the answers checked against them.
 *
 * Rules
 * - A schema is measured and copied as JSON text first (`compileSchema`):
 *   at most `MAX_SCHEMA_CHARS`, nesting at most 64 deep, every pattern
 *   passing `regexIsBounded` (no exponential backtracking here) and
 *   `patternIsAffordable` (not too ambiguous for the grammar sampler of a
 *   model service that enforces the schema: pattern-cost.js); what is
 *   validated is the copy that was measured, so no getter of the napplet's
 *   object runs later.
 * - The validator is a library (@cfworker/json-schema, pinned in
 *   package-lock.json): it interprets schemas without `eval`/`new
 *   Function`, which the napplet frame's CSP forbids, and supports draft
 *   2020-12 (the draft NAP-LLM names for tool parameters).
 * - A constrained answer is parsed only up to `MAX_ANSWER_CHARS`; one that
 *   is not JSON or does not meet its schema is a `SyntaxError` naming the
 *   first failing location (`checkAnswer`).
 * - A response constraint is a JSON Schema of an object (NAP-LLM's JSON
 *   format answers objects); a RegExp constraint is `NotSupportedError`.
 */

import { Validator } from "@cfworker/json-schema";
import { MAX_ANSWER_CHARS, MAX_PATTERN_CHARS, MAX_SCHEMA_CHARS } from "./limits.js";
import { patternIsAffordable } from "./pattern-cost.js";
import { regexIsBounded } from "./regex-bound.js";

/**
 * Check a JSON Schema given by a napplet and build its validator.
 *
 * @param {unknown} schema a JSON Schema object.
 * @param {string} what where it came from, for messages ("responseConstraint").
 * @returns {{schema: object, text: string, validator: Validator}}
 * @throws {TypeError} not a JSON object, or not JSON-serialisable.
 * @throws {DOMException} `NotSupportedError`: too large, or a pattern that
 *   fails `regexIsBounded` or `patternIsAffordable`, or a schema the
 *   validator cannot read.
 */
export function compileSchema(schema, what) {
  if (typeof schema !== "object" || schema === null || Array.isArray(schema)) {
    throw new TypeError(`${what} must be a JSON Schema object or a RegExp.`);
  }
  let text;
  try {
    text = JSON.stringify(schema);
  } catch {
    throw new TypeError(`${what} is not a JSON value.`);
  }
  if (typeof text !== "string") throw new TypeError(`${what} is not a JSON value.`);
  if (text.length > MAX_SCHEMA_CHARS) {
    throw new DOMException(`${what} is larger than ${MAX_SCHEMA_CHARS} characters of JSON.`, "NotSupportedError");
  }
  // A plain copy: what is validated is what was measured (no getters run later).
  const copy = JSON.parse(text);
  const patterns = [];
  collectPatterns(copy, patterns, 0);
  for (const pattern of patterns) {
    if (!regexIsBounded(pattern)) {
      throw new DOMException(
        `${what} has a pattern this layer does not run (a quantified group holding a quantifier or an alternation, a backreference, or over ${MAX_PATTERN_CHARS} characters).`,
        "NotSupportedError",
      );
    }
    if (!patternIsAffordable(pattern)) {
      throw new DOMException(
        `${what} has a pattern too ambiguous to enforce (written-out or overlapping repetition).`,
        "NotSupportedError",
      );
    }
    try {
      new RegExp(pattern, "u");
    } catch {
      throw new TypeError(`${what} has an invalid pattern.`);
    }
  }
  let validator;
  try {
    validator = new Validator(copy, "2020-12", true);
  } catch {
    throw new DOMException(`${what} is a JSON Schema this layer cannot use.`, "NotSupportedError");
  }
  return { schema: copy, text, validator };
}

/** Every `pattern` value and `patternProperties` key of a schema (a JSON copy), depth-bounded. */
function collectPatterns(node, out, depth) {
  if (depth > 64) {
    throw new DOMException("The JSON Schema is nested too deeply.", "NotSupportedError");
  }
  if (Array.isArray(node)) {
    for (const item of node) collectPatterns(item, out, depth + 1);
    return;
  }
  if (typeof node !== "object" || node === null) return;
  for (const [key, value] of Object.entries(node)) {
    if (key === "pattern" && typeof value === "string") out.push(value);
    if (key === "patternProperties" && typeof value === "object" && value !== null) {
      for (const name of Object.keys(value)) out.push(name);
    }
    collectPatterns(value, out, depth + 1);
  }
}

/**
 * Validate a constrained answer against its schema.
 *
 * @param {string} text the model's answer.
 * @param {{validator: Validator}} compiled from `compileSchema`.
 * @throws {DOMException} `SyntaxError` (the Prompt API's name for an answer
 *   that does not meet its constraint): not JSON, too long, or not valid
 *   against the schema (the message names the first failing location).
 */
export function checkAnswer(text, compiled) {
  if (text.length > MAX_ANSWER_CHARS) {
    throw new DOMException(`The answer is longer than ${MAX_ANSWER_CHARS} characters and was not checked.`, "SyntaxError");
  }
  let value;
  try {
    value = JSON.parse(text);
  } catch {
    throw new DOMException("The model's answer is not JSON, so it does not meet the responseConstraint.", "SyntaxError");
  }
  let result;
  try {
    result = compiled.validator.validate(value);
  } catch {
    throw new DOMException("The model's answer could not be checked against the responseConstraint.", "SyntaxError");
  }
  if (!result.valid) {
    const first = result.errors.find((e) => e.keyword !== "properties" && e.keyword !== "items") || result.errors[0];
    const where = first ? String(first.instanceLocation).slice(0, 200) : "#";
    const why = first ? String(first.error).slice(0, 300) : "invalid";
    throw new DOMException(`The model's answer does not meet the responseConstraint at ${where}: ${why}`, "SyntaxError");
  }
}

/**
 * The compiled `responseConstraint` of prompt options, or null without one.
 *
 * @param {object} options the options of `prompt`, `promptStreaming` or
 *   `measureContextUsage`.
 * @returns {{schema: object, text: string, validator: Validator} | null}
 * @throws {TypeError} `omitResponseConstraintInput` without a constraint,
 *   or a malformed schema (`compileSchema`).
 * @throws {DOMException} `NotSupportedError`: a RegExp, or a schema whose
 *   type is not "object".
 */
export function constraintOf(options) {
  const constraint = options.responseConstraint;
  if (constraint === undefined || constraint === null) {
    if (options.omitResponseConstraintInput) throw new TypeError("omitResponseConstraintInput needs a responseConstraint.");
    return null;
  }
  if (constraint instanceof RegExp) {
    throw new DOMException("RegExp response constraints are not offered by NAP-LLM connections (JSON Schema is).", "NotSupportedError");
  }
  const compiled = compileSchema(constraint, "responseConstraint");
  if (compiled.schema.type !== undefined && compiled.schema.type !== "object") {
    throw new DOMException("NAP-LLM's JSON format answers JSON objects: the schema's type must be \"object\".", "NotSupportedError");
  }
  return compiled;
}

/** The text that asks the model for JSON meeting `constraint` (added unless omitResponseConstraintInput). */
export function constraintInstruction(constraint) {
  return `\n\nAnswer with JSON only, meeting this JSON Schema: ${constraint.text}`;
}

/** Add `text` to the last user message of `messages` (or as a new user message). */
export function addInstruction(messages, text) {
  for (let i = messages.length - 1; i >= 0; i -= 1) {
    if (messages[i].role === "user") {
      messages[i] = { role: "user", content: [...messages[i].content, { type: "text", text }] };
      return;
    }
  }
  messages.push({ role: "user", content: [{ type: "text", text: text.trim() }] });
}
