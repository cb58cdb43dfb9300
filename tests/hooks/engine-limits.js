/**
 * The test build's byte ceilings of model downloads (replaces
 * engines/limits.js in dist-test/; the product's numbers and their reasons
 * are in web/engines/limits.js). Small, so a test host that streams
 * without end or past its declared length is refused after a few MiB;
 * still above every model the tests load (TinyChat: 1.2 MB as GGUF, 4.5 MB
 * as ONNX). The time bounds are short, so a test host that stalls is
 * given up on within seconds.
 */

const MiB = 1024 * 1024;

export const MAX_GGUF_MODEL_BYTES = 8 * MiB;
export const MAX_ONNX_WEIGHTS_BYTES = 16 * MiB;
export const MAX_ONNX_OTHER_BYTES = 1 * MiB;
export const MAX_WEBLLM_FILE_BYTES = 16 * MiB;

export const HEADERS_TIMEOUT_MS = 1_500;
export const IDLE_TIMEOUT_MS = 1_500;
export const WORKER_IDLE_MS = 30_000;
export const RETRY_BASE_MS = 50;
export const MAX_RETRY_AFTER_MS = 2_000;
export const MIN_RATE_WINDOW_MS = 3_000;
export const MIN_RATE_BYTES = 64 * 1024;
