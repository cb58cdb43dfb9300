/**
 * The envelope inspector: every envelope in and out, per endpoint, for
 * napplet developers.
 *
 * Rules
 * - Bounded memory whatever napplets send: at most `capacity` entries and
 *   `MAX_STORED_CHARS` UTF-16 code units of text in all (the oldest entries
 *   are dropped first); each stored text is cut to `MAX_ENTRY_CHARS` with a
 *   note of how much was left out, and envelopes longer than
 *   `MAX_PARSED_CHARS` are not parsed for display at all. A kept text or
 *   label is a copy, never a slice of a longer string (`detached`); labels
 *   are cut to `MAX_LABEL_CHARS`.
 * - An endpoint that closes is forgotten: its entries, its pending joins
 *   and its place in the endpoint filter (`forgetEndpoint`).
 * - "in" entries are recorded by the page when it hands a message to the
 *   runtime; "out" entries when `napllmHost.postAll` delivers one. When the
 *   runtime also reports an envelope through `napllmHost.inspect`, it is
 *   joined to the page's entry (its converted view is kept alongside)
 *   instead of being listed twice.
 * - The runtime may also report notes (direction "note", e.g. a dropped
 *   message); they are listed as entries of their own.
 * - Only envelope text is shown. Connection settings and credentials never
 *   pass through here; the runtime never puts them in envelopes.
 * - Rendering is batched to one animation frame and skipped while the
 *   panel is collapsed (then only the count is updated, every 250 ms).
 * - Announcing entries (for `napllm-check`): what the panel holds and draws
 *   is bounded and lossy (the oldest entries go first, a closed endpoint's
 *   go at once, drawing waits for a frame), so a tool that must see every
 *   envelope cannot read the list. When a listener answers `LISTEN_EVENT`
 *   (dispatched once on the panel's document when the inspector is made;
 *   the listener calls `preventDefault()`), every entry is also dispatched
 *   as an `ENTRY_EVENT` on that document *before* any bound or forgetting
 *   applies: `detail` is `{serial, endpoint, direction, text}`, `serial`
 *   counting 1, 2, 3, … with no gap, `text` the envelope text as recorded
 *   (uncut; for "in" the wireJson). Without a listener nothing is
 *   dispatched (one boolean test per entry). Napplets are sandboxed
 *   cross-origin frames: they can neither listen to nor answer these
 *   events on the shell's document.
 */

import { byIds } from "./dom.js";
import { envelopeLabel, unwrapWire } from "./wire.js";

const PENDING_LIMIT = 64;
const FORGOTTEN_LIMIT = 1024;
/** Longest text kept per entry (UTF-16 code units). */
export const MAX_ENTRY_CHARS = 16 * 1024;
/** Most text kept over all entries (UTF-16 code units). */
export const MAX_STORED_CHARS = 2 * 1024 * 1024;
/** Longer envelopes are shown cut, without being parsed. */
const MAX_PARSED_CHARS = 256 * 1024;
/** Most a pretty-printed text may grow over the text itself (times). */
const PRETTY_GROWTH = 4;
/** How often the collapsed panel's count is brought up to date (ms). */
const COLLAPSED_RENDER_MS = 250;
/** Dispatched once on the document when the inspector is made; cancel it to get `ENTRY_EVENT`s. */
export const LISTEN_EVENT = "napllm-inspector-listen";
/** One per recorded entry, before any bound applies (see "Announcing entries" above). */
export const ENTRY_EVENT = "napllm-inspector-entry";

/**
 * A copy of `text` that refers to no other string. V8 makes a slice (and a
 * regular expression's match) of a long string a view that keeps the whole
 * string alive, so a kept piece of an 8 MB envelope would hold all 8 MB and
 * the inspector's bound would count 16 Ki of it. Round-tripping through
 * JSON copies the characters exactly (lone surrogates included).
 */
function detached(text) {
  return JSON.parse(JSON.stringify(text));
}

/** `text` cut to `MAX_ENTRY_CHARS`, saying how much was left out (a copy that holds no longer text). */
export function cut(text) {
  if (text.length <= MAX_ENTRY_CHARS) return text;
  return detached(`${text.slice(0, MAX_ENTRY_CHARS)}… (${text.length - MAX_ENTRY_CHARS} more characters not kept)`);
}

/** The envelope type named near the start of a long text, for its label. */
function labelOfLong(text) {
  const match = /\\?"type\\?"\s*:\s*\\?"([A-Za-z0-9._-]{1,80})\\?"/.exec(text.slice(0, 4096));
  return match ? `${match[1]} (long)` : "(long)";
}

/** Longest label kept (a napplet names its envelope's type; it is not counted in `chars`). */
const MAX_LABEL_CHARS = 80;

/** `label` cut to `MAX_LABEL_CHARS`, as a copy that holds no longer text (see `detached`). */
function shortLabel(label) {
  return detached(label.length <= MAX_LABEL_CHARS ? label : `${label.slice(0, MAX_LABEL_CHARS)}…`);
}

/**
 * Pretty-print JSON text for display; invalid text is shown as is, and so is
 * text whose indentation would make it more than `PRETTY_GROWTH` times as
 * long (plus 1 Ki): 16 Ki of arrays nested 128 deep would indent to almost
 * 2 Mi characters, and an open panel keeps every listed row.
 */
export function pretty(text) {
  if (text.length >= MAX_ENTRY_CHARS) return text;
  try {
    const shown = JSON.stringify(JSON.parse(text), null, 2);
    return shown.length <= PRETTY_GROWTH * text.length + 1024 ? shown : text;
  } catch {
    return text;
  }
}

/** One listed envelope; `text` (shown) and `label` are derived on first use. */
class Entry {
  constructor(raw, fields) {
    Object.assign(this, fields);
    this.raw = raw;
    this.derived = null;
  }

  derive() {
    if (this.derived === null) {
      const raw = this.raw;
      const long = raw.length > MAX_PARSED_CHARS;
      this.derived = {
        text: cut(long ? raw : unwrapWire(raw)),
        label: shortLabel(long ? labelOfLong(raw) : envelopeLabel(raw)),
      };
      this.raw = null; // the uncut text is no longer held
    }
    return this.derived;
  }

  get text() {
    return this.derive().text;
  }

  get label() {
    return this.derive().label;
  }
}

export class Inspector {
  /**
   * @param {HTMLElement} root the inspector section (see index.html ids).
   * @param {(endpointId: string) => string} describeEndpoint label for an endpoint.
   * @param {number} [capacity] ring-buffer size in entries.
   */
  constructor(root, describeEndpoint, capacity = 500) {
    this.root = root;
    this.describeEndpoint = describeEndpoint;
    this.capacity = capacity;
    this.entries = [];
    this.storedChars = 0;
    // Recently closed endpoints: late reports about them are not recorded.
    this.forgotten = new Set();
    this.serial = 0;
    this.pendingIn = new Map();
    this.pendingOut = new Map();
    this.knownEndpoints = new Map();
    this.renderQueued = false;
    Object.assign(this, byIds(root, {
      list: "inspector-list", count: "inspector-count",
      endpointFilter: "inspector-endpoint", directionFilter: "inspector-direction", textFilter: "inspector-text",
    }));
    this.details = root.closest("details");
    // Whether a listener asked for every entry (`ENTRY_EVENT`); asked once.
    this.events = root.ownerDocument ?? null;
    this.announcing =
      this.events !== null &&
      !this.events.dispatchEvent(new CustomEvent(LISTEN_EVENT, { cancelable: true }));
    for (const control of [this.endpointFilter, this.directionFilter]) {
      control.addEventListener("change", () => this.scheduleRender());
    }
    this.textFilter.addEventListener("input", () => this.scheduleRender());
    root.querySelector("#inspector-clear").addEventListener("click", () => this.clear());
    if (this.details) this.details.addEventListener("toggle", () => this.render());
  }

  /**
   * Record an envelope seen by the page.
   *
   * @param {string} endpointId
   * @param {"in"|"out"} direction
   * @param {string} json envelope text (for "in": the wireJson handed to the runtime,
   *   shown unwrapped).
   */
  record(endpointId, direction, json) {
    const entry = this.push(endpointId, direction, json, "page");
    if (this.forgotten.has(endpointId)) return;
    const pendingMap = direction === "in" ? this.pendingIn : this.pendingOut;
    let queue = pendingMap.get(endpointId);
    if (!queue) {
      queue = [];
      pendingMap.set(endpointId, queue);
    }
    queue.push(entry);
    if (queue.length > PENDING_LIMIT) queue.shift();
  }

  /**
   * Record an envelope reported by the runtime (`napllmHost.inspect`).
   * An "in" report joins the oldest page "in" entry not yet joined; an
   * "out" report joins the page entry with the same text.
   */
  recordFromRuntime(endpointId, direction, json) {
    if (direction !== "in" && direction !== "out") {
      this.push(endpointId, "note", json, "runtime");
      return;
    }
    const queue = (direction === "in" ? this.pendingIn : this.pendingOut).get(endpointId);
    json = cut(json);
    if (queue && queue.length > 0) {
      let index = 0;
      if (direction === "out") index = queue.findIndex((entry) => entry.json === json);
      if (index >= 0) {
        const [entry] = queue.splice(index, 1);
        if (entry.json !== json && this.entries.includes(entry)) {
          entry.runtimeJson = json;
          entry.chars += json.length;
          this.storedChars += json.length;
          entry.element = null;
          this.trim();
        }
        this.scheduleRender();
        return;
      }
    }
    this.push(endpointId, direction, json, "runtime");
  }

  /**
   * List one entry (and announce it first, see `ENTRY_EVENT`).
   *
   * @param {string} endpointId
   * @param {"in"|"out"|"note"} direction
   * @param {string} json the envelope text as recorded (uncut).
   * @param {"page"|"runtime"} source
   * @returns {Entry|{json: string}} the entry (a placeholder when the endpoint was forgotten).
   */
  push(endpointId, direction, json, source) {
    this.serial += 1;
    // Announced before the forgotten-endpoint test and before `trim()`, so
    // that neither the bounds nor a closing endpoint can hide an envelope
    // from a listener; only the strings already at hand are passed.
    if (this.announcing) {
      this.events.dispatchEvent(
        new CustomEvent(ENTRY_EVENT, { detail: { serial: this.serial, endpoint: endpointId, direction, text: json } }),
      );
    }
    if (this.forgotten.has(endpointId)) return { json: "" };
    const kept = cut(json);
    // The shown text and the label are worked out when the entry is first
    // listed (the panel open), not on the envelope's path: a closed
    // inspector costs one string per envelope. `chars` counts the shown
    // text at its largest (the unwrapped text is never longer than the wire
    // text, and both are cut to MAX_ENTRY_CHARS).
    const entry = new Entry(json, {
      serial: this.serial,
      time: new Date(),
      endpointId,
      direction,
      json: kept,
      source,
      runtimeJson: null,
      element: null,
      chars: 2 * kept.length,
    });
    // A text that was cut is derived now, so that no uncut text is kept.
    if (kept !== json) entry.derive();
    this.entries.push(entry);
    this.storedChars += entry.chars;
    this.trim();
    if (!this.knownEndpoints.has(endpointId)) {
      this.knownEndpoints.set(endpointId, this.describeEndpoint(endpointId));
      this.renderEndpointOptions();
    }
    this.scheduleRender();
    return entry;
  }

  /** Drop the oldest entries until both bounds hold. */
  trim() {
    let drop = 0;
    let chars = this.storedChars;
    while (
      drop < this.entries.length &&
      (this.entries.length - drop > this.capacity || chars > MAX_STORED_CHARS)
    ) {
      const entry = this.entries[drop];
      chars -= entry.chars;
      // A dropped entry may still wait in an endpoint's pending joins (the
      // runtime reports few envelopes): it must hold no text there, or every
      // endpoint's last PENDING_LIMIT envelopes would stay outside the bound.
      // It is never joined again (`recordFromRuntime` checks `entries`).
      entry.json = null;
      entry.raw = null;
      entry.derived = null;
      entry.runtimeJson = null;
      entry.element = null;
      drop += 1;
    }
    if (drop > 0) {
      this.entries.splice(0, drop);
      this.storedChars = chars;
    }
  }

  /** An endpoint closed: drop its entries, pending joins and filter option. */
  forgetEndpoint(endpointId) {
    const before = this.entries.length;
    this.entries = this.entries.filter((entry) => entry.endpointId !== endpointId);
    if (this.entries.length !== before) this.storedChars = this.entries.reduce((sum, entry) => sum + entry.chars, 0);
    this.pendingIn.delete(endpointId);
    this.pendingOut.delete(endpointId);
    this.forgotten.add(endpointId);
    if (this.forgotten.size > FORGOTTEN_LIMIT) this.forgotten.delete(this.forgotten.values().next().value);
    if (this.knownEndpoints.delete(endpointId)) this.renderEndpointOptions();
    this.scheduleRender();
  }

  /** Forget every entry (the Clear button). */
  clear() {
    this.storedChars = 0;
    this.entries = [];
    this.pendingIn.clear();
    this.pendingOut.clear();
    this.scheduleRender();
  }

  /** Re-read endpoint labels (a tab was renamed, closed or reloaded). */
  refreshEndpoints() {
    for (const id of this.knownEndpoints.keys()) this.knownEndpoints.set(id, this.describeEndpoint(id));
    for (const entry of this.entries) entry.element = null;
    this.renderEndpointOptions();
    this.scheduleRender();
  }

  renderEndpointOptions() {
    const select = this.endpointFilter;
    const current = select.value;
    select.replaceChildren(new Option("All endpoints", ""));
    for (const [id, label] of this.knownEndpoints) select.add(new Option(label, id));
    select.value = [...this.knownEndpoints.keys()].includes(current) ? current : "";
  }

  /** Entries that pass the current filters, oldest first. */
  filtered() {
    const endpoint = this.endpointFilter.value;
    const direction = this.directionFilter.value;
    const text = this.textFilter.value.trim().toLowerCase();
    return this.entries.filter(
      (entry) =>
        (!endpoint || entry.endpointId === endpoint) &&
        (!direction || entry.direction === direction) &&
        (!text ||
          entry.label.toLowerCase().includes(text) ||
          entry.text.toLowerCase().includes(text)),
    );
  }

  scheduleRender() {
    if (this.renderQueued) return;
    this.renderQueued = true;
    const run = () => {
      this.renderQueued = false;
      this.render();
    };
    // While the panel is collapsed only its (hidden) count changes: it is
    // brought up to date a few times a second instead of in every display
    // frame, so a streaming napplet does not make the page draw 60 frames a
    // second for nothing (the toggle renders at once when it opens).
    if (this.details && !this.details.open) setTimeout(run, COLLAPSED_RENDER_MS);
    else requestAnimationFrame(run);
  }

  render() {
    const shown = this.filtered();
    this.count.textContent = `${shown.length} of ${this.entries.length} envelopes`;
    if (this.details && !this.details.open) return;
    const rows = shown.map((entry) => this.renderEntry(entry));
    this.list.replaceChildren(...rows);
  }

  renderEntry(entry) {
    // Rendered rows are reused so that an expanded entry stays expanded.
    if (entry.element) return entry.element;
    const item = document.createElement("li");
    item.className = `inspector-entry dir-${entry.direction}`;
    item.dataset.direction = entry.direction;
    item.dataset.endpoint = entry.endpointId;
    item.dataset.type = entry.label;
    const details = document.createElement("details");
    const summary = document.createElement("summary");
    const time = document.createElement("time");
    time.dateTime = entry.time.toISOString();
    time.textContent = entry.time.toLocaleTimeString([], { hour12: false }) +
      "." + String(entry.time.getMilliseconds()).padStart(3, "0");
    const direction = document.createElement("span");
    direction.className = "badge direction";
    direction.textContent = entry.direction === "in" ? "in ←" : entry.direction === "out" ? "out →" : "note";
    const endpoint = document.createElement("span");
    endpoint.className = "endpoint";
    endpoint.textContent = this.knownEndpoints.get(entry.endpointId) ?? entry.endpointId;
    const type = document.createElement("code");
    type.className = "type";
    type.textContent = entry.label;
    summary.append(time, " ", direction, " ", endpoint, " ", type);
    const body = document.createElement("pre");
    body.textContent = pretty(entry.text);
    details.append(summary, body);
    if (entry.runtimeJson) {
      const heading = document.createElement("p");
      heading.textContent = "As converted by the runtime:";
      const converted = document.createElement("pre");
      converted.textContent = pretty(entry.runtimeJson);
      details.append(heading, converted);
    }
    item.append(details);
    entry.element = item;
    return item;
  }
}
