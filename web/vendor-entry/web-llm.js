// esbuild entry for dist/vendor/web-llm/web-llm.js (see build.py).
// Re-exports @mlc-ai/web-llm unchanged.
export * from '@mlc-ai/web-llm';
