/**
 * Byte ceilings of model downloads, one per kind of file. The check every
 * engine path applies with them is in bounded.js.
 *
 * Rules (docs/security.md, "Stored data": downloads are bounded)
 * - A model host is untrusted: it may answer without a length, with a
 *   false one, or compressed (`Content-Encoding`) so that a few bytes on
 *   the wire decode to any amount. No download may fill the browser's
 *   storage quota or the worker's memory before it fails.
 * - Each kind of file has a ceiling below, generous for real models: the
 *   largest file of that kind an engine in a browser can use. A download
 *   ends with `DownloadTooLarge` as soon as it delivers more bytes than its
 *   ceiling, or (uncompressed) more than its declared length; a declared
 *   length above the ceiling fails before any byte is read.
 * - The engine then reports its usual download failure and evicts the URL
 *   from every cache, as for any bad download.
 * - The service worker (web/sw-napllm.js, a classic script that cannot
 *   import this module) keeps a copy of these numbers; a unit test checks
 *   they are the same. The test build replaces this file (numbers
 *   only, no code) with small ones (tests/hooks/engine-limits.js); the
 *   product has no other way to change them.
 */

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;

/**
 * A GGUF model, all its files together. The wasm engine runs llama.cpp in
 * 32-bit WebAssembly, whose memory cannot exceed 4 GiB: no larger model loads.
 */
export const MAX_GGUF_MODEL_BYTES = 4 * GiB;
/**
 * One ONNX weights file (`.onnx`, `.onnx_data`). The largest ONNX chat
 * models run in browsers keep their weights in files of a few GiB.
 */
export const MAX_ONNX_WEIGHTS_BYTES = 8 * GiB;
/** Any other file of an ONNX model (config, tokenizer, chat template). */
export const MAX_ONNX_OTHER_BYTES = 256 * MiB;
/**
 * One file WebLLM fetches (a parameter shard, the model's library, its
 * config). WebLLM splits weights into shards of tens of MB.
 */
export const MAX_WEBLLM_FILE_BYTES = 1 * GiB;

// ------------------------------------------------------------ time bounds

/*
 * Every wait on the network or on an engine worker ends within a bound
 * (docs/security.md, "Every wait on a model host or a worker is bounded"):
 * a host that sends its headers and a few bytes, then nothing, must not
 * keep a download, its Web Lock or a model load pending for good.
 */

/** The most a request waits for its answer's status and headers. */
export const HEADERS_TIMEOUT_MS = 30_000;
/** The most a body may go without delivering a byte. */
export const IDLE_TIMEOUT_MS = 30_000;
/**
 * The progress floor of a body: each `MIN_RATE_WINDOW_MS` spent waiting on
 * the host must bring at least `MIN_RATE_BYTES` (about 4 KiB/s), else the
 * request is a stall. Without it a host sending one byte just inside
 * `IDLE_TIMEOUT_MS` would hold a download (and its lock) for good.
 */
export const MIN_RATE_WINDOW_MS = 60_000;
export const MIN_RATE_BYTES = 256 * 1024;
/** The most an engine worker's load may go without a message (progress or answer). */
export const WORKER_IDLE_MS = 180_000;
/** The wait before the n-th retry of a download: RETRY_BASE_MS * 2^(n-1). */
export const RETRY_BASE_MS = 300;
/** The longest `Retry-After` a download waits out; a host asking more fails the try at once. */
export const MAX_RETRY_AFTER_MS = 60_000;
