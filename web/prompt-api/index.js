/**
 * The Prompt API layer: `LanguageModel` (the web's Prompt API) over
 * `window.napplet.llm` (NAP-LLM), for napplets that opt in with
 * `<meta name="napplet-prompt-api">` (docs/napplets.md, "The Prompt API").
 *
 * This folder is not served as it is: build.py bundles this entry module
 * (esbuild follows its imports, the JSON Schema validator included) into
 * one script whose text the shell places into an opted-in napplet's frame
 * right after the prelude (web/js/napplet-page.js `buildSrcdoc`). A napplet
 * has no network, so the layer must arrive inside its document; the shell
 * decides from the napplet's own bytes, so a napplet that does not opt in
 * gets exactly the frame it had.
 *
 * The parts:
 * - session.js: `LanguageModel` and `installPromptApi`; options.js: what
 *   `create()` asks of the connection and its sampling; events.js:
 *   `downloadprogress` and the `on<event>` properties.
 * - messages.js: prompts as NAP-LLM messages; history.js: the bounded
 *   history a session sends; queue.js: operations one after another, and
 *   how destroy and abort stop them; streaming.js: `promptStreaming`.
 * - schema.js and regex-bound.js: schemas and constrained answers; tools.js:
 *   tool definitions and the tool loop's calls.
 * - errors.js: the Prompt API's error names; limits.js: every bound.
 *
 * Rules
 * - Everything here runs in the napplet's own realm, beside the napplet's
 *   code. It holds no secret and no port: it only calls the prelude's
 *   `window.napplet.llm`, which is where consent and validation happen
 *   (NAP-LLM, Shell Behavior). A napplet that tampers with the layer only
 *   changes what it asks the shell for.
 * - Bounded work: a session keeps at most `MAX_HISTORY_MESSAGES` messages and
 *   `MAX_HISTORY_CHARS` of text and image data (older turns are evicted and
 *   `contextoverflow` fires); a tool loop runs at most `MAX_TOOL_ROUNDS`
 *   generations; a JSON Schema is at most `MAX_SCHEMA_CHARS` of JSON text,
 *   and its `pattern`s must pass `regexIsBounded`; a constrained answer is
 *   parsed only up to `MAX_ANSWER_CHARS`.
 * - This module only names what the bundle exports (`installPromptApi`, which
 *   the shell's inline script calls) and what the unit tests check; it
 *   holds no logic of its own.
 */

export { ERROR_NAMES, toDomException } from "./errors.js";
export {
  CHARS_PER_TOKEN,
  MAX_ANSWER_CHARS,
  MAX_HISTORY_CHARS,
  MAX_HISTORY_MESSAGES,
  MAX_PATTERN_CHARS,
  MAX_SCHEMA_CHARS,
  MAX_TOOL_ROUNDS,
} from "./limits.js";
export { patternCost, patternIsAffordable } from "./pattern-cost.js";
export { regexIsBounded } from "./regex-bound.js";
export { checkAnswer, compileSchema } from "./schema.js";
export { installPromptApi } from "./session.js";
