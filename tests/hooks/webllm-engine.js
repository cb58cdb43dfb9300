/**
 * Test build only: stands in for dist/engines/webllm-engine.js in
 * dist-test/. The shell's module (copied as webllm-engine.product.js) is
 * re-exported unchanged, plus `setEngineFactoryForTests`
 * (testhooks/webllm-factory.js), so a test injects a WebLLM double through
 * the module the shell itself imports; the bundle still loads only when
 * the shell asks for it.
 */

export * from "./webllm-engine.product.js";
export { setEngineFactoryForTests } from "../testhooks/webllm-factory.js";
