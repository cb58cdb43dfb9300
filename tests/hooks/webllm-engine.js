/**
 * Test build only: stands in for dist/engines/webllm-engine.js in
 * dist-test/. The shell's module (copied as webllm-engine.product.js) is
 * re-exported unchanged, plus `setEngineFactoryForTests` from the test
 * build's web-llm stand-in, so a test can inject a WebLLM double through
 * the module the shell itself imports.
 */

export * from "./webllm-engine.product.js";
export { setEngineFactoryForTests } from "../vendor/web-llm/web-llm.js";
