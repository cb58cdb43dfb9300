/**
 * Test build only (dist-test/testhooks/): the WebLLM engine factory a test
 * set, shared by the stand-ins for engines/webllm-engine.js (which exports
 * the setter) and vendor/web-llm/web-llm.js (which uses it). Kept apart
 * from both so that setting a factory never loads the 6 MB bundle.
 */

let factory = null;

/** `value(modelId, {initProgressCallback}) -> Promise<engine>`, or null for the real one. */
export function setEngineFactoryForTests(value) {
  factory = typeof value === "function" ? value : null;
}

/** The factory a test set, or null. */
export function engineFactory() {
  return factory;
}
