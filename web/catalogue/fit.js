/**
 * The model catalogue read and fitted to this device: pure functions, no
 * DOM, no network (tests/unit/test_catalogue_fit_js.py runs them in node).
 *
 * Rules
 * - `readCatalogue(json)` takes the catalogue's JSON text (web/catalogue/
 *   models.json, or the test build's override) and keeps only entries
 *   whose every field has its shape: an engine the catalogue describes
 *   (of a kind the build declares, when the caller names them),
 *   every file URL `https:` on one of the catalogue's `hosts` (plain
 *   `http:` only on a loopback host, for a model server of this computer),
 *   sizes positive safe integers, a sha256 of 64 hex digits or null, a
 *   licence with an `https:` link, a model id (or a model URL on those
 *   hosts), and connection settings only of the keys its engine's row lists
 *   (`settings`), with plain values. An entry that fails any check is
 *   dropped, never shown or downloaded; the file is the shell's own, but a
 *   server in front of it is not trusted to keep it intact.
 * - `fitOf(entry, device, engines)` gives `{verdict, reasons}`: verdict
 *   `"fits"`, `"slow"` (may be slow) or `"no"` (does not fit), reasons in
 *   words. Does not fit: the engine needs WebGPU and there is none, the
 *   entry needs an adapter feature the adapter lacks (`shader-f16`), its
 *   largest buffer exceeds `maxStorageBufferBindingSize` or `maxBufferSize`,
 *   its memory (weights + KV cache at the default context) exceeds the
 *   share of the device's memory a page may count on, or its download
 *   exceeds the storage left. May be slow: it needs more than half that
 *   share, the adapter is a software fallback, or a processor engine runs
 *   a large model on few cores. Facts the browser does not give (no
 *   `deviceMemory`, no storage estimate) are not held against an entry.
 * - `suggestion(entries, device, engines)`: the largest entry that fits
 *   (a GPU engine, then the smaller download, on a tie), or null; the
 *   caller only shows it.
 * - `filterEntries(entries, query)`: by name text, engine, capability and
 *   the largest download size.
 */

/**
 * Whether `name` names a byte ceiling of engines/limits.js (`MAX_..._BYTES`):
 * the only names a catalogue's engine may give as its `ceiling`, so a
 * catalogue cannot pick a time bound or any other export as a size.
 */
export function isCeilingName(name) {
  return typeof name === "string" && /^MAX_[A-Z0-9_]{1,40}_BYTES$/.test(name);
}

/** A page may count on this share of `navigator.deviceMemory` for one model. */
export const MEMORY_SHARE = 0.5;
/** `navigator.deviceMemory` is capped at 8 (GB) by browsers: above it memory is unknown. */
export const DEVICE_MEMORY_CAP_GB = 8;
/** A processor engine runs models above this many parameters slowly on few cores. */
export const CPU_LARGE_PARAMETERS = 1_000_000_000;
/** "Few cores" for that rule. */
export const CPU_FEW_CORES = 4;

const MiB = 1024 * 1024;
const SHA256 = /^[0-9a-f]{64}$/;
const LOOPBACK = new Set(["127.0.0.1", "localhost", "[::1]"]);

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function positiveInt(value) {
  return Number.isSafeInteger(value) && value > 0;
}

function text(value, max = 200) {
  return typeof value === "string" && value.length > 0 && value.length <= max;
}

/** Whether `url` is a file URL the catalogue may name (module rules). */
export function allowedUrl(url, hosts) {
  let parsed;
  try {
    parsed = new URL(String(url));
  } catch {
    return false;
  }
  if (parsed.username || parsed.password || !hosts.has(parsed.host)) return false;
  return parsed.protocol === "https:" || (parsed.protocol === "http:" && LOOPBACK.has(parsed.hostname));
}

function readFile(file, hosts) {
  if (!isObject(file) || !allowedUrl(file.url, hosts) || !positiveInt(file.bytes)) return null;
  if (file.sha256 !== null && !(typeof file.sha256 === "string" && SHA256.test(file.sha256))) return null;
  return { url: String(file.url), bytes: file.bytes, sha256: file.sha256, estimate: file.estimate === true, role: text(file.role, 40) ? file.role : "" };
}

function readEntry(entry, hosts, engines) {
  if (!isObject(entry) || !text(entry.id, 100) || !text(entry.name, 80) || !text(entry.model, 200)) return null;
  if (!Object.hasOwn(engines, entry.engine) || !positiveInt(entry.parameters) || !positiveInt(entry.contextSize)) return null;
  const licence = entry.licence;
  if (!isObject(licence) || !text(licence.name, 80) || !allowedLicence(licence.url)) return null;
  const memory = entry.memory;
  if (!isObject(memory) || !(memory.totalMB > 0) || !(memory.weightsMB > 0)) return null;
  if (!Array.isArray(entry.files) || entry.files.length === 0 || entry.files.length > 64) return null;
  const files = entry.files.map((file) => readFile(file, hosts));
  if (files.includes(null)) return null;
  if (!modelAllowed(entry.model, hosts)) return null;
  const features = Array.isArray(entry.requires?.features) ? entry.requires.features.filter((f) => text(f, 40)) : [];
  const caps = isObject(entry.capabilities) ? entry.capabilities : {};
  return {
    id: entry.id,
    name: entry.name,
    family: text(entry.family, 40) ? entry.family : "",
    parameters: entry.parameters,
    quantization: text(entry.quantization, 20) ? entry.quantization : "",
    engine: entry.engine,
    model: entry.model,
    settings: settingsOf(entry.settings, engines[entry.engine].settings),
    contextSize: entry.contextSize,
    licence: { name: licence.name, url: licence.url, accept: licence.accept === true },
    source: allowedLicence(entry.source) ? entry.source : "",
    capabilities: { json: caps.json === true, tools: caps.tools === true, images: caps.images === true },
    memory: {
      weightsMB: memory.weightsMB,
      totalMB: memory.totalMB,
      gpuTotalMB: memory.gpuTotalMB > 0 ? memory.gpuTotalMB : null,
      largestBufferMB: memory.largestBufferMB > 0 ? memory.largestBufferMB : null,
    },
    features,
    files,
    downloadBytes: files.reduce((sum, file) => sum + file.bytes, 0),
    estimate: files.some((file) => file.estimate),
  };
}

const HUB_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(?:\/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$/;

/** A model id, or a model URL on the catalogue's hosts (an id never names a host). */
function modelAllowed(model, hosts) {
  return /^[a-z][a-z0-9+.-]*:/i.test(model) ? allowedUrl(model, hosts) : HUB_ID.test(model);
}

/** The entry's connection settings: only the keys its engine lists, only plain values. */
function settingsOf(settings, allowed) {
  const kept = {};
  if (!isObject(settings)) return kept;
  for (const key of allowed) {
    const value = settings[key];
    if (typeof value === "string" ? value.length <= 100 : Number.isSafeInteger(value) || typeof value === "boolean") kept[key] = value;
  }
  return kept;
}

function allowedLicence(url) {
  try {
    return new URL(String(url)).protocol === "https:";
  } catch {
    return false;
  }
}

/**
 * The catalogue of `json` (text): `{hosts: Set, engines: {kind: info},
 * entries: [entry]}` with only well-formed entries (module rules). `kinds`
 * (a Set, or null for any): the engine kinds this build declares
 * (engines/declarations.js); an engine row of another kind is dropped, and
 * its entries with it. Never throws: unreadable text gives an empty
 * catalogue.
 */
export function readCatalogue(json, kinds = null) {
  let data;
  try {
    data = JSON.parse(String(json));
  } catch {
    data = null;
  }
  const empty = { hosts: new Set(), engines: {}, entries: [] };
  if (!isObject(data) || !Array.isArray(data.hosts) || !isObject(data.engines) || !Array.isArray(data.entries)) return empty;
  const hosts = new Set(data.hosts.filter((host) => text(host, 100)).map((host) => host.toLowerCase()));
  const engines = {};
  for (const [kind, info] of Object.entries(data.engines)) {
    if (!isObject(info) || !text(info.label, 60)) continue;
    if (kinds !== null && !kinds.has(kind)) continue;
    engines[kind] = {
      label: info.label,
      needs: Array.isArray(info.needs) ? info.needs.filter((n) => text(n, 20)) : [],
      files: info.files === "listed" ? "listed" : "engine",
      store: text(info.store, 60) ? info.store : null,
      gguf: info.gguf === true,
      ceiling: isCeilingName(info.ceiling) ? info.ceiling : null,
      urlSetting: text(info.urlSetting, 30) ? info.urlSetting : null,
      settings: Array.isArray(info.settings) ? info.settings.filter((key) => text(key, 30) && key !== info.urlSetting) : [],
      cpu: info.cpu === true,
    };
  }
  const entries = [];
  const seen = new Set();
  for (const raw of data.entries.slice(0, 500)) {
    const entry = readEntry(raw, hosts, engines);
    if (entry && !seen.has(entry.id)) {
      seen.add(entry.id);
      entries.push(entry);
    }
  }
  return { hosts, engines, entries };
}

function mb(value) {
  return value >= 1024 ? `${(value / 1024).toFixed(1)} GB` : `${Math.round(value)} MB`;
}

/**
 * How `entry` fits `device` (module rules): `{verdict: "fits"|"slow"|"no",
 * reasons: [text]}`. `device`: `{gpu: null | {features: [name], limits:
 * {maxBufferSize, maxStorageBufferBindingSize} (bytes), fallback: bool},
 * memoryGB: number|null, cores: number|null, storageFreeBytes:
 * number|null}`; `engines`: the catalogue's engine table.
 */
export function fitOf(entry, device, engines) {
  const no = [];
  const slow = [];
  const engine = engines[entry.engine] || { needs: [], cpu: false };
  const gpu = device?.gpu ?? null;
  if (engine.needs.includes("webgpu")) {
    if (!gpu) {
      no.push("needs WebGPU, which this browser does not offer");
    } else {
      const features = new Set(Array.isArray(gpu.features) ? gpu.features : []);
      for (const feature of entry.features) if (!features.has(feature)) no.push(`needs the GPU feature ${feature}, which this GPU lacks`);
      const limits = gpu.limits || {};
      const bufferLimit = Math.min(Number(limits.maxStorageBufferBindingSize) || Infinity, Number(limits.maxBufferSize) || Infinity);
      if (entry.memory.largestBufferMB && entry.memory.largestBufferMB * MiB > bufferLimit) {
        no.push(`needs a GPU buffer of ${mb(entry.memory.largestBufferMB)}; this GPU allows ${mb(bufferLimit / MiB)}`);
      }
      if (gpu.fallback === true) slow.push("the GPU is a software fallback");
    }
  }
  const needed = entry.memory.gpuTotalMB ?? entry.memory.totalMB;
  const memoryGB = Number(device?.memoryGB);
  if (memoryGB > 0) {
    const share = memoryGB * 1024 * MEMORY_SHARE;
    if (needed > share && memoryGB < DEVICE_MEMORY_CAP_GB) {
      no.push(`needs about ${mb(needed)} of memory; this device has ${memoryGB} GB`);
    } else if (needed > share / 2) {
      slow.push(`needs about ${mb(needed)} of memory, much of this device's ${memoryGB >= DEVICE_MEMORY_CAP_GB ? "8 GB or more" : `${memoryGB} GB`}`);
    }
  }
  const cores = Number(device?.cores);
  if (engine.cpu && cores > 0 && cores <= CPU_FEW_CORES && entry.parameters > CPU_LARGE_PARAMETERS) {
    slow.push(`runs on the processor, which has ${cores} cores`);
  }
  const free = device?.storageFreeBytes;
  if (Number.isFinite(free) && free >= 0 && entry.downloadBytes > free) {
    no.push(`its download (${mb(entry.downloadBytes / MiB)}) exceeds the ${mb(free / MiB)} of storage left`);
  }
  if (no.length) return { verdict: "no", reasons: no };
  if (slow.length) return { verdict: "slow", reasons: slow };
  return { verdict: "fits", reasons: [] };
}

/** The words of a verdict. */
export const VERDICT_TEXT = Object.freeze({ fits: "Fits", slow: "May be slow", no: "Does not fit" });

/**
 * The entry to suggest on first run, or null: the largest that fits; on a
 * tie one whose engine runs on the GPU (faster than the processor), then
 * the smaller download.
 */
export function suggestion(entries, device, engines) {
  const rank = (entry) => [entry.parameters, engines[entry.engine]?.cpu === true ? 0 : 1, -entry.downloadBytes];
  let best = null;
  for (const entry of entries) {
    if (fitOf(entry, device, engines).verdict !== "fits") continue;
    if (!best) {
      best = entry;
      continue;
    }
    const [a, b] = [rank(entry), rank(best)];
    const i = a.findIndex((value, index) => value !== b[index]);
    if (i >= 0 && a[i] > b[i]) best = entry;
  }
  return best;
}

/**
 * The entries matching `query`: `{text, engine, capability, maxBytes}`
 * (each optional: text in the name, family or model id, case-insensitive;
 * an engine kind; "json" | "tools" | "images"; the largest download in bytes).
 */
export function filterEntries(entries, query = {}) {
  const words = String(query.text || "").trim().toLowerCase();
  return entries.filter((entry) => {
    if (words && !`${entry.name} ${entry.family} ${entry.model} ${entry.quantization}`.toLowerCase().includes(words)) return false;
    if (query.engine && entry.engine !== query.engine) return false;
    if (query.capability && entry.capabilities[query.capability] !== true) return false;
    if (Number(query.maxBytes) > 0 && entry.downloadBytes > Number(query.maxBytes)) return false;
    return true;
  });
}
