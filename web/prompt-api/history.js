/**
 * A session's history: the NAP-LLM messages it sends with every prompt,
 * bounded, with the connection's last token count.
 *
 * Rules
 * - NAP-LLM's `generate` is stateless: the session keeps its own history
 *   and sends all of it with every prompt.
 * - Bounded: at most `MAX_HISTORY_MESSAGES` messages and
 *   `MAX_HISTORY_CHARS` of text and image data (`messageChars`). Room is
 *   made by evicting the oldest messages after the system prompt (and a
 *   toolResult left without its call); each eviction calls `onOverflow`
 *   once (the session's `contextoverflow`). Input that alone does not fit
 *   is `QuotaExceededError`, and nothing is evicted for it.
 * - Usage is the connection's reported count for the history it answered
 *   plus estimates (`estimateTokens`) for messages added since; an
 *   eviction drops the report (it covered messages that are gone).
 */

import { MAX_HISTORY_CHARS, MAX_HISTORY_MESSAGES, estimateTokens } from "./limits.js";
import { messageChars } from "./messages.js";

export class History {
  #messages;
  #reported; // tokens the connection reported for the history it answered
  #reportedLength; // history length when it reported them
  #onOverflow;

  /**
   * @param {object[]} messages the first NAP-LLM messages (taken, not copied).
   * @param {{reported?: number, reportedLength?: number, onOverflow: () => void}} state
   *   a reported token count and the length it covered (from `copy`), and
   *   what to call when messages are evicted.
   */
  constructor(messages, { reported, reportedLength, onOverflow }) {
    this.#messages = messages;
    this.#reported = reported || 0;
    this.#reportedLength = reportedLength || 0;
    this.#onOverflow = onOverflow;
  }

  /** How many messages it holds. */
  get length() {
    return this.#messages.length;
  }

  /** The messages followed by `turn` (a new array: what a request sends). */
  with(turn) {
    return this.#messages.concat(turn);
  }

  /** A deep copy for another session: `{messages, reported, reportedLength}`. */
  copy() {
    return { messages: structuredClone(this.#messages), reported: this.#reported, reportedLength: this.#reportedLength };
  }

  /** Tokens the history takes: the connection's last report, plus estimates for messages added since. */
  get usage() {
    let chars = 0;
    for (let i = this.#reportedLength; i < this.#messages.length; i += 1) chars += messageChars(this.#messages[i]);
    return this.#reported + estimateTokens(chars);
  }

  /** The connection counted `tokens` for the whole history as it is now. */
  report(tokens) {
    this.#reported = tokens;
    this.#reportedLength = this.#messages.length;
  }

  /**
   * Evict the oldest non-system messages (and any toolResult left without
   * its call) until `extra` more messages fit the bounds; calls
   * `onOverflow` once when anything was evicted.
   *
   * @param {object[]} extra NAP-LLM messages about to be added.
   * @throws {DOMException} `QuotaExceededError` when `extra` alone does not fit.
   */
  makeRoom(extra) {
    const history = this.#messages;
    const chars = extra.reduce((n, m) => n + messageChars(m), 0);
    const start = history.length > 0 && history[0].role === "system" ? 1 : 0;
    if (extra.length + start > MAX_HISTORY_MESSAGES || chars > MAX_HISTORY_CHARS) {
      throw new DOMException("The input is larger than a session holds.", "QuotaExceededError");
    }
    let total = history.reduce((n, m) => n + messageChars(m), 0) + chars;
    let evicted = false;
    while (history.length > start && (history.length + extra.length > MAX_HISTORY_MESSAGES
      || total > MAX_HISTORY_CHARS || (evicted && history[start].role === "toolResult"))) {
      const [gone] = history.splice(start, 1);
      total -= messageChars(gone);
      evicted = true;
    }
    if (evicted) {
      // The connection's figure covered messages that are gone now.
      this.#reported = 0;
      this.#reportedLength = start;
      this.#onOverflow();
    }
  }

  /** Add messages, making room first (`makeRoom`). */
  commit(messages) {
    this.makeRoom(messages);
    this.#messages.push(...messages);
  }
}

/**
 * Whether `messages` fit an empty session (`initialPrompts`).
 *
 * @param {object[]} messages NAP-LLM messages.
 * @returns {boolean}
 */
export function fitsEmpty(messages) {
  return messages.length <= MAX_HISTORY_MESSAGES && messages.reduce((n, m) => n + messageChars(m), 0) <= MAX_HISTORY_CHARS;
}
