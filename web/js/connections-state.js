/**
 * What the connections panel knows, apart from how it is shown
 * (docs/design.md, "Connection", "Consent"): the connections and standing
 * grants the runtime last pushed, the connection kinds it published, and
 * the progress of model loads and of scripted connections. No DOM: the
 * views (connection-list.js, connection-form.js) draw it.
 *
 * Rules
 * - The lists are whatever the runtime last sent (JSON text); malformed
 *   text gives an empty list, and entries that are not objects are dropped.
 *   A list never contains a credential, only `hasCredential`.
 * - The connection kinds are the runtime's (napllm.kinds), published once
 *   at start; a kind it did not describe is shown by its name.
 * - Every push bumps a version, so a slower read at attach never overwrites
 *   a newer list (web/shell.js).
 * - A load's progress is kept while its fraction is in [0, 1); 1 (ready) or
 *   a negative one (failed) removes it.
 * - A scripted connection's use is counted per revision: an edit starts the
 *   script again, and its count with it.
 */

import { str } from "./dom.js";
import { parseJsonOr } from "./json.js";

/** The objects of a JSON list text (anything else: an empty list). */
export function parseList(text) {
  return parseJsonOr(text, [], Array.isArray).filter((item) => item && typeof item === "object");
}

/**
 * What a connection can do, in words, from its capability flags
 * (`{images, json, tools}`): "reads images", "JSON output", "calls tools",
 * or ["text only"] when none.
 */
export function canDo(capabilities) {
  const caps = capabilities && typeof capabilities === "object" ? capabilities : {};
  const words = [];
  if (caps.images === true) words.push("reads images");
  if (caps.json === true) words.push("JSON output");
  if (caps.tools === true) words.push("calls tools");
  return words.length > 0 ? words : ["text only"];
}

/**
 * The kind records of `napllmHost.connectionKinds` (JSON text): those with
 * a string `kind` and `label`, keyed by kind. Malformed text gives an empty map.
 */
export function parseKinds(text) {
  const kinds = new Map();
  for (const item of parseList(text)) {
    if (typeof item.kind === "string" && item.kind && typeof item.label === "string") kinds.set(item.kind, item);
  }
  return kinds;
}

/** The model id a GGUF URL implies when none was typed: its file name without `.gguf`. */
export function modelFromGgufUrl(url) {
  try {
    const segments = new URL(url).pathname.split("/").filter(Boolean);
    const file = decodeURIComponent(segments[segments.length - 1] ?? "");
    return file.replace(/\.gguf$/i, "");
  } catch {
    return "";
  }
}

/** Fallback record of a kind the runtime did not describe (or before it did). */
export const UNKNOWN_KIND = Object.freeze({ label: "", summary: "" });

/** A scripted connection's use before any request. */
const NO_USE = Object.freeze({ requests: 0, stopped: 0, nextTurn: 1, turns: 0 });

export class ConnectionsState {
  constructor() {
    /** The runtime's public summaries of the connections. */
    this.connections = [];
    /** The standing grants (`Grant.to_json` records). */
    this.grants = [];
    /** kind -> the runtime's record of it (napllm.kinds); empty until published. */
    this.kinds = new Map();
    /** connection id -> {label, fraction}: model download/load progress of an engine. */
    this.progress = new Map();
    /** connection id -> {revision, requests, stopped, nextTurn, turns}: a scripted connection's use. */
    this.scriptUse = new Map();
    this.connectionsVersion = 0;
    this.grantsVersion = 0;
  }

  /** `napllmHost.connectionsChanged` (JSON text). */
  setConnections(listJson) {
    this.connectionsVersion += 1;
    this.connections = parseList(listJson);
  }

  /** `napllmHost.grantsChanged` (JSON text). */
  setGrants(listJson) {
    this.grantsVersion += 1;
    this.grants = parseList(listJson);
  }

  /** `napllmHost.connectionKinds` (JSON text). */
  setKinds(listJson) {
    this.kinds = parseKinds(listJson);
  }

  /** The runtime's record of `kind`, or a bare one naming it. */
  kindInfo(kind) {
    return this.kinds.get(kind) ?? { ...UNKNOWN_KIND, label: str(kind) };
  }

  /** The connection `id`, or undefined. */
  byId(id) {
    return this.connections.find((c) => str(c.id) === id);
  }

  /**
   * The connections this device can run, then one group per need of those
   * it cannot: `{ready: [item], groups: Map<needs, {how, items}>}`.
   */
  grouped() {
    const ready = this.connections.filter((item) => item.available !== false);
    const groups = new Map();
    for (const item of this.connections) {
      if (item.available !== false) continue;
      const info = this.kindInfo(item.kind);
      const needs = str(info.needs) || "Not available on this device";
      if (!groups.has(needs)) groups.set(needs, { how: str(info.needsHow), items: [] });
      groups.get(needs).items.push(item);
    }
    return { ready, groups };
  }

  /** A load's progress (`napllmHost.engineProgress`); returns the state kept (null: none). */
  setProgress(connectionId, label, fraction) {
    const value = Number.isFinite(fraction) ? fraction : 0;
    if (value >= 1 || value < 0) this.progress.delete(connectionId);
    else this.progress.set(connectionId, { label: str(label), fraction: value });
    return this.progress.get(connectionId) ?? null;
  }

  /**
   * `napllmHost.scriptProgress` (JSON text `{"connectionId", "revision",
   * "requests", "stopped", "nextTurn" (1-based or null), "turns"}`); returns
   * the connection id, or null when the text is not such a record.
   */
  setScriptUse(progressJson) {
    let value = null;
    try {
      value = JSON.parse(String(progressJson));
    } catch {
      return null;
    }
    const count = (n) => (Number.isSafeInteger(n) && n >= 0 ? n : 0);
    if (!value || typeof value !== "object" || typeof value.connectionId !== "string") return null;
    this.scriptUse.set(value.connectionId, {
      revision: count(value.revision),
      requests: count(value.requests),
      stopped: count(value.stopped),
      nextTurn: value.nextTurn === null ? null : count(value.nextTurn),
      turns: count(value.turns),
    });
    return value.connectionId;
  }

  /** The use counted for `item`'s current revision (none yet: no request). */
  scriptUseOf(item) {
    const stored = this.scriptUse.get(str(item.id));
    return stored && stored.revision === item.revision ? stored : NO_USE;
  }
}
