/**
 * WebGPU as the engines that run on the GPU see it (webllm-engine.js,
 * engine-host.js's `webgpu` report): one adapter request with a time limit.
 *
 * Rules
 * - Some drivers never answer `requestAdapter`: after `ADAPTER_TIMEOUT_MS`
 *   WebGPU counts as unavailable, so the shell starts anyway.
 * - The answer is `{adapter, reason}`: the adapter, or `null` with a reason
 *   code the Python side turns into a sentence (`no-webgpu`, `no-adapter`,
 *   `timeout`; providers/engine.py, NO_ADAPTER_REASONS).
 * - A software adapter (Chromium's SwiftShader) is an adapter; `isFallback`
 *   tells it apart.
 */

/** How long GPU detection may take before WebGPU counts as unavailable. */
export const ADAPTER_TIMEOUT_MS = 3000;

/** Request an adapter (`options` as for `navigator.gpu.requestAdapter`); never rejects. */
export async function requestAdapter(options = undefined) {
  if (!navigator.gpu) return { adapter: null, reason: "no-webgpu" };
  let timedOut = false;
  let adapter = null;
  try {
    const timeout = new Promise((resolve) =>
      setTimeout(() => {
        timedOut = true;
        resolve(null);
      }, ADAPTER_TIMEOUT_MS),
    );
    adapter = await Promise.race([navigator.gpu.requestAdapter(options), timeout]);
  } catch {
    adapter = null;
  }
  if (!adapter) return { adapter: null, reason: timedOut ? "timeout" : "no-adapter" };
  return { adapter, reason: null };
}

/** Whether `adapter` is a software fallback adapter. */
export function isFallback(adapter) {
  const info = adapter.info || {};
  return info.isFallbackAdapter === true || adapter.isFallbackAdapter === true;
}

/** The adapter's vendor ("" when the browser does not say). */
export function vendorOf(adapter) {
  const info = adapter.info || {};
  return typeof info.vendor === "string" ? info.vendor : "";
}
