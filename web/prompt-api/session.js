/**
 * `LanguageModel`, the Prompt API's session, over `window.napplet.llm`
 * (NAP-LLM, API Surface `select` and `generate`), and its installation in
 * a napplet's window.
 *
 * Rules
 * - Everything here runs in the napplet's own realm and only calls the
 *   prelude's `window.napplet.llm`, which is where consent and validation
 *   happen (NAP-LLM, Shell Behavior); the class is made per window and
 *   frozen, and only `create()` and `clone()` construct sessions.
 * - `create()` opens the chooser (`select`) once; `clone()` keeps the same
 *   connection. `availability()` never opens a chooser.
 * - Each prompt, and each round of its tool loop, is one `generate` and so
 *   one consent decision; a tool loop runs at most `MAX_TOOL_ROUNDS`
 *   generations. A turn is committed to the history (history.js) only
 *   when its prompt succeeds, its constrained answer included
 *   (schema.js); operations run one after another (queue.js).
 * - After `destroy()` every call is `InvalidStateError`; what ran is
 *   cancelled and what waited rejects with the destroy reason.
 */

import { abortReason, abortedError, checkSignal, toDomException } from "./errors.js";
import { CreateMonitor, DownloadProgressEvent, replaceHandler } from "./events.js";
import { History, fitsEmpty } from "./history.js";
import { MAX_TOOL_ROUNDS, estimateTokens } from "./limits.js";
import { messageChars, messagesOf } from "./messages.js";
import { requirementsOf, samplingOf } from "./options.js";
import { OperationQueue } from "./queue.js";
import { addInstruction, checkAnswer, constraintInstruction, constraintOf } from "./schema.js";
import { textDeltas, textStream } from "./streaming.js";
import { runTools, toolsOf } from "./tools.js";

/** `promise`, or the signal's reason as soon as `signal` aborts. */
function untilAborted(promise, signal) {
  if (!signal) return promise;
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(abortReason(signal));
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}

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
    #ops = new OperationQueue();
    #overflowHandler = null;
    #samplingMode;

    constructor(token, state) {
      if (token !== INTERNAL) throw new TypeError("Illegal constructor: use LanguageModel.create().");
      super();
      this.#model = state.model;
      this.#tools = state.tools;
      this.#temperature = state.temperature;
      this.#samplingMode = state.samplingMode;
      this.#history = new History(state.history, {
        reported: state.reported,
        reportedLength: state.reportedLength,
        onOverflow: () => this.dispatchEvent(new Event("contextoverflow")),
      });
    }

    /**
     * "available" when this napplet has model access (`window.napplet.llm`), else
     * "unavailable"; never opens a chooser. Audio input and non-text output
     * are "unavailable" (NAP-LLM has neither).
     */
    static async availability(options) {
      if (!llm) return "unavailable";
      try {
        requirementsOf(options === undefined || options === null ? {} : options);
      } catch {
        return "unavailable";
      }
      return "available";
    }

    /** The Prompt API's legacy `params()`: null (no sampling limits are reported by NAP-LLM). */
    static async params() {
      return null;
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
      const requirements = requirementsOf(options);
      const tools = toolsOf(options.tools);
      const { temperature, samplingMode } = samplingOf(options);
      const history = options.initialPrompts === undefined ? [] : await messagesOf(options.initialPrompts, true);
      if (!fitsEmpty(history)) {
        throw new DOMException("initialPrompts are larger than a session holds.", "QuotaExceededError");
      }
      const monitor = new CreateMonitor();
      if (options.monitor !== undefined) {
        if (typeof options.monitor !== "function") throw new TypeError("monitor must be a function.");
        options.monitor(monitor);
      }
      monitor.dispatchEvent(new DownloadProgressEvent("downloadprogress", { loaded: 0 }));
      let model;
      try {
        model = await untilAborted(llm.select(requirements), signal);
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
      return this.#history.usage;
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
      this.#overflowHandler = replaceHandler(this, "contextoverflow", this.#overflowHandler, fn);
    }

    /** The same history in a new session (no chooser: the same connection). */
    async clone(options = {}) {
      const signal = checkSignal(options && options.signal);
      if (signal && signal.aborted) throw abortReason(signal);
      this.#checkAlive();
      // Waits for the queued operations, so the copy holds their turns.
      await this.#ops.run(async () => {}, signal);
      const { messages, reported, reportedLength } = this.#history.copy();
      const copy = new LanguageModel(INTERNAL, {
        model: this.#model,
        tools: this.#tools,
        temperature: this.#temperature,
        samplingMode: this.#samplingMode,
        history: messages,
        reported,
        reportedLength,
      });
      if (signal) signal.addEventListener("abort", () => copy.destroy(abortReason(signal)), { once: true });
      return copy;
    }

    /** Cancel what runs (NAP-LLM `cancel`), reject what waits; later calls are `InvalidStateError`. */
    destroy(reason) {
      if (this.#ops.destroyed) return;
      this.#ops.destroy(reason !== undefined ? reason : new DOMException("The session was destroyed.", "AbortError"));
    }

    #checkAlive() {
      if (this.#ops.destroyed) throw new DOMException("The session was destroyed.", "InvalidStateError");
    }

    /** Add to the history without generating. */
    async append(input, options = {}) {
      const signal = checkSignal(options && options.signal);
      if (signal && signal.aborted) throw abortReason(signal);
      this.#checkAlive();
      const messages = await messagesOf(input, this.#history.length === 0);
      this.#checkImages(messages);
      await this.#ops.run(async (op) => {
        this.#checkSystemFirst(messages);
        if (!op.stopped) this.#history.commit(messages);
      }, signal);
    }

    /** Estimated tokens `input` (and its constraint text) would add; no request is made. */
    async measureContextUsage(input, options = {}) {
      this.#checkAlive();
      const messages = await messagesOf(input, true);
      let chars = messages.reduce((n, m) => n + messageChars(m), 0);
      const constraint = constraintOf(options || {});
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

    /** A system message in `messages` is refused once the history holds any (checked when the operation runs). */
    #checkSystemFirst(messages) {
      if (messages[0].role === "system" && this.#history.length > 0) {
        throw new TypeError("A system message may only be the first message of a session.");
      }
    }

    /** The answer to `input` as one string (`responseConstraint`: JSON text meeting the schema). */
    async prompt(input, options = {}) {
      return this.#start(input, options || {}, null);
    }

    /** The answer to `input` as a ReadableStream of text chunks (each chunk new text only). */
    promptStreaming(input, options = {}) {
      return textStream(
        (sink) => this.#start(input, options || {}, sink),
        (stream) => this.#ops.cancelRunning((generation) => generation.streamed === stream),
      );
    }

    async #start(input, options, sink) {
      const signal = checkSignal(options.signal);
      if (signal && signal.aborted) throw abortReason(signal);
      this.#checkAlive();
      const constraint = constraintOf(options);
      if (constraint && !this.#model.json) {
        throw new DOMException("The chosen connection does not offer JSON output.", "NotSupportedError");
      }
      const messages = await messagesOf(input, this.#history.length === 0);
      this.#checkImages(messages);
      if (constraint && !options.omitResponseConstraintInput) addInstruction(messages, constraintInstruction(constraint));
      return this.#ops.run((op) => this.#converse(messages, constraint, sink, op), signal);
    }

    /** One prompt: generations (a tool loop when tools run) until a final answer. */
    async #converse(messages, constraint, sink, op) {
      this.#checkSystemFirst(messages);
      const turn = messages.slice();
      let answer = "";
      let usage = null;
      for (let round = 0; ; round += 1) {
        if (round >= MAX_TOOL_ROUNDS) {
          throw new DOMException(`The model asked for tools in more than ${MAX_TOOL_ROUNDS} rounds.`, "OperationError");
        }
        // The history is bounded with this turn in it: old turns make room.
        this.#history.makeRoom(turn);
        const result = await this.#generate(turn, constraint, sink, op);
        if (result.usage) usage = result.usage.inputTokens + result.usage.outputTokens;
        const text = result.content.filter((p) => p.type === "text").map((p) => p.text).join("");
        const calls = result.content.filter((p) => p.type === "toolCall");
        const kept = result.content.filter((p) => p.type === "text" || p.type === "toolCall");
        turn.push({ role: "assistant", content: kept.length > 0 ? kept : [{ type: "text", text: "" }] });
        if (result.finish === "refusal") throw new DOMException("The model refused to answer.", "OperationError");
        if (result.finish === "toolUse" && calls.length > 0) {
          turn.push(...(await runTools(this.#tools, calls, op)));
          continue;
        }
        answer = text;
        break;
      }
      if (constraint) checkAnswer(answer, constraint);
      if (op.stopped) throw abortedError();
      this.#history.commit(turn);
      if (usage !== null && this.#history.length >= turn.length) {
        // The connection's count covers the request of the last round and its answer.
        this.#history.report(usage);
      }
      return answer;
    }

    /** One NAP-LLM `generate` of the history and `turn`; its result, or its error as a DOMException. */
    async #generate(turn, constraint, sink, op) {
      const request = { handle: this.#model.handle, messages: this.#history.with(turn) };
      if (constraint) request.format = "json";
      if (this.#temperature !== undefined) request.temperature = this.#temperature;
      if (this.#tools.request.length > 0) request.tools = this.#tools.request;
      const handle = llm.generate(request, { onDelta: textDeltas(sink) });
      const untrack = this.#ops.track({ cancel: () => handle.cancel(), streamed: sink ? sink.stream : null });
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
        untrack();
        op.cancels.delete(stop);
      }
      if (op.stopped || this.#ops.destroyed) throw abortedError();
      return result;
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
