/**
 * The WebLLM worker: runs @mlc-ai/web-llm's MLCEngine off the page's main
 * thread (WebLLM's documented Web Worker set-up: a `WebWorkerMLCEngineHandler`
 * answering the page's `CreateWebWorkerMLCEngine`). Loaded as a module
 * worker by webllm-engine.js; holds no napllm policy.
 *
 * Rules (README, "Design note: generation off the main thread")
 * - WebLLM's own protocol (load, interrupt, unload, ...) is answered by the
 *   handler unchanged. WebLLM's page-side stream pulls one chunk per round
 *   trip, so the engine would wait for the page between tokens; chats
 *   therefore run here instead, whole, on a port of their own:
 * - `{kind: "napllmPort"}` with one transferred MessagePort (sent once by
 *   the page) opens that port. On it the page sends `{op: "chat", id, body}`
 *   (an OpenAI chat body, streamed). Each chat runs to its end in this
 *   worker on the handler's engine, and its chunks come back as
 *   `{op: "chunks", id, chunks: [JSON text, ...]}` in batches (batcher.js),
 *   then `{op: "end", id, chunks: [...], error: null | {name, message}}`.
 *   The page classifies the error (it never reaches a napplet). This is the
 *   chat part of the protocol every engine worker speaks (worker-bridge.js);
 *   a `{op: "cancel"}` is ignored here, since WebLLM's own
 *   `interruptGenerate` stops the chat.
 * - A chat interrupted through WebLLM's `interruptGenerate` ends early and
 *   is still read to its end here, so the engine's lock is released
 *   (mlc-ai/web-llm #447; docs/design.md, "Known behaviours").
 * - Parameter shards are downloaded through download.js: a cut download
 *   continues from the checked bytes already stored (its rules).
 * - Every file WebLLM downloads is bounded by `MAX_WEBLLM_FILE_BYTES`
 *   (limits.js) and, uncompressed, by its declared length (bounded.js).
 *   WebLLM has no fetch option: it calls `fetch` and stores model files
 *   with `Cache.add`, which fetches past `self.fetch`; so both are replaced
 *   in this worker (it runs nothing but WebLLM) by bounded versions. A
 *   refused file fails the load with `DownloadTooLarge` in its text, which
 *   the page reports as a `download` failure and evicts.
 */

import { WebWorkerMLCEngineHandler } from "../vendor/web-llm/web-llm.js";
import { runChat } from "./batcher.js";
import { limitedFetch } from "./bounded.js";
import { resumableFetch } from "./download.js";
import { MAX_WEBLLM_FILE_BYTES } from "./limits.js";

/** A parameter shard: downloaded resumably (download.js). */
const SHARD = /\/params_shard_\d+\.bin$/i;
const resumable = resumableFetch(
  self.fetch.bind(self),
  (url) => SHARD.test(new URL(String(url), self.location.href).pathname),
  () => MAX_WEBLLM_FILE_BYTES,
);
const boundedFetch = limitedFetch(resumable, () => MAX_WEBLLM_FILE_BYTES);
self.fetch = boundedFetch;
if (typeof Cache !== "undefined") {
  /** `Cache.add` (fetch, refuse a failed status, store) through the bounded fetch. */
  Cache.prototype.add = async function add(request) {
    const response = await boundedFetch(request);
    if (!response.ok) throw new TypeError(`fetch failed with status ${response.status}`);
    await this.put(request, response);
  };
}

class Handler extends WebWorkerMLCEngineHandler {
  onmessage(event, ...rest) {
    const data = event && event.data !== undefined ? event.data : event;
    if (data && typeof data === "object" && data.kind === "napllmPort" && event.ports && event.ports[0]) {
      const port = event.ports[0];
      port.onmessage = ({ data: message }) => {
        if (message && typeof message === "object" && message.op === "chat") {
          this.chat(port, String(message.id), message.body || {});
        }
      };
      return;
    }
    super.onmessage(event, ...rest);
  }

  async chat(port, id, body) {
    const never = new AbortController().signal;
    let rest = [];
    let error = null;
    try {
      const chunks = await this.engine.chatCompletion({ ...body, stream: true });
      rest = await runChat(chunks, (message) => port.postMessage({ ...message, id }), never);
    } catch (failure) {
      console.error("napllm webllm worker: generation failed", failure);
      const name = String((failure && (failure.name || failure.constructor?.name)) || "");
      const message = typeof failure === "string" ? failure : String((failure && failure.message) || "");
      error = { name, message };
    }
    port.postMessage({ op: "end", id, chunks: rest, error });
  }
}

const handler = new Handler();
self.onmessage = (message) => handler.onmessage(message);
