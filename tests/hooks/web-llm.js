/**
 * Test build only: stands in for dist/vendor/web-llm/web-llm.js in
 * dist-test/. Re-exports the real bundle (copied as web-llm.product.js) and
 * overrides `CreateWebWorkerMLCEngine`: while a test has set a factory
 * (testhooks/webllm-factory.js), engines come from
 * `factory(modelId, {initProgressCallback})` (a double implementing
 * WebLLM's documented `chat.completions.create` / `interruptGenerate`) and
 * the worker the shell made is terminated unused.
 */

import { engineFactory } from "../../testhooks/webllm-factory.js";
import * as real from "./web-llm.product.js";

export * from "./web-llm.product.js";

export async function CreateWebWorkerMLCEngine(worker, modelId, options = {}) {
  const factory = engineFactory();
  if (!factory) return real.CreateWebWorkerMLCEngine(worker, modelId, options);
  worker.terminate();
  return factory(modelId, { initProgressCallback: options.initProgressCallback ?? (() => {}) });
}
