/**
 * The Prompt API layer's bounds: how much a session, a schema, a pattern and
 * an answer may hold (docs/security.md, "The Prompt API layer").
 *
 * Rules
 * - Every bound the layer enforces is named here once; the modules that
 *   enforce them import it from here (the unit tests read them from the
 *   entry module, index.js).
 * - Token figures the connection does not report are estimates from
 *   UTF-16 code units (`estimateTokens`), never exact counts.
 */

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

/** Estimated tokens of UTF-16 code units (no connection reports a tokenizer to napplets). */
export const estimateTokens = (chars) => Math.ceil(chars / CHARS_PER_TOKEN);
