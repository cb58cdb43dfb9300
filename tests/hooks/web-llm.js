/**
 * Test build only: stands in for dist/vendor/web-llm/web-llm.js in
 * dist-test/. Re-exports the real bundle (copied as web-llm.product.js) and
 * overrides `CreateWebWorkerMLCEngine`: while a test has set a factory with
 * `setEngineFactoryForTests(factory)`, engines come from
 * `factory(modelId, {initProgressCallback})` (a double implementing
 * WebLLM's documented `chat.completions.create` / `interruptGenerate`) and
 * the worker the shell made is terminated unused.
 */

import * as real from "./web-llm.product.js";

export * from "./web-llm.product.js";

let factory = null;

/** `factory(modelId, {initProgressCallback}) -> Promise<engine>`, or null for the real one. */
export function setEngineFactoryForTests(value) {
  factory = typeof value === "function" ? value : null;
}

export async function CreateWebWorkerMLCEngine(worker, modelId, options = {}) {
  if (!factory) return real.CreateWebWorkerMLCEngine(worker, modelId, options);
  worker.terminate();
  return factory(modelId, { initProgressCallback: options.initProgressCallback ?? (() => {}) });
}
