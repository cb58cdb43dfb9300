/**
 * The WebLLM worker: runs @mlc-ai/web-llm's MLCEngine off the page's main
 * thread (WebLLM's documented Web Worker set-up: a `WebWorkerMLCEngineHandler`
 * answering the page's `CreateWebWorkerMLCEngine`). Loaded as a module
 * worker by webllm-engine.js; holds no napllm logic.
 */

import { WebWorkerMLCEngineHandler } from "../vendor/web-llm/web-llm.js";

const handler = new WebWorkerMLCEngineHandler();
self.onmessage = (message) => handler.onmessage(message);
