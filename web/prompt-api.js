/**
 * The Prompt API layer: `LanguageModel` (the web's Prompt API) over
 * `window.napplet.llm` (NAP-LLM), for napplets that opt in with
 * `<meta name="napplet-prompt-api">` (docs/napplets.md, "The Prompt API").
 *
 * This file is not served as it is: build.py bundles it with esbuild (and
 * the JSON Schema validator it imports) into one script whose text the
 * shell places into an opted-in napplet's frame right after the prelude
 * (web/js/frames.js `buildSrcdoc`). A napplet has no network, so the layer
 * must arrive inside its document; the shell decides from the napplet's own
 * bytes, so a napplet that does not opt in gets exactly the frame it had.
 *
 * Rules
 * - Everything here runs in the napplet's own realm, beside the napplet's
 *   code. It holds no secret and no port: it only calls the prelude's
 *   `window.napplet.llm`, which is where consent and validation happen
 *   (NAP-LLM, Shell Behavior). A napplet that tampers with the layer only
 *   changes what it asks the shell for.
 * - NAP-LLM's `generate` is stateless: a session keeps its own history and
 *   sends all of it with every prompt; each prompt, and each round of a tool
 *   loop, is one `generate` and so one consent decision.
 * - Errors are `DOMException`s with the Prompt API's names (`ERROR_NAMES`);
 *   input the layer refuses is a `TypeError` (as the Prompt API's IDL
 *   conversion would be).
 * - Bounded work: a session keeps at most `MAX_HISTORY_MESSAGES` messages and
 *   `MAX_HISTORY_CHARS` of text and image data (older turns are evicted and
 *   `contextoverflow` fires); a tool loop runs at most `MAX_TOOL_ROUNDS`
 *   generations; a JSON Schema is at most `MAX_SCHEMA_CHARS` of JSON text,
 *   and its `pattern`s must pass `regexIsBounded`; a constrained answer is
 *   parsed only up to `MAX_ANSWER_CHARS`.
 */

// The JSON Schema validator is a library (@cfworker/json-schema, pinned in
// package-lock.json): it interprets schemas without `eval`/`new Function`,
// which the napplet frame's CSP forbids, and supports draft 2020-12 (the
// draft NAP-LLM names for tool parameters).
import { Validator } from "@cfworker/json-schema";

/** Most messages a session keeps (system prompt included). */
export const MAX_HISTORY_MESSAGES = 256;
/** Most UTF-16 code units of text and image data a session keeps. */
export const MAX_HISTORY_CHARS = 4 * 1024 * 1024;
/** Most generations one prompt may run in a tool loop. */
export const MAX_TOOL_ROUNDS = 8;
/** Largest JSON Schema (response constraint or tool input schema), as JSON text. */
export const MAX_SCHEMA_CHARS = 64 * 1024;
/** Longest regular expression source a schema may hold. */
export const MAX_PATTERN_CHARS = 1000;
/** Longest constrained answer that is parsed and validated. */
export const MAX_ANSWER_CHARS = 1024 * 1024;
/** Characters per estimated token, for figures no connection reports. */
export const CHARS_PER_TOKEN = 4;
/** The names of the tool functions a model may call (NAP-LLM, Tool). */
const TOOL_NAME = /^[A-Za-z0-9_-]{1,64}$/;

/** NAP-LLM error code -> the `DOMException` name the Prompt API uses for that failure. */
export const ERROR_NAMES = Object.freeze({
  "user-cancelled": "NotAllowedError",
  cancelled: "AbortError",
  timeout: "TimeoutError",
  "quota-exceeded": "QuotaExceededError",
  unsupported: "NotSupportedError",
  "selection-expired": "InvalidStateError",
  "invalid-request": "DataError",
  "provider-error": "OperationError",
  "invalid-response": "OperationError",
});

/**
 * Whether a regular expression source is free of the shapes that make a
 * backtracking engine take exponential time: a quantified group that itself
 * holds a quantifier or an alternation (`(a+)+`, `(a|a)*`; an optional
 * group such as `(a+)?` is fine), and backreferences. A conservative syntactic check (it refuses some safe
 * patterns, such as `(ab|cd)*`; `[abcd]*` or a pattern without the group
 * quantifier can replace them).
 *
 * @param {string} source the pattern (JSON Schema `pattern`, ECMA-262 syntax).
 * @returns {boolean}
 */
export function regexIsBounded(source) {
  if (typeof source !== "string" || source.length > MAX_PATTERN_CHARS) return false;
  // One frame per open group: whether it holds a quantifier or an alternation.
  const stack = [{ risky: false }];
  let lastGroupRisky = false; // the atom just closed was a risky group
  let afterAtom = false;
  for (let i = 0; i < source.length; i += 1) {
    const c = source[i];
    if (c === "\\") {
      const next = source[i + 1];
      if (next === undefined) return false;
      if (/[1-9]/.test(next) || next === "k") return false; // backreference
      i += 1;
      afterAtom = true;
      lastGroupRisky = false;
      continue;
    }
    if (c === "[") {
      // a class: skip to its end (escapes inside included)
      i += 1;
      if (source[i] === "^") i += 1;
      if (source[i] === "]") i += 1;
      while (i < source.length && source[i] !== "]") {
        if (source[i] === "\\") i += 1;
        i += 1;
      }
      if (i >= source.length) return false;
      afterAtom = true;
      lastGroupRisky = false;
      continue;
    }
    if (c === "(") {
      stack.push({ risky: false });
      if (source[i + 1] === "?") {
        // (?: (?= (?! (?<= (?<! (?<name>
        i += 1;
        if (source[i + 1] === "<" && source[i + 2] !== "=" && source[i + 2] !== "!") {
          const end = source.indexOf(">", i);
          if (end === -1) return false;
          i = end;
        } else {
          i += source[i + 1] === "<" ? 2 : 1;
        }
      }
      afterAtom = false;
      continue;
    }
    if (c === ")") {
      if (stack.length === 1) return false;
      const group = stack.pop();
      lastGroupRisky = group.risky;
      if (group.risky) stack[stack.length - 1].risky = true;
      afterAtom = true;
      continue;
    }
    if (c === "|") {
      stack[stack.length - 1].risky = true;
      afterAtom = false;
      lastGroupRisky = false;
      continue;
    }
    const quantifier = c === "*" || c === "+" || c === "?" || (c === "{" && /^\{\d+(,\d*)?\}/.test(source.slice(i, i + 24)));
    if (quantifier && afterAtom) {
      // `?`, `{0,1}` and `{1}` do not repeat: only repeating quantifiers nest badly.
      const bounds = c === "{" ? /^\{(\d+)(,(\d*))?\}/.exec(source.slice(i, i + 24)) : null;
      const repeats = c === "*" || c === "+" || (bounds !== null && (bounds[2] === undefined ? Number(bounds[1]) > 1 : bounds[3] === "" || Number(bounds[3]) > 1));
      if (lastGroupRisky && repeats) return false;
      stack[stack.length - 1].risky = true;
      if (c === "{") i = source.indexOf("}", i);
      if (source[i + 1] === "?") i += 1; // lazy
      afterAtom = false;
      lastGroupRisky = false;
      continue;
    }
    afterAtom = true;
    lastGroupRisky = false;
  }
  return stack.length === 1;
}

/**
 * Check a JSON Schema given by a napplet and build its validator.
 *
 * @param {unknown} schema a JSON Schema object.
 * @param {string} what where it came from, for messages ("responseConstraint").
 * @returns {{schema: object, text: string, validator: Validator}}
 * @throws {TypeError} not a JSON object, or not JSON-serialisable.
 * @throws {DOMException} `NotSupportedError`: too large, or a pattern that
 *   fails `regexIsBounded`, or a schema the validator cannot read.
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

/** A DOMException for an NAP-LLM `LlmError` (or anything thrown by the binding). */
export function toDomException(err) {
  if (err instanceof DOMException) return err;
  const code = err && typeof err.code === "string" ? err.code : "";
  const name = ERROR_NAMES[code] || "UnknownError";
  const message = err && typeof err.message === "string" ? err.message : "The request failed.";
  const exception = new DOMException(code ? `${message} (NAP-LLM: ${code})` : message, name);
  return exception;
}

/** Estimated tokens of UTF-16 code units (no connection reports a tokenizer to napplets). */
const estimateTokens = (chars) => Math.ceil(chars / CHARS_PER_TOKEN);

/** UTF-16 code units a NAP-LLM message holds (text, image data, tool arguments). */
function messageChars(message) {
  let n = 0;
  for (const part of message.content) {
    if (part.type === "text" || part.type === "thinking") n += part.text.length;
    else if (part.type === "image") n += part.data.length;
    else if (part.type === "toolCall") n += part.name.length + JSON.stringify(part.arguments).length;
  }
  return n;
}

const abortReason = (signal) =>
  signal.reason !== undefined ? signal.reason : new DOMException("The operation was aborted.", "AbortError");

function checkSignal(signal) {
  if (signal === undefined || signal === null) return null;
  if (typeof signal !== "object" || typeof signal.aborted !== "boolean" || typeof signal.addEventListener !== "function") {
    throw new TypeError("signal must be an AbortSignal.");
  }
  return signal;
}

/** base64 of bytes (standard, padded). */
function base64(bytes) {
  let binary = "";
  const CHUNK = 0x8000;
  for (let i = 0; i < bytes.length; i += CHUNK) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + CHUNK));
  }
  return btoa(binary);
}

/** The image MIME type of raw bytes by signature (NAP-LLM accepts png, jpeg, webp). */
function sniffImage(bytes) {
  if (bytes.length >= 8 && bytes[0] === 0x89 && bytes[1] === 0x50 && bytes[2] === 0x4e && bytes[3] === 0x47) return "image/png";
  if (bytes.length >= 3 && bytes[0] === 0xff && bytes[1] === 0xd8 && bytes[2] === 0xff) return "image/jpeg";
  if (bytes.length >= 12 && String.fromCharCode(...bytes.subarray(0, 4)) === "RIFF" && String.fromCharCode(...bytes.subarray(8, 12)) === "WEBP") {
    return "image/webp";
  }
  return null;
}

/**
 * An NAP-LLM image part from a Prompt API image value: a Blob or bytes in
 * PNG, JPEG or WebP are sent as they are; anything `createImageBitmap` takes
 * (a canvas, an <img>, ImageData, ImageBitmap...) is drawn and sent as PNG.
 *
 * @throws {DOMException} `EncodingError` for bytes in another format.
 */
async function imagePart(value) {
  let bytes = null;
  if (value instanceof Blob) bytes = new Uint8Array(await value.arrayBuffer());
  else if (value instanceof ArrayBuffer) bytes = new Uint8Array(value.slice(0));
  else if (ArrayBuffer.isView(value)) bytes = new Uint8Array(value.buffer.slice(value.byteOffset, value.byteOffset + value.byteLength));
  if (bytes) {
    const mimeType = sniffImage(bytes);
    if (!mimeType) throw new DOMException("The image is not PNG, JPEG or WebP.", "EncodingError");
    return { type: "image", mimeType, data: base64(bytes) };
  }
  let bitmap;
  try {
    bitmap = await createImageBitmap(value);
  } catch {
    throw new TypeError("An image value must be a Blob, bytes, or an image source createImageBitmap accepts.");
  }
  const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
  canvas.getContext("2d").drawImage(bitmap, 0, 0);
  bitmap.close();
  const blob = await canvas.convertToBlob({ type: "image/png" });
  return { type: "image", mimeType: "image/png", data: base64(new Uint8Array(await blob.arrayBuffer())) };
}

/** One Prompt API content item -> an NAP-LLM part. */
async function partOf(item, role) {
  if (typeof item !== "object" || item === null) throw new TypeError("A content item must be an object {type, value}.");
  const value = "value" in item ? item.value : item.content;
  switch (item.type) {
    case "text":
      if (typeof value !== "string") throw new TypeError("A text content value must be a string.");
      return { type: "text", text: value };
    case "image":
      if (role === "assistant") throw new DOMException("Assistant messages cannot hold images.", "NotSupportedError");
      return imagePart(value);
    case "audio":
      throw new DOMException("Audio input is not offered by NAP-LLM connections.", "NotSupportedError");
    case "tool-call":
    case "tool-response":
      throw new DOMException(
        "Tool calls in prompts (open-loop tool use) are not offered by this layer: give each tool an execute function.",
        "NotSupportedError",
      );
    default:
      throw new TypeError(`Unknown content type ${JSON.stringify(String(item.type))}.`);
  }
}

/**
 * A Prompt API prompt (a string, or an array of `{role, content, prefix?}`)
 * as NAP-LLM messages.
 *
 * @param {unknown} input
 * @param {boolean} systemAllowed whether a system message may come first.
 * @returns {Promise<object[]>} NAP-LLM messages.
 * @throws {TypeError} malformed input, or a system message anywhere but first.
 * @throws {DOMException} `NotSupportedError` for audio, prefixes and tool content.
 */
async function messagesOf(input, systemAllowed) {
  if (typeof input === "string") return [{ role: "user", content: [{ type: "text", text: input }] }];
  if (!Array.isArray(input)) throw new TypeError("A prompt must be a string or an array of messages.");
  if (input.length > MAX_HISTORY_MESSAGES) {
    throw new DOMException(`A prompt may hold at most ${MAX_HISTORY_MESSAGES} messages.`, "QuotaExceededError");
  }
  const out = [];
  for (let i = 0; i < input.length; i += 1) {
    const message = input[i];
    if (typeof message !== "object" || message === null) throw new TypeError("A message must be an object {role, content}.");
    const role = message.role === undefined ? "user" : message.role;
    if (role !== "system" && role !== "user" && role !== "assistant") throw new TypeError(`Unknown role ${JSON.stringify(String(role))}.`);
    if (role === "system" && !(systemAllowed && i === 0)) {
      throw new TypeError("A system message may only be the first message of a session.");
    }
    if (message.prefix === true) {
      throw new DOMException("Assistant prefixes are not offered by NAP-LLM connections.", "NotSupportedError");
    }
    let content;
    if (typeof message.content === "string") content = [{ type: "text", text: message.content }];
    else if (Array.isArray(message.content) && message.content.length > 0) {
      content = [];
      for (const item of message.content) content.push(await partOf(item, role));
    } else throw new TypeError("A message's content must be a string or a non-empty array.");
    out.push({ role, content });
  }
  if (out.length === 0) throw new TypeError("A prompt must hold at least one message.");
  return out;
}

/** The Prompt API's `downloadprogress` event: `loaded` from 0 to 1. */
class DownloadProgressEvent extends Event {
  constructor(type, init) {
    super(type);
    this.loaded = init.loaded;
    this.total = 1;
    this.lengthComputable = true;
  }
}

/** What `monitor(m)` receives at `create()`. */
class CreateMonitor extends EventTarget {
  #handler = null;
  get ondownloadprogress() {
    return this.#handler;
  }
  set ondownloadprogress(fn) {
    if (this.#handler) this.removeEventListener("downloadprogress", this.#handler);
    this.#handler = typeof fn === "function" ? fn : null;
    if (this.#handler) this.addEventListener("downloadprogress", this.#handler);
  }
}

/** Turns a tool list of `create()` into NAP-LLM tools plus the functions to run. */
function toolsOf(tools) {
  if (tools === undefined) return { request: [], byName: new Map() };
  if (!Array.isArray(tools)) throw new TypeError("tools must be an array.");
  const request = [];
  const byName = new Map();
  for (const tool of tools) {
    if (typeof tool !== "object" || tool === null) throw new TypeError("A tool must be an object.");
    if (typeof tool.name !== "string" || !TOOL_NAME.test(tool.name)) {
      throw new TypeError("A tool name must be 1-64 letters, digits, '_' or '-'.");
    }
    if (byName.has(tool.name)) throw new TypeError(`Two tools are named ${tool.name}.`);
    if (typeof tool.execute !== "function") {
      throw new DOMException(
        `Tool ${tool.name} has no execute function; open-loop tool use is not offered by this layer.`,
        "NotSupportedError",
      );
    }
    const schema = tool.inputSchema === undefined ? { type: "object", properties: {} } : tool.inputSchema;
    const compiled = compileSchema(schema, `The inputSchema of tool ${tool.name}`);
    if (compiled.schema.type !== "object") throw new TypeError(`The inputSchema of tool ${tool.name} must have type "object".`);
    const entry = { name: tool.name, parameters: compiled.schema };
    if (typeof tool.description === "string") entry.description = tool.description;
    request.push(entry);
    byName.set(tool.name, { execute: tool.execute, compiled });
  }
  return { request, byName };
}

const SAMPLING_TEMPERATURE = Object.freeze({
  "most-predictable": 0,
  predictable: 0.2,
  "slightly-predictable": 0.4,
  balanced: undefined,
  "slightly-creative": 0.9,
  creative: 1.1,
  "most-creative": 1.3,
});

/**
 * Install the layer in `win`: `win.NappletLanguageModel` always, and
 * `win.LanguageModel` unless `mode` is "NappletLanguageModel" (then a native
 * `LanguageModel`, if any, stays as it is).
 *
 * @param {Window} win the napplet's window.
 * @param {string} mode the opt-in `<meta>`'s content ("" or "LanguageModel",
 *   or "NappletLanguageModel").
 * @returns {Function} the layer's `LanguageModel` class.
 */
export function installPromptApi(win, mode) {
  const INTERNAL = Symbol("internal");
  const napplet = win.napplet;
  const llm = napplet && napplet.llm ? napplet.llm : null;
  const native = typeof win.LanguageModel === "function" ? win.LanguageModel : null;

  /** One session: its connection, options and history (Prompt API `LanguageModel`). */
  class LanguageModel extends EventTarget {
    #model;
    #tools;
    #temperature;
    #history;
    #reported = 0; // tokens the connection reported for the history it answered
    #reportedLength = 0; // history length when it reported them
    #destroyed = false;
    #destroyReason = null;
    #queue = Promise.resolve();
    #running = new Set(); // generation handles of this session's active generations
    #rejectors = new Set(); // reject functions of pending operations
    #overflowHandler = null;
    #samplingMode;

    constructor(token, state) {
      if (token !== INTERNAL) throw new TypeError("Illegal constructor: use LanguageModel.create().");
      super();
      this.#model = state.model;
      this.#tools = state.tools;
      this.#temperature = state.temperature;
      this.#samplingMode = state.samplingMode;
      this.#history = state.history;
      this.#reported = state.reported || 0;
      this.#reportedLength = state.reportedLength || 0;
    }

    /**
     * "available" when this napplet has model access (`window.napplet.llm`), else
     * "unavailable"; never opens a chooser. Audio input and non-text output
     * are "unavailable" (NAP-LLM has neither).
     */
    static async availability(options) {
      if (!llm) return "unavailable";
      try {
        LanguageModel.#requirementsOf(options === undefined || options === null ? {} : options);
      } catch {
        return "unavailable";
      }
      return "available";
    }

    /** The Prompt API's legacy `params()`: null (no sampling limits are reported by NAP-LLM). */
    static async params() {
      return null;
    }

    static #requirementsOf(options) {
      const requirements = {};
      const inputs = options.expectedInputs === undefined ? [] : options.expectedInputs;
      const outputs = options.expectedOutputs === undefined ? [] : options.expectedOutputs;
      if (!Array.isArray(inputs) || !Array.isArray(outputs)) throw new TypeError("expectedInputs and expectedOutputs must be arrays.");
      for (const expected of inputs) {
        const type = expected && expected.type;
        if (type === "image") requirements.images = true;
        else if (type === "audio") throw new DOMException("Audio input is not offered by NAP-LLM connections.", "NotSupportedError");
        else if (type !== "text" && type !== "tool-response" && type !== "tool-call") throw new TypeError("Unknown expected input type.");
      }
      for (const expected of outputs) {
        const type = expected && expected.type;
        if (type !== "text" && type !== "tool-call") throw new DOMException("Only text output is offered.", "NotSupportedError");
      }
      if (Array.isArray(options.tools) && options.tools.length > 0) requirements.tools = true;
      return requirements;
    }

    /**
     * Open the chooser (NAP-LLM `select`) with requirements from
     * `expectedInputs` (images) and `tools`, and resolve with a session whose
     * history is `initialPrompts`. Rejects: `NotAllowedError` when the user
     * cancels the chooser, `NotSupportedError` for what NAP-LLM cannot do,
     * `TypeError` for malformed options, the signal's reason when aborted.
     */
    static async create(options) {
      // As a WebIDL dictionary: undefined and null are the empty options.
      if (options === undefined || options === null) options = {};
      if (typeof options !== "object") throw new TypeError("options must be an object.");
      const signal = checkSignal(options.signal);
      if (signal && signal.aborted) throw abortReason(signal);
      if (!llm) {
        throw new DOMException("This napplet has no model access (its LLM access is off).", "NotAllowedError");
      }
      const requirements = LanguageModel.#requirementsOf(options);
      const tools = toolsOf(options.tools);
      let temperature;
      let samplingMode = null;
      if (options.samplingMode !== undefined) {
        if (!(options.samplingMode in SAMPLING_TEMPERATURE)) throw new TypeError("Unknown samplingMode.");
        samplingMode = options.samplingMode;
        temperature = SAMPLING_TEMPERATURE[samplingMode];
        if (options.temperature !== undefined) throw new TypeError("Give samplingMode or temperature, not both.");
      } else if (options.temperature !== undefined) {
        if (typeof options.temperature !== "number" || !(options.temperature >= 0)) throw new RangeError("temperature must be a number >= 0.");
        temperature = options.temperature;
      }
      const history = options.initialPrompts === undefined ? [] : await messagesOf(options.initialPrompts, true);
      if (history.length > MAX_HISTORY_MESSAGES || history.reduce((n, m) => n + messageChars(m), 0) > MAX_HISTORY_CHARS) {
        throw new DOMException("initialPrompts are larger than a session holds.", "QuotaExceededError");
      }
      const monitor = new CreateMonitor();
      if (options.monitor !== undefined) {
        if (typeof options.monitor !== "function") throw new TypeError("monitor must be a function.");
        options.monitor(monitor);
      }
      monitor.dispatchEvent(new DownloadProgressEvent("downloadprogress", { loaded: 0 }));
      const selecting = llm.select(requirements);
      let model;
      try {
        model = await (signal
          ? new Promise((resolve, reject) => {
              const onAbort = () => reject(abortReason(signal));
              signal.addEventListener("abort", onAbort, { once: true });
              selecting.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
            })
          : selecting);
      } catch (err) {
        // An abort rejects with the signal's own reason, whatever it is.
        throw signal && signal.aborted ? abortReason(signal) : toDomException(err);
      }
      monitor.dispatchEvent(new DownloadProgressEvent("downloadprogress", { loaded: 1 }));
      const session = new LanguageModel(INTERNAL, { model, tools, temperature, samplingMode, history });
      if (signal) signal.addEventListener("abort", () => session.destroy(abortReason(signal)), { once: true });
      return session;
    }

    /** Tokens the history takes: the connection's last report, plus estimates for messages added since. */
    get contextUsage() {
      let chars = 0;
      for (let i = this.#reportedLength; i < this.#history.length; i += 1) chars += messageChars(this.#history[i]);
      return this.#reported + estimateTokens(chars);
    }

    /** The connection's context size in tokens: unknown to NAP-LLM napplets, so Infinity. */
    get contextWindow() {
      return Infinity;
    }

    /** Deprecated alias (extensions). */
    get inputUsage() {
      return this.contextUsage;
    }

    get inputQuota() {
      return this.contextWindow;
    }

    get samplingMode() {
      return this.#samplingMode;
    }

    get temperature() {
      return this.#temperature;
    }

    get topK() {
      return undefined;
    }

    get oncontextoverflow() {
      return this.#overflowHandler;
    }

    set oncontextoverflow(fn) {
      if (this.#overflowHandler) this.removeEventListener("contextoverflow", this.#overflowHandler);
      this.#overflowHandler = typeof fn === "function" ? fn : null;
      if (this.#overflowHandler) this.addEventListener("contextoverflow", this.#overflowHandler);
    }

    /** The same history in a new session (no chooser: the same connection). */
    async clone(options = {}) {
      const signal = checkSignal(options && options.signal);
      if (signal && signal.aborted) throw abortReason(signal);
      this.#checkAlive();
      // Waits for the queued operations, so the copy holds their turns.
      await this.#enqueue(async () => {}, signal);
      const copy = new LanguageModel(INTERNAL, {
        model: this.#model,
        tools: this.#tools,
        temperature: this.#temperature,
        samplingMode: this.#samplingMode,
        history: structuredClone(this.#history),
        reported: this.#reported,
        reportedLength: this.#reportedLength,
      });
      if (signal) signal.addEventListener("abort", () => copy.destroy(abortReason(signal)), { once: true });
      return copy;
    }

    /** Cancel what runs (NAP-LLM `cancel`), reject what waits; later calls are `InvalidStateError`. */
    destroy(reason) {
      if (this.#destroyed) return;
      this.#destroyed = true;
      this.#destroyReason = reason !== undefined ? reason : new DOMException("The session was destroyed.", "AbortError");
      for (const handle of this.#running) handle.cancel().catch(() => {});
      for (const reject of this.#rejectors) reject(this.#destroyReason);
      this.#rejectors.clear();
    }

    #checkAlive() {
      if (this.#destroyed) throw new DOMException("The session was destroyed.", "InvalidStateError");
    }

    /**
     * Run `task(op)` after the session's earlier operations. `destroy()` and
     * `signal` reject it at once, set `op.stopped` and call every function in
     * `op.cancels` (the generation it runs is cancelled, nothing is committed).
     */
    #enqueue(task, signal) {
      const run = this.#queue.then(() => new Promise((resolve, reject) => {
        if (this.#destroyed) {
          reject(this.#destroyReason);
          return;
        }
        if (signal && signal.aborted) {
          reject(abortReason(signal));
          return;
        }
        const op = { stopped: false, cancels: new Set() };
        const stop = (reason) => {
          op.stopped = true;
          for (const cancel of op.cancels) cancel();
          reject(reason);
        };
        const onAbort = () => stop(abortReason(signal));
        if (signal) signal.addEventListener("abort", onAbort, { once: true });
        this.#rejectors.add(stop);
        task(op).then(resolve, reject).finally(() => {
          this.#rejectors.delete(stop);
          if (signal) signal.removeEventListener("abort", onAbort);
        });
      }));
      this.#queue = run.catch(() => {});
      return run;
    }

    /**
     * Evict the oldest non-system messages (and any toolResult left without
     * its call) until `extra` more messages fit the bounds; fires
     * `contextoverflow` once when anything was evicted.
     *
     * @throws {DOMException} `QuotaExceededError` when `extra` alone does not fit.
     */
    #makeRoom(extra) {
      const chars = extra.reduce((n, m) => n + messageChars(m), 0);
      const start = this.#history.length > 0 && this.#history[0].role === "system" ? 1 : 0;
      if (extra.length + start > MAX_HISTORY_MESSAGES || chars > MAX_HISTORY_CHARS) {
        throw new DOMException("The input is larger than a session holds.", "QuotaExceededError");
      }
      let total = this.#history.reduce((n, m) => n + messageChars(m), 0) + chars;
      let evicted = false;
      while (this.#history.length > start && (this.#history.length + extra.length > MAX_HISTORY_MESSAGES
        || total > MAX_HISTORY_CHARS || (evicted && this.#history[start].role === "toolResult"))) {
        const [gone] = this.#history.splice(start, 1);
        total -= messageChars(gone);
        evicted = true;
      }
      if (evicted) {
        // The connection's figure covered messages that are gone now.
        this.#reported = 0;
        this.#reportedLength = start;
        this.dispatchEvent(new Event("contextoverflow"));
      }
    }

    /** Add messages to the history, making room first (`#makeRoom`). */
    #commit(messages) {
      this.#makeRoom(messages);
      this.#history.push(...messages);
    }

    /** Add to the history without generating. */
    async append(input, options = {}) {
      const signal = checkSignal(options && options.signal);
      if (signal && signal.aborted) throw abortReason(signal);
      this.#checkAlive();
      const messages = await messagesOf(input, this.#history.length === 0);
      this.#checkImages(messages);
      await this.#enqueue(async (op) => {
        if (messages[0].role === "system" && this.#history.length > 0) {
          throw new TypeError("A system message may only be the first message of a session.");
        }
        if (!op.stopped) this.#commit(messages);
      }, signal);
    }

    /** Estimated tokens `input` (and its constraint text) would add; no request is made. */
    async measureContextUsage(input, options = {}) {
      this.#checkAlive();
      const messages = await messagesOf(input, true);
      let chars = messages.reduce((n, m) => n + messageChars(m), 0);
      const constraint = this.#constraintOf(options || {});
      if (constraint && !options.omitResponseConstraintInput) chars += constraintInstruction(constraint).length;
      return estimateTokens(chars);
    }

    /** Deprecated alias (extensions). */
    measureInputUsage(input, options) {
      return this.measureContextUsage(input, options);
    }

    #checkImages(messages) {
      if (!this.#model.images && messages.some((m) => m.content.some((p) => p.type === "image"))) {
        throw new DOMException("The chosen connection does not take images (create the session with expectedInputs [{type: \"image\"}]).", "NotSupportedError");
      }
    }

    #constraintOf(options) {
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

    /** The answer to `input` as one string (`responseConstraint`: JSON text meeting the schema). */
    async prompt(input, options = {}) {
      return this.#start(input, options || {}, null);
    }

    /** The answer to `input` as a ReadableStream of text chunks (each chunk new text only). */
    promptStreaming(input, options = {}) {
      let controller;
      let cancelled = false;
      const stream = new ReadableStream({
        start: (c) => {
          controller = c;
        },
        cancel: () => {
          cancelled = true;
          for (const handle of this.#running) if (handle.streamed === stream) handle.cancel().catch(() => {});
        },
      });
      const sink = {
        stream,
        chunk(text) {
          if (!cancelled && text) controller.enqueue(text);
        },
      };
      this.#start(input, options || {}, sink).then(
        () => {
          if (!cancelled) controller.close();
        },
        (err) => {
          if (!cancelled) controller.error(err);
        },
      );
      return stream;
    }

    async #start(input, options, sink) {
      const signal = checkSignal(options.signal);
      if (signal && signal.aborted) throw abortReason(signal);
      this.#checkAlive();
      const constraint = this.#constraintOf(options);
      if (constraint && !this.#model.json) {
        throw new DOMException("The chosen connection does not offer JSON output.", "NotSupportedError");
      }
      const messages = await messagesOf(input, this.#history.length === 0);
      this.#checkImages(messages);
      if (constraint && !options.omitResponseConstraintInput) addInstruction(messages, constraintInstruction(constraint));
      return this.#enqueue((op) => this.#converse(messages, constraint, sink, op), signal);
    }

    /** One prompt: generations (a tool loop when tools run) until a final answer. */
    async #converse(messages, constraint, sink, op) {
      if (messages[0].role === "system" && this.#history.length > 0) {
        throw new TypeError("A system message may only be the first message of a session.");
      }
      const turn = messages.slice();
      let answer = "";
      let usage = null;
      for (let round = 0; ; round += 1) {
        if (round >= MAX_TOOL_ROUNDS) {
          throw new DOMException(`The model asked for tools in more than ${MAX_TOOL_ROUNDS} rounds.`, "OperationError");
        }
        // The history is bounded with this turn in it: old turns make room.
        this.#makeRoom(turn);
        const request = { handle: this.#model.handle, messages: this.#history.concat(turn) };
        if (constraint) request.format = "json";
        if (this.#temperature !== undefined) request.temperature = this.#temperature;
        if (this.#tools.request.length > 0) request.tools = this.#tools.request;
        const handle = llm.generate(request, {
          onDelta: sink ? (d) => {
            if (d.block === "text" && d.event === "delta") sink.chunk(d.text);
          } : undefined,
        });
        const tracked = { cancel: () => handle.cancel(), streamed: sink ? sink.stream : null };
        this.#running.add(tracked);
        // An abort or destroy rejects the operation at once; the generation is cancelled too.
        const stop = () => handle.cancel().catch(() => {});
        op.cancels.add(stop);
        if (op.stopped) stop();
        let result;
        try {
          result = await handle;
        } catch (err) {
          throw toDomException(err);
        } finally {
          this.#running.delete(tracked);
          op.cancels.delete(stop);
        }
        if (op.stopped || this.#destroyed) throw new DOMException("The operation was aborted.", "AbortError");
        if (result.usage) usage = result.usage.inputTokens + result.usage.outputTokens;
        const text = result.content.filter((p) => p.type === "text").map((p) => p.text).join("");
        const calls = result.content.filter((p) => p.type === "toolCall");
        const kept = result.content.filter((p) => p.type === "text" || p.type === "toolCall");
        turn.push({ role: "assistant", content: kept.length > 0 ? kept : [{ type: "text", text: "" }] });
        if (result.finish === "refusal") throw new DOMException("The model refused to answer.", "OperationError");
        if (result.finish === "toolUse" && calls.length > 0) {
          turn.push(...(await this.#runTools(calls, op)));
          continue;
        }
        answer = text;
        break;
      }
      if (constraint) checkAnswer(answer, constraint);
      if (op.stopped) throw new DOMException("The operation was aborted.", "AbortError");
      this.#commit(turn);
      if (usage !== null && this.#history.length >= turn.length) {
        // The connection's count covers the request of the last round and its answer.
        this.#reported = usage;
        this.#reportedLength = this.#history.length;
      }
      return answer;
    }

    /** Run each call's `execute` (concurrently); their results as NAP-LLM toolResult messages. */
    async #runTools(calls, op) {
      return Promise.all(calls.map(async (call) => {
        const tool = this.#tools.byName.get(call.name);
        const base = { role: "toolResult", toolCallId: call.toolCallId, toolName: call.name };
        if (!tool) {
          return { ...base, isError: true, content: [{ type: "text", text: `There is no tool named ${call.name}.` }] };
        }
        let check;
        try {
          check = tool.compiled.validator.validate(call.arguments);
        } catch {
          check = { valid: false, errors: [] };
        }
        if (!check.valid) {
          return { ...base, isError: true, content: [{ type: "text", text: "The arguments do not match the tool's inputSchema." }] };
        }
        // A tool that throws ends the prompt with its own error (the napplet's code failed).
        const value = await tool.execute(call.arguments);
        if (op.stopped) throw new DOMException("The operation was aborted.", "AbortError");
        const text = typeof value === "string" ? value : JSON.stringify(value === undefined ? null : value);
        return { ...base, content: [{ type: "text", text: typeof text === "string" ? text : "null" }] };
      }));
    }
  }

  Object.defineProperty(LanguageModel, Symbol.toStringTag, { value: "LanguageModel" });
  if (native) Object.defineProperty(LanguageModel, "native", { value: native });
  Object.freeze(LanguageModel.prototype);
  Object.freeze(LanguageModel);
  const define = (name) => Object.defineProperty(win, name, { value: LanguageModel, writable: true, configurable: true, enumerable: false });
  define("NappletLanguageModel");
  if (mode !== "NappletLanguageModel") define("LanguageModel");
  return LanguageModel;
}

/** The text that asks the model for JSON meeting `constraint` (added unless omitResponseConstraintInput). */
function constraintInstruction(constraint) {
  return `\n\nAnswer with JSON only, meeting this JSON Schema: ${constraint.text}`;
}

/** Add `text` to the last user message of `messages` (or as a new user message). */
function addInstruction(messages, text) {
  for (let i = messages.length - 1; i >= 0; i -= 1) {
    if (messages[i].role === "user") {
      messages[i] = { role: "user", content: [...messages[i].content, { type: "text", text }] };
      return;
    }
  }
  messages.push({ role: "user", content: [{ type: "text", text: text.trim() }] });
}
