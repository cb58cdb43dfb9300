/**
 * Types of the Prompt API layer the napllm shell places in a napplet frame
 * whose page has `<meta name="napplet-prompt-api">`: `LanguageModel` (the
 * web's Prompt API) over `window.napplet.llm` (web/prompt-api/;
 * docs/napplets.md, "The Prompt API").
 *
 * Use it beside napplet-llm.d.ts in an editor or with `tsc --checkJs`:
 *
 *     /// <reference path="prompt-api.d.ts" />
 *     const session = await LanguageModel.create();
 *
 * Only what the layer offers is declared: open-loop tool use, audio,
 * assistant prefixes and RegExp constraints are refused at run time with
 * `NotSupportedError`, so they are left out here.
 */

export {};

declare global {
  /** What `availability()` resolves with; the layer answers "available" or "unavailable". */
  type LanguageModelAvailability = "unavailable" | "downloadable" | "downloading" | "available";

  type LanguageModelMessageRole = "system" | "user" | "assistant";

  /** An image value: PNG/JPEG/WebP bytes or Blob, or anything `createImageBitmap` takes. */
  type LanguageModelImageValue = ImageBitmapSource | BufferSource;

  /** One content item of a message. */
  type LanguageModelMessageContent =
    | { type: "text"; value: string }
    | { type: "image"; value: LanguageModelImageValue };

  /** One message: `content` is a string or content items. */
  interface LanguageModelMessage {
    role: LanguageModelMessageRole;
    content: string | LanguageModelMessageContent[];
  }

  /** A prompt: a user text, or messages (a system message only first in a session). */
  type LanguageModelPrompt = string | LanguageModelMessage[];

  /** An expected input or output modality. */
  interface LanguageModelExpected {
    type: "text" | "image" | "tool-call" | "tool-response";
    languages?: string[];
  }

  /** A tool the model may call; the layer runs `execute` in the napplet (closed loop). */
  interface LanguageModelTool {
    /** `^[A-Za-z0-9_-]{1,64}$`, unique per session. */
    name: string;
    description?: string;
    /** JSON Schema with `type: "object"` (at most 64 KiB of JSON). */
    inputSchema?: { [key: string]: unknown };
    /** Runs with the model's arguments (checked against `inputSchema`); its string goes back to the model. */
    execute(args: any): string | Promise<string>;
  }

  /** What `monitor` receives: `downloadprogress` events with `loaded` 0, then 1. */
  interface LanguageModelCreateMonitor extends EventTarget {
    ondownloadprogress: ((this: LanguageModelCreateMonitor, event: Event & { loaded: number; total: number }) => any) | null;
  }

  type LanguageModelSamplingMode =
    | "most-predictable"
    | "predictable"
    | "slightly-predictable"
    | "balanced"
    | "slightly-creative"
    | "creative"
    | "most-creative";

  interface LanguageModelCreateCoreOptions {
    expectedInputs?: LanguageModelExpected[];
    expectedOutputs?: LanguageModelExpected[];
    tools?: LanguageModelTool[];
  }

  interface LanguageModelCreateOptions extends LanguageModelCreateCoreOptions {
    /** Destroys the session when aborted (rejects `create()` before it resolves). */
    signal?: AbortSignal;
    monitor?: (monitor: LanguageModelCreateMonitor) => void;
    initialPrompts?: LanguageModelMessage[];
    samplingMode?: LanguageModelSamplingMode;
    /** Legacy sampling option; sent as NAP-LLM `temperature`. */
    temperature?: number;
  }

  interface LanguageModelPromptOptions {
    /** A JSON Schema (root type "object" or none); a RegExp is `NotSupportedError`. */
    responseConstraint?: { [key: string]: unknown };
    omitResponseConstraintInput?: boolean;
    signal?: AbortSignal;
  }

  interface LanguageModelAppendOptions {
    signal?: AbortSignal;
  }

  interface LanguageModelCloneOptions {
    signal?: AbortSignal;
  }

  /** A session (Prompt API `LanguageModel`) backed by the connection the user chose. */
  interface LanguageModel extends EventTarget {
    prompt(input: LanguageModelPrompt, options?: LanguageModelPromptOptions): Promise<string>;
    promptStreaming(input: LanguageModelPrompt, options?: LanguageModelPromptOptions): ReadableStream<string> & AsyncIterable<string>;
    append(input: LanguageModelPrompt, options?: LanguageModelAppendOptions): Promise<void>;
    measureContextUsage(input: LanguageModelPrompt, options?: LanguageModelPromptOptions): Promise<number>;
    /** Tokens the history takes: the connection's last report plus estimates (4 characters a token). */
    readonly contextUsage: number;
    /** The context size in tokens: `Infinity` (NAP-LLM does not report it). */
    readonly contextWindow: number;
    oncontextoverflow: ((this: LanguageModel, event: Event) => any) | null;
    readonly samplingMode: LanguageModelSamplingMode | null;
    clone(options?: LanguageModelCloneOptions): Promise<LanguageModel>;
    destroy(reason?: unknown): void;
  }

  interface LanguageModelConstructor {
    /** Never opens a chooser: "available" when `window.napplet.llm` is present. */
    availability(options?: LanguageModelCreateCoreOptions): Promise<LanguageModelAvailability>;
    /** Opens the chooser; resolves with a session on the chosen connection. */
    create(options?: LanguageModelCreateOptions): Promise<LanguageModel>;
    /** Always null: NAP-LLM reports no sampling limits. */
    params(): Promise<null>;
    readonly prototype: LanguageModel;
    /** The browser's own `LanguageModel`, when one existed before the layer. */
    readonly native?: unknown;
  }

  var LanguageModel: LanguageModelConstructor;
  /** The layer under a name no browser uses (always defined when the napplet opts in). */
  var NappletLanguageModel: LanguageModelConstructor;
}
