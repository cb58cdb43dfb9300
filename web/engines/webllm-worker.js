/**
 * The WebLLM worker: runs @mlc-ai/web-llm's MLCEngine off the page's main
 * thread (WebLLM's documented Web Worker set-up: a `WebWorkerMLCEngineHandler`
 * answering the page's `CreateWebWorkerMLCEngine`). Loaded as a module
 * worker by webllm-engine.js (WebLLM's adapter of the engine host); holds
 * no napllm policy.
 *
 * Rules (README, "Design note: generation off the main thread")
 * - WebLLM's own protocol (load, interrupt, unload, ...) is answered by the
 *   handler unchanged. WebLLM's page-side stream pulls one chunk per round
 *   trip, so the engine would wait for the page between tokens; chats
 *   therefore run here instead, whole, on a port of their own:
 * - `{kind: "napllmPort"}` with one transferred MessagePort (sent once by
 *   the page) opens that port, which speaks the chat part of the protocol
 *   every engine worker speaks (worker-bridge.js) as chat-queue.js serves
 *   it: chats run one at a time, whole, in this worker on the handler's
 *   engine, their chunks posted in batches (batcher.js); a cancel of the
 *   chat generating calls WebLLM's `interruptGenerate`, and the chat is
 *   still read to its end here, so the engine's lock is released
 *   (mlc-ai/web-llm #447; docs/design.md, "Known behaviours"). The page
 *   names an error's kind (it never reaches a napplet).
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
import { serveChats } from "./chat-queue.js";
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

const never = new AbortController().signal;

class Handler extends WebWorkerMLCEngineHandler {
  onmessage(event, ...rest) {
    const data = event && event.data !== undefined ? event.data : event;
    if (data && typeof data === "object" && data.kind === "napllmPort" && event.ports && event.ports[0]) {
      serveChats(event.ports[0], {
        run: async (body, post, merge) => runChat(await this.engine.chatCompletion({ ...body, stream: true }), post, never, merge),
        interrupt: () => this.engine.interruptGenerate(),
      });
      return;
    }
    super.onmessage(event, ...rest);
  }
}

const handler = new Handler();
self.onmessage = (message) => handler.onmessage(message);
