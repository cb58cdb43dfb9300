/**
 * The transformers.js worker: one ONNX chat model, run by @huggingface/transformers
 * (onnxruntime-web) off the page's main thread. Driven by the engine host
 * (engine-host.js), one worker per model.
 *
 * Rules
 * - The protocol of every engine worker (worker-bridge.js). Messages in:
 *   `{op: "load", key, source, device, dtype, fresh}` once, then
 *   `{op: "chat", id, body}` and `{op: "cancel", id}`. Messages out:
 *   `{op: "progress", key, fraction, detail?}`,
 *   `{op: "loaded", key, info: {ok, kind?, device, contextSize}}`,
 *   `{op: "chunks", id, chunks: [JSON text]}` (one OpenAI chat completion
 *   chunk each, as it is made) and `{op: "end", id, kind?}` (kind names a
 *   failure; none when it finished or was cancelled).
 * - `source`: `{kind: "path", base, model}` reads `<base><model>/...` (`base`
 *   an absolute URL: the bundled model inside the shell's own folder, or the
 *   folder above a model folder the user gave by URL); `{kind: "hub", model}`
 *   reads a Hugging Face hub id. Remote loading is switched on only for a
 *   folder on another origin or a hub id. The library's CDN default for
 *   onnxruntime's wasm is replaced by the copy next to the bundle.
 * - Chats run one at a time, in order. Temperature 0 (or none) is greedy
 *   decoding (`do_sample: false`). The prompt is the model's own chat
 *   template with the request's tools. `stop` strings end the answer before
 *   them. Cancel interrupts the running generation through an
 *   `InterruptableStoppingCriteria` (it stops after the token being computed)
 *   or drops a queued one; the model stays loaded and usable.
 * - Model files: from the shell's own origin they are read as a local path
 *   and not kept by the library (the service worker keeps the bundled model
 *   once used, web/sw-napllm.js); from elsewhere the library keeps them in
 *   its Cache Storage `transformers-cache`, but only files that pass a
 *   check (`keepable`: status 200, JSON that parses, weights that are no
 *   text or HTML). A failed load removes the model's folder from every
 *   cache but a build's precache, and the engine asks for the next load of
 *   that model with `fresh`: every file is then fetched with
 *   `cache: "reload"`, past the HTTP cache.
 * - Weights files (`.onnx`, `.onnx_data`) are downloaded through
 *   download.js: a cut download continues from the checked bytes already
 *   stored (its rules); the library gets the whole file or an error.
 * - Every file the library fetches is bounded in time (bounded.js
 *   `timedFetch`, through download.js `resumableFetch`) and in bytes (bounded.js `limitedFetch`):
 *   weights by `MAX_ONNX_WEIGHTS_BYTES`, other files by
 *   `MAX_ONNX_OTHER_BYTES` (limits.js), and an uncompressed body by its
 *   declared length; past that the download is cancelled and the load
 *   fails as a `download` failure (its files are evicted as above).
 * - Errors become kinds (`download`, `load`, `context`, `inference`); the
 *   library's own text goes to the console only.
 */

import {
  AutoModelForCausalLM,
  AutoTokenizer,
  InterruptableStoppingCriteria,
  ModelRegistry,
  TextStreamer,
  env,
  wasmPaths,
} from "../vendor/transformers/transformers.js";
import { limitedFetch, onnxLimit, timedFetch } from "./bounded.js";
import { describeProgress, resumableFetch } from "./download.js";

env.backends.onnx.wasm.wasmPaths = { ...wasmPaths };
// One wasm thread: the work runs on the GPU, and no pthread workers are spawned.
env.backends.onnx.wasm.numThreads = 1;
env.useWasmCache = false;
env.allowRemoteModels = false;
env.allowLocalModels = false;

// ------------------------------------------------------------ model files

/** The Cache Storage the library keeps downloaded model files in (its default name). */
const MODEL_CACHE = "transformers-cache";
const NOT_BINARY = /^text\/|html|json|xml/i;
const MARKUP = /html|xml/i;

/**
 * Whether `response` (a whole file the library read, for `key`) may be
 * kept: status 200; a JSON file is no HTML/XML and parses as JSON; an ONNX
 * or other weights file has no text, HTML, JSON or XML type and is not
 * empty. The library caches any 200 answer before it parses it, so without
 * this a host's fallback page stayed "config.json" for good.
 */
async function keepable(key, response) {
  if (!response || response.status !== 200) return false;
  const type = response.headers.get("content-type") || "";
  const path = new URL(String(key), self.location.href).pathname.toLowerCase();
  try {
    if (path.endsWith(".json")) {
      if (MARKUP.test(type)) return false;
      const value = JSON.parse(await response.text());
      return value !== null && typeof value === "object";
    }
    if (/\.(onnx|onnx_data|bin|safetensors)$/.test(path)) {
      if (NOT_BINARY.test(type)) return false;
      return (await response.arrayBuffer()).byteLength > 0;
    }
    return !MARKUP.test(type);
  } catch {
    return false;
  }
}

/**
 * The library's model cache, with a check before anything is stored
 * (`keepable`); the library's own `env.useBrowserCache` would store any
 * 200 answer. Same interface as the library's cache (`match`, `put`,
 * `delete`).
 */
const verifiedCache = {
  /** Set once the load failed: files still arriving from it are not kept. */
  closed: false,
  /** Stores in progress (a failed load waits for them, then evicts). */
  pending: new Set(),
  async match(key) {
    return (await caches.open(MODEL_CACHE)).match(key);
  },
  put(key, response) {
    const store = (async () => {
      if (this.closed) return;
      if (!(await keepable(key, response.clone()))) {
        console.warn("napllm onnx engine: a downloaded file is no model file; not kept");
        return;
      }
      if (!this.closed) await (await caches.open(MODEL_CACHE)).put(key, response);
    })();
    this.pending.add(store);
    return store.finally(() => this.pending.delete(store));
  },
  async delete(key) {
    return (await caches.open(MODEL_CACHE)).delete(key);
  },
};

/**
 * Remove every cached file under `prefix` (a model's folder URL) from every
 * Cache Storage cache but a build's precache (whose files are checked by
 * revision): the library's cache, and the service worker's cache of files
 * kept once used, so the next load downloads them again. Never throws.
 */
async function forgetModelFiles(prefix) {
  if (!prefix || !("caches" in self)) return;
  try {
    for (const name of await caches.keys()) {
      if (name.includes("-precache-")) continue;
      const cache = await caches.open(name);
      for (const request of await cache.keys()) {
        if (request.url.startsWith(prefix)) await cache.delete(request);
      }
    }
  } catch (error) {
    console.error("napllm onnx engine: could not clear cached model files", error);
  }
}

let model = null;
let tokenizer = null;
let modelName = "onnx";
let contextSize = 2048;
let chain = Promise.resolve();
/** id -> {stopper, cancelled} of the chats queued or running. */
const chats = new Map();
let counter = 0;

const post = (message) => self.postMessage(message);
/** One OpenAI chat chunk of chat `id` to the page, as the JSON text the page queues. */
const postChunk = (id, value) => post({ op: "chunks", id, chunks: [JSON.stringify(value)] });
/** The key of the load in progress (worker-bridge.js matches answers by it). */
let loadKey = "";

/** Set when the current load's download was refused (its size, or no model file). */
let tooLarge = false;

function loadKind(error) {
  if (tooLarge || (error && /^Download/.test(String(error.name)))) return "download";
  const text = String((error && error.message) || error || "");
  if (/fetch|network|40\d|50\d|Could not locate file|Unauthorized/i.test(text)) return "download";
  return "load";
}

/**
 * Point the library at `source`'s files: a same-origin folder is read as a
 * "local" path (transformers.js fetches `<localModelPath><model>/<file>`,
 * kept by the service worker when it is a folder it keeps), a folder
 * elsewhere as a remote host with the model's own folder name, a hub id
 * from the Hugging Face hub; files from elsewhere are kept in the
 * library's cache, checked first (`verifiedCache`). Sets `modelName`.
 * Returns `{prefix, cache}`: the folder URL the files are read from, and
 * the Cache Storage name they are kept in (null: not by the library).
 */
function configure(source) {
  const base = source.kind === "hub" ? null : new URL(String(source.base));
  if (base && base.origin === self.location.origin) {
    env.allowRemoteModels = false;
    env.allowLocalModels = true;
    env.localModelPath = base.pathname;
  } else if (base) {
    env.allowRemoteModels = true;
    env.allowLocalModels = false;
    env.remoteHost = base.href;
    env.remotePathTemplate = "{model}/";
  } else {
    env.allowRemoteModels = true;
    env.allowLocalModels = false;
  }
  modelName = String(source.model);
  env.useBrowserCache = false;
  env.useCustomCache = Boolean(base === null || base.origin !== self.location.origin) && "caches" in self;
  env.customCache = env.useCustomCache ? verifiedCache : null;
  const folder = base
    ? `${base.href}${modelName}/`
    : new URL(`${env.remotePathTemplate.replaceAll("{model}", modelName).replaceAll("{revision}", "main")}`, env.remoteHost).href;
  return { prefix: folder.endsWith("/") ? folder : `${folder}/`, cache: env.useCustomCache ? MODEL_CACHE : null };
}

/**
 * The files the model of `source` needs, without loading it
 * (transformers.js's `ModelRegistry.get_files` for `device` and `dtype`:
 * config, weights for that dtype, generation config, tokenizer; it reads
 * config.json, which is kept like any model file). Posts `{op: "files",
 * ok, urls, cache, engine}`: absolute URLs of the model's files, the cache
 * they belong in (`configure`), and the URLs of the engine's own files
 * (this bundle and onnxruntime's wasm), which the service worker keeps
 * once fetched. `{op: "files", ok: false}` when they cannot be listed.
 */
async function listFiles({ source, device, dtype }) {
  try {
    env.fetch = limitedFetch(timedFetch(fetch.bind(self)), onnxLimit, () => {});
    const { prefix, cache } = configure(source);
    const names = await ModelRegistry.get_files(modelName, {
      device,
      dtype: dtype || null,
      include_tokenizer: true,
      include_processor: false,
    });
    const urls = names.map((name) => new URL(String(name), prefix).href).filter((url) => url.startsWith(prefix));
    const engine = [new URL("../vendor/transformers/transformers.js", import.meta.url).href, wasmPaths.mjs, wasmPaths.wasm];
    post({ op: "files", ok: urls.length > 0, urls, cache, engine });
  } catch (error) {
    console.error("napllm onnx engine: the model's files could not be listed", error);
    post({ op: "files", ok: false });
  }
}

async function load({ key, source, device, dtype, fresh }) {
  loadKey = String(key);
  // After a failed load of this model, every file is fetched from the host
  // again, past the HTTP cache (which may still hold the bad answer).
  const plain = fresh ? (url, init = {}) => fetch(url, { ...init, cache: "reload" }) : fetch.bind(self);
  tooLarge = false;
  // Weights files are downloaded resumably (download.js), the rest as they are.
  const weights = (url) => /\.(onnx|onnx_data)$/i.test(new URL(String(url), self.location.href).pathname);
  const resumable = resumableFetch(plain, weights, onnxLimit, {
    onProgress: (event) => {
      if (event.total) post({ op: "progress", key: loadKey, fraction: Math.min(1, event.received / event.total), detail: describeProgress(event) });
    },
  });
  // A refused weights file (download.js) is a `download` failure whatever
  // the library makes of the error.
  const guarded = async (input, init) => {
    try {
      return await resumable(input, init);
    } catch (error) {
      if (error && (error.name === "DownloadTooLarge" || error.name === "NotAModel")) tooLarge = true;
      throw error;
    }
  };
  env.fetch = limitedFetch(guarded, onnxLimit, () => {
    tooLarge = true;
  });
  const { prefix } = configure(source);
  const files = new Map();
  const progress_callback = (report) => {
    if (!report || report.status !== "progress" || !(report.total > 0)) return;
    files.set(report.file, [Number(report.loaded) || 0, Number(report.total)]);
    let loaded = 0;
    let total = 0;
    for (const [l, t] of files.values()) {
      loaded += l;
      total += t;
    }
    post({ op: "progress", key: loadKey, fraction: Math.min(1, loaded / total) });
  };
  const options = { device, progress_callback };
  if (dtype) options.dtype = dtype;
  try {
    tokenizer = await AutoTokenizer.from_pretrained(modelName, { progress_callback });
    model = await AutoModelForCausalLM.from_pretrained(modelName, options);
  } catch (error) {
    console.error("napllm onnx engine: the model could not be loaded", error);
    model = null;
    tokenizer = null;
    // The library may still be storing files it fetched in parallel.
    verifiedCache.closed = true;
    await Promise.allSettled([...verifiedCache.pending]);
    await forgetModelFiles(prefix);
    post({ op: "loaded", key: loadKey, info: { ok: false, kind: loadKind(error) } });
    return;
  }
  const config = model.config || {};
  const limit = Number(config.max_position_embeddings || config.n_positions || 0);
  if (limit > 0) contextSize = limit;
  post({ op: "loaded", key: loadKey, info: { ok: true, device, contextSize } });
}

/** Chat messages for the template: text parts joined, other fields kept. */
function templateMessages(messages) {
  return (Array.isArray(messages) ? messages : []).map((message) => {
    const copy = { ...message };
    if (Array.isArray(copy.content)) {
      copy.content = copy.content
        .filter((part) => part && part.type === "text")
        .map((part) => String(part.text))
        .join("");
    }
    if (copy.content === null || copy.content === undefined) copy.content = "";
    return copy;
  });
}

function chunk(id, delta, finishReason = null) {
  return {
    id: `chatcmpl-${id}`,
    object: "chat.completion.chunk",
    created: Math.floor(Date.now() / 1000),
    model: modelName,
    choices: [{ index: 0, delta, finish_reason: finishReason }],
  };
}

/** Text emitted so far, holding back what could start a stop string. */
class StopFilter {
  constructor(stops, emit, onStop) {
    this.stops = stops.filter((s) => typeof s === "string" && s.length > 0);
    this.hold = this.stops.reduce((n, s) => Math.max(n, s.length - 1), 0);
    this.text = "";
    this.sent = 0;
    this.stopped = false;
    this.emit = emit;
    this.onStop = onStop;
  }

  put(piece) {
    if (this.stopped) return;
    this.text += piece;
    let cut = -1;
    for (const stop of this.stops) {
      const at = this.text.indexOf(stop, Math.max(0, this.sent - stop.length + 1));
      if (at >= 0 && (cut < 0 || at < cut)) cut = at;
    }
    if (cut >= 0) {
      this.stopped = true;
      if (cut > this.sent) this.emit(this.text.slice(this.sent, cut));
      this.sent = cut;
      this.onStop();
      return;
    }
    const upto = this.text.length - this.hold;
    if (upto > this.sent) {
      this.emit(this.text.slice(this.sent, upto));
      this.sent = upto;
    }
  }

  flush() {
    if (!this.stopped && this.text.length > this.sent) this.emit(this.text.slice(this.sent));
    this.sent = this.text.length;
  }
}

function number(value, fallback) {
  return typeof value === "number" && Number.isFinite(value) ? value : fallback;
}

async function chat(id, body, state) {
  if (state.cancelled) {
    post({ op: "end", id });
    return;
  }
  counter += 1;
  let inputs;
  try {
    const tools = Array.isArray(body.tools) && body.tools.length > 0 ? body.tools : undefined;
    inputs = tokenizer.apply_chat_template(templateMessages(body.messages), {
      tools,
      add_generation_prompt: true,
      return_dict: true,
    });
  } catch (error) {
    console.error("napllm onnx engine: the chat template failed", error);
    post({ op: "end", id, kind: "inference" });
    return;
  }
  const promptTokens = Number(inputs.input_ids.dims.at(-1));
  const room = contextSize - promptTokens;
  if (room <= 0) {
    post({ op: "end", id, kind: "context" });
    return;
  }
  const asked = number(body.max_completion_tokens, number(body.max_tokens, room));
  const maxNew = Math.max(1, Math.min(room, Math.floor(asked)));
  const temperature = number(body.temperature, 0);
  const sampling =
    temperature > 0
      ? {
          do_sample: true,
          temperature,
          top_p: number(body.top_p, 1),
          ...(Number.isInteger(body.top_k) && body.top_k > 0 ? { top_k: body.top_k } : {}),
        }
      : { do_sample: false };
  const stops = typeof body.stop === "string" ? [body.stop] : Array.isArray(body.stop) ? body.stop : [];
  let generated = 0;
  let lastToken = null;
  let first = true;
  const stopper = state.stopper;
  const filter = new StopFilter(
    stops,
    (text) => {
      if (state.cancelled || text.length === 0) return;
      postChunk(id, chunk(counter, first ? { role: "assistant", content: text } : { content: text }));
      first = false;
    },
    () => stopper.interrupt(),
  );
  const streamer = new TextStreamer(tokenizer, {
    skip_prompt: true,
    skip_special_tokens: true,
    callback_function: (text) => filter.put(text),
    token_callback_function: (tokens) => {
      generated += tokens.length;
      lastToken = tokens.length > 0 ? Number(tokens[tokens.length - 1]) : lastToken;
    },
  });
  try {
    await model.generate({
      ...inputs,
      ...sampling,
      max_new_tokens: maxNew,
      streamer,
      stopping_criteria: stopper,
    });
  } catch (error) {
    if (!state.cancelled) {
      console.error("napllm onnx engine: generation failed", error);
      post({ op: "end", id, kind: "inference" });
      return;
    }
  }
  if (state.cancelled) {
    post({ op: "end", id });
    return;
  }
  filter.flush();
  const eos = [].concat(model.generation_config?.eos_token_id ?? model.config?.eos_token_id ?? []);
  const ended = lastToken !== null && eos.map(Number).includes(lastToken);
  // The end-of-sequence token is not part of the answer.
  const completion = ended ? generated - 1 : generated;
  const reason = filter.stopped || ended || generated < maxNew ? "stop" : "length";
  postChunk(id, chunk(counter, {}, reason));
  postChunk(id, {
    ...chunk(counter, {}),
    choices: [],
    usage: { prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion },
  });
  post({ op: "end", id });
}

self.onmessage = (event) => {
  const message = event.data || {};
  if (message.op === "load") {
    chain = chain.then(() => load(message));
  } else if (message.op === "files") {
    chain = chain.then(() => listFiles(message));
  } else if (message.op === "chat") {
    const id = String(message.id);
    const state = { stopper: new InterruptableStoppingCriteria(), cancelled: false };
    chats.set(id, state);
    chain = chain
      .then(() => chat(id, message.body || {}, state))
      .catch((error) => {
        console.error("napllm onnx engine: chat failed", error);
        post({ op: "end", id, kind: "inference" });
      })
      .finally(() => chats.delete(id));
  } else if (message.op === "cancel") {
    const state = chats.get(String(message.id));
    if (state) {
      state.cancelled = true;
      state.stopper.interrupt();
    }
  }
};
