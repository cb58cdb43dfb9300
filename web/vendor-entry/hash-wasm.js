// esbuild entry for dist/vendor/hash-wasm/hash-wasm.js (see build.py).
// The streaming SHA-256 the model catalogue checks downloads with
// (web/catalogue/add.js): a model file of gigabytes is hashed part by part,
// which the browser's own crypto.subtle.digest (one buffer) cannot do.
export { createSHA256 } from 'hash-wasm';
