// esbuild entry for dist/vendor/wllama/wllama.js (see build.py).
// Re-exports @wllama/wllama and adds `wasmPaths`, the path config for
// `new Wllama(wasmPaths)` that points at the wllama.wasm copied next to the
// bundle, so no page needs to spell that URL (and nothing falls back to a CDN).
export * from '@wllama/wllama';

export const wasmPaths = Object.freeze({
  default: new URL('./wllama.wasm', import.meta.url).href,
});
