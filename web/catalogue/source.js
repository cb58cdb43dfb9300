/**
 * Where the model catalogue comes from and what this device offers: the
 * two facts the catalogue view (view.js) reads from the browser. The test
 * build replaces this module (tests/hooks/catalogue-source.js) to point at
 * a local model host and to simulate small and large devices.
 *
 * Rules
 * - The catalogue is the shell's own file, `catalogue/models.json` next to
 *   the page (read with a time bound; fit.js checks every entry).
 * - The device facts are those the engines already use: WebGPU's adapter
 *   (features, `maxBufferSize`, `maxStorageBufferBindingSize`, whether it
 *   is a software fallback; one request with a time limit, engines/gpu.js),
 *   `navigator.deviceMemory` (GB, capped by the browser), `navigator.
 *   hardwareConcurrency` and the storage left (`navigator.storage.
 *   estimate()`). A fact the browser does not give is null.
 */

import { isFallback, requestAdapter } from "../engines/gpu.js";
import { timedFetch } from "../engines/bounded.js";

/** The catalogue's URL (relative to the page). */
export const CATALOGUE_URL = "catalogue/models.json";

/** The catalogue's JSON text; rejects when it cannot be read. */
export async function catalogueText() {
  const response = await timedFetch((input, init) => fetch(input, init))(new URL(CATALOGUE_URL, document.baseURI).href);
  if (!response.ok) throw new Error("the model catalogue could not be read");
  return response.text();
}

/**
 * This device as fit.js reads it: `{gpu: null | {features, limits:
 * {maxBufferSize, maxStorageBufferBindingSize}, fallback}, memoryGB,
 * cores, storageFreeBytes}`. Never rejects.
 */
export async function deviceFacts() {
  const { adapter } = await requestAdapter({ powerPreference: "high-performance" });
  const gpu = adapter
    ? {
      features: [...adapter.features],
      limits: {
        maxBufferSize: Number(adapter.limits.maxBufferSize) || 0,
        maxStorageBufferBindingSize: Number(adapter.limits.maxStorageBufferBindingSize) || 0,
      },
      fallback: isFallback(adapter),
    }
    : null;
  let storageFreeBytes = null;
  try {
    const { usage, quota } = await navigator.storage.estimate();
    const free = Number(quota) - Number(usage);
    storageFreeBytes = Number.isFinite(free) ? Math.max(0, free) : null;
  } catch {
    storageFreeBytes = null;
  }
  return {
    gpu,
    memoryGB: Number(navigator.deviceMemory) || null,
    cores: Number(navigator.hardwareConcurrency) || null,
    storageFreeBytes,
  };
}
