// esbuild entry for dist/vendor/transformers/transformers.js (see build.py).
// Re-exports what the WebGPU engine's worker uses from @huggingface/transformers
// (ModelRegistry: the files a model needs, for Download for offline use),
// and `wasmPaths`: onnxruntime-web's wasm copied next to the bundle, so no page
// needs to spell that URL (the library's own default is a CDN).
export {
  AutoModelForCausalLM,
  AutoTokenizer,
  InterruptableStoppingCriteria,
  ModelRegistry,
  StoppingCriteriaList,
  TextStreamer,
  env,
} from '@huggingface/transformers';

export const wasmPaths = Object.freeze({
  mjs: new URL('./ort-wasm-simd-threaded.asyncify.mjs', import.meta.url).href,
  wasm: new URL('./ort-wasm-simd-threaded.asyncify.wasm', import.meta.url).href,
});
