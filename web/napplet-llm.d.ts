/**
 * Types of `window.napplet.llm`, the NAP-LLM domain the napllm shell defines
 * in every napplet frame granted LLM access (NAP-LLM, API Surface).
 *
 * Use it in an editor or with `tsc --checkJs`:
 *
 *     /// <reference path="napplet-llm.d.ts" />
 *     const llm = window.napplet.llm;            // undefined when not granted
 *
 * Every record below is the NAP-LLM record of the same name; field notes
 * give the spec's rules. Input records are checked strictly by the shell:
 * unknown fields, explicit `null`, wrong types and bad encodings are
 * `invalid-request` (NAP-LLM, Schemas).
 */

export {};

declare global {
  /** What a napplet may require of the chosen connection (NAP-LLM, Requirements). */
  interface LlmRequirements {
    /** Exact provider model identifier; omit to let the user choose. Non-empty. */
    model?: string;
    /** `true` requires image input. */
    images?: boolean;
    /** `true` requires JSON-object output (`format: "json"`). */
    json?: boolean;
    /** `true` requires tool calling. */
    tools?: boolean;
  }

  /** A tool-choice mode a connection supports (NAP-LLM, Model: `toolChoiceModes`). */
  type LlmToolChoiceMode = "auto" | "none" | "required" | "tool";

  /** The chosen connection as the napplet sees it (NAP-LLM, Model). */
  interface LlmModel {
    /** Opaque reference scoped to this endpoint and the user's account; not a credential. */
    handle: string;
    /** User-facing connection label. */
    name: string;
    /** Selected model identifier. */
    model: string;
    /** Human-readable disclosure route, intermediaries and destination included. */
    route: string;
    /** Whether the connection accepts image input. */
    images: boolean;
    /** Whether it supports JSON-object output. */
    json: boolean;
    /** Whether it supports tool calling. */
    tools: boolean;
    /** Exactly the supported modes; empty when `tools` is false. */
    toolChoiceModes: LlmToolChoiceMode[];
  }

  /** A text part (NAP-LLM, Part). */
  interface LlmTextPart {
    type: "text";
    text: string;
  }

  /** An image part: standard padded base64, no data-URI prefix (NAP-LLM, Part). */
  interface LlmImagePart {
    type: "image";
    mimeType: "image/png" | "image/jpeg" | "image/webp";
    /** Standard padded base64 bytes, no whitespace. Non-empty. */
    data: string;
  }

  /** Display-only reasoning text; omitted from provider input on replay (NAP-LLM, Part). */
  interface LlmThinkingPart {
    type: "thinking";
    text: string;
  }

  /** A tool call the model asked for; the napplet, not the shell, executes it (NAP-LLM, Part). */
  interface LlmToolCallPart {
    type: "toolCall";
    /** Stable id matching the later `toolResult` message. */
    toolCallId: string;
    /** Tool name; one of the request's `tools`. */
    name: string;
    /** Arguments as a JSON object. */
    arguments: { [key: string]: unknown };
  }

  /** Any part of a message (NAP-LLM, Part). */
  type LlmPart = LlmTextPart | LlmImagePart | LlmThinkingPart | LlmToolCallPart;

  /** A system, user or assistant message (NAP-LLM, Message). */
  interface LlmChatMessage {
    role: "system" | "user" | "assistant";
    /** Non-empty; `toolCall` and `thinking` parts only in assistant messages. */
    content: LlmPart[];
  }

  /**
   * A tool's result; it must immediately follow the assistant turn holding
   * the call it answers, one per call (NAP-LLM, Message).
   */
  interface LlmToolResultMessage {
    role: "toolResult";
    /** `text` and `image` parts only. */
    content: (LlmTextPart | LlmImagePart)[];
    /** The `toolCallId` of the call answered. */
    toolCallId: string;
    /** The name of the tool that produced the result. */
    toolName: string;
    /** Whether the tool failed; defaults to false. */
    isError?: boolean;
  }

  /** One message of the conversation (NAP-LLM, Message). */
  type LlmMessage = LlmChatMessage | LlmToolResultMessage;

  /** A tool the model may call (NAP-LLM, Tool). */
  interface LlmTool {
    /** Matches `^[A-Za-z0-9_-]{1,64}$`; unique within `tools`. */
    name: string;
    description?: string;
    /** JSON Schema 2020-12 with root `type: "object"`. */
    parameters?: { [key: string]: unknown };
  }

  /** Forces one named tool (NAP-LLM, ToolChoice). */
  interface LlmNamedToolChoice {
    type: "tool";
    name: string;
  }

  /** One stateless generation request (NAP-LLM, GenerationRequest). */
  interface LlmGenerationRequest {
    /** A live handle from `select`. */
    handle: string;
    /** The entire conversation; non-empty. */
    messages: LlmMessage[];
    /** Defaults to `text`; `json` requires a JSON object as the answer. */
    format?: "text" | "json";
    /** Positive output token limit. */
    maxTokens?: number;
    /** Sampling temperature; unsupported values are `unsupported`. */
    temperature?: number;
    tools?: LlmTool[];
    /** Defaults to `auto` when tools are present; needs a non-empty `tools`. */
    toolChoice?: "auto" | "none" | "required" | LlmNamedToolChoice;
  }

  /** Provider-reported token counts; not a price (NAP-LLM, Usage). */
  interface LlmUsage {
    inputTokens: number;
    outputTokens: number;
    cacheReadTokens?: number;
    cacheWriteTokens?: number;
    reasoningTokens?: number;
  }

  /** How a generation ended (NAP-LLM, Generation). Only `stop` is completed output. */
  type LlmFinish = "stop" | "length" | "refusal" | "toolUse";

  /** The terminal result of a generation (NAP-LLM, Generation). */
  interface LlmGeneration {
    /** Accumulated output: text, thinking and toolCall parts. */
    content: (LlmTextPart | LlmThinkingPart | LlmToolCallPart)[];
    /** `toolUse` always carries at least one call; execute calls only from this result. */
    finish: LlmFinish;
    usage?: LlmUsage;
  }

  /** One streamed block event (NAP-LLM, Delta). Provisional: never execute from it. */
  interface LlmDelta {
    type: "llm.delta";
    /** The generation's id. */
    requestId: string;
    /** Contiguous, from zero, per generation. */
    sequence: number;
    /** Each block: one `start`, zero or more `delta`, one `end`. */
    event: "start" | "delta" | "end";
    block: "text" | "thinking" | "toolCall";
    /** Index of the block within the generation's content. */
    blockIndex: number;
    /** `delta` only: a text fragment, or a JSON argument fragment for `toolCall`. */
    text?: string;
    /** `toolCall` start only. */
    toolCallId?: string;
    /** `toolCall` start only. */
    name?: string;
  }

  /** Stable failure categories (NAP-LLM, Error Handling). */
  type LlmErrorCode =
    | "unsupported"
    | "invalid-request"
    | "selection-expired"
    | "user-cancelled"
    | "cancelled"
    | "timeout"
    | "quota-exceeded"
    | "provider-error";

  /**
   * A failed operation. `code` is the Error record's code, or
   * `invalid-response` when the shell's answer itself was malformed;
   * treat unknown codes as failures (NAP-LLM, Error Handling).
   */
  interface LlmError extends Error {
    readonly name: "LlmError";
    readonly code: LlmErrorCode | "invalid-response" | (string & {});
  }

  interface LlmErrorConstructor {
    new (code: string, message?: string): LlmError;
    readonly prototype: LlmError;
  }

  /** Options of `generate`. */
  interface LlmGenerateOptions {
    /** Called for every Delta, in order, before the terminal result. */
    onDelta?: (delta: LlmDelta) => void;
  }

  /**
   * What `generate` returns: a thenable of the terminal result, with the
   * deltas as an async iterable (buffered from the start; it ends after the
   * terminal result and throws its error) and `cancel()`.
   */
  interface LlmGenerationHandle extends PromiseLike<LlmGeneration> {
    /** The request id (also the Deltas' `requestId`). */
    readonly id: string;
    /** The terminal result; rejects with `LlmError`. */
    readonly result: Promise<LlmGeneration>;
    readonly deltas: AsyncIterable<LlmDelta>;
    /** NAP-LLM `cancel` of this generation: true when it was still active. */
    cancel(): Promise<boolean>;
    catch<T = never>(onRejected?: ((reason: LlmError) => T | PromiseLike<T>) | null): Promise<LlmGeneration | T>;
    finally(onFinally?: (() => void) | null): Promise<LlmGeneration>;
  }

  /** `window.napplet.llm` (NAP-LLM, API Surface; web binding). */
  interface NappletLlm {
    /** Ask the user to choose a connection meeting `requirements`. */
    select(requirements?: LlmRequirements): Promise<LlmModel>;
    /** Revalidate a handle without a dialog. */
    describe(handle: string): Promise<LlmModel>;
    /** One stateless request; consent is asked before it reaches any provider. */
    generate(request: LlmGenerationRequest, options?: LlmGenerateOptions): LlmGenerationHandle;
    /** Cancel this frame's active generation `requestId`; false when none. */
    cancel(requestId: string): Promise<boolean>;
    /** The error class of every rejection. */
    readonly LlmError: LlmErrorConstructor;
  }

  /** The napplet namespace; `llm` is present only when LLM access is granted. */
  interface Napplet {
    readonly llm?: NappletLlm;
  }

  interface Window {
    readonly napplet: Napplet;
  }

  var napplet: Napplet;
}
