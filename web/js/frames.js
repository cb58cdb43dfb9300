/**
 * Napplet tabs, frames and endpoints (NIP-5D web projection; NAP-LLM, Shell
 * Behavior; DESIGN.md "Endpoint", "Napplet identity").
 *
 * Rules
 * - A napplet is loaded by fetching its HTML bytes; its identity is its
 *   name plus the hex sha256 of exactly those bytes.
 * - The frame is `<iframe sandbox="allow-scripts">` (no other token, no
 *   `allow` attribute) whose `srcdoc` is: the CSP `<meta>` first, then the
 *   prelude `<script>`, then the napplet's text (UTF-8). A `<!doctype html>`
 *   precedes them so the napplet renders in standards mode.
 * - The prelude defines `window.napplet.llm` only while the tab's "LLM
 *   access" is on; otherwise `window.napplet` is an empty frozen object and
 *   no endpoint is opened, so the frame's messages reach nothing.
 * - An endpoint is one loaded document in one frame. It is opened with
 *   `runtime.openEndpoint` before `srcdoc` is set. The shell's Reload and
 *   the LLM toggle build a fresh iframe; a document the napplet navigates to
 *   itself gets a new endpoint too, from the `napllm.documentStart` its
 *   prelude posts before any napplet script (or, for a document without the
 *   prelude, at the frame's next `load` event).
 *   Closing a tab closes its endpoint.
 * - Inbound messages are accepted only when `event.source` is the
 *   `contentWindow` of a live frame created here; anything else, including
 *   the shell's own window, is dropped silently. Until the runtime has
 *   attached (or while an endpoint is being opened) messages are queued per
 *   frame, in order.
 */

import { preludeSource } from "../prelude.js";
import { toWireJson } from "./wire.js";

/** The napplet frame's Content Security Policy (NIP-5D CSP baseline). */
export const NAPPLET_CSP = [
  "default-src 'none'",
  "script-src 'unsafe-inline' 'wasm-unsafe-eval'",
  "style-src 'unsafe-inline'",
  "img-src data: blob:",
  "font-src data:",
  "connect-src 'none'",
  "worker-src 'none'",
  "child-src 'none'",
  "frame-src 'none'",
  "media-src 'none'",
  "object-src 'none'",
  "manifest-src 'none'",
  "base-uri 'none'",
  "form-action 'none'",
].join("; ");

/** Largest napplet document accepted, in bytes. */
export const MAX_NAPPLET_BYTES = 8 * 1024 * 1024;
/** Most messages kept per frame while no endpoint is open yet. */
const MAX_QUEUED_MESSAGES = 1000;
/** Posted by the prelude before any napplet script (see web/prelude.js); never forwarded. */
const DOCUMENT_START = "napllm.documentStart";

/**
 * The srcdoc for a napplet document.
 *
 * @param {string} text the napplet's HTML, decoded as UTF-8.
 * @param {boolean} llm whether the llm domain is granted.
 * @returns {string}
 */
export function buildSrcdoc(text, llm) {
  return (
    "<!doctype html>" +
    `<meta http-equiv="Content-Security-Policy" content="${NAPPLET_CSP}">` +
    `<script>${preludeSource(llm ? ["llm"] : [])}</script>` +
    text
  );
}

/** Hex sha256 of `bytes` (an ArrayBuffer). */
export async function sha256Hex(bytes) {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * The napplet name for a URL opened directly: its last path segment
 * (the folder name when the file is an index page).
 */
export function nameFromUrl(url) {
  const segments = new URL(url).pathname.split("/").filter((s) => s.length > 0).map((s) => {
    try {
      return decodeURIComponent(s);
    } catch {
      return s;
    }
  });
  if (segments.length === 0) return new URL(url).host || "napplet";
  const last = segments[segments.length - 1];
  if (/^index\.html?$/i.test(last) && segments.length > 1) return segments[segments.length - 2];
  return last;
}

/** Whether `url` (absolute) uses http or https. */
export function isHttpUrl(url) {
  try {
    const { protocol } = new URL(url);
    return protocol === "http:" || protocol === "https:";
  } catch {
    return false;
  }
}

let tabSerial = 0;

export class NappletArea {
  /**
   * @param {object} parts
   * @param {HTMLElement} parts.tablist the role=tablist element.
   * @param {HTMLElement} parts.panels container of the tab panels.
   * @param {HTMLElement} parts.empty placeholder shown when no tab is open.
   * @param {() => object|null} parts.runtime the attached runtime API or null.
   * @param {import('./inspector.js').Inspector} parts.inspector
   * @param {(level: string, text: string) => void} parts.notify shell notices.
   */
  constructor({ tablist, panels, empty, runtime, inspector, notify }) {
    this.tablist = tablist;
    this.panels = panels;
    this.empty = empty;
    this.runtime = runtime;
    this.inspector = inspector;
    this.notify = notify;
    this.tabs = [];
    this.byWindow = new Map();
    this.byEndpoint = new Map();
    this.tablist.addEventListener("keydown", (event) => this.onTablistKey(event));
    this.updateEmpty();
  }

  /** The live endpoint ids and their tab, for the inspector's labels. */
  describeEndpoint(endpointId) {
    const record = this.byEndpoint.get(endpointId);
    if (record) return `${record.tab.title} · ${endpointId}`;
    return `${endpointId} (closed)`;
  }

  /**
   * Fetch a napplet and open it in a new tab.
   *
   * @param {{url: string, name: string, title?: string}} source
   * @returns {Promise<object|null>} the tab, or null when loading failed.
   */
  async open({ url, name, title }) {
    const absolute = new URL(url, location.href).href;
    if (!isHttpUrl(absolute)) {
      this.notify("error", "Only http and https napplet URLs can be opened.");
      return null;
    }
    tabSerial += 1;
    const tab = {
      key: `tab-${tabSerial}`,
      url: absolute,
      name,
      title: title || name,
      llm: true,
      sha256: "",
      text: "",
      record: null,
    };
    this.buildTab(tab);
    this.tabs.push(tab);
    this.select(tab);
    this.updateEmpty();
    const loaded = await this.fetchNapplet(tab);
    if (!loaded) return tab;
    await this.loadFrame(tab);
    return tab;
  }

  async fetchNapplet(tab) {
    tab.status.textContent = "Loading…";
    let bytes;
    try {
      const response = await fetch(tab.url, { cache: "no-store", credentials: "same-origin" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      bytes = await response.arrayBuffer();
    } catch (err) {
      tab.status.textContent = "Could not load this napplet.";
      this.notify("error", `Could not load napplet “${tab.name}” (${err && err.message ? err.message : "network error"}).`);
      return false;
    }
    if (bytes.byteLength > MAX_NAPPLET_BYTES) {
      tab.status.textContent = "This napplet is too large.";
      this.notify("error", `Napplet “${tab.name}” is larger than ${MAX_NAPPLET_BYTES / 1048576} MiB.`);
      return false;
    }
    tab.sha256 = await sha256Hex(bytes);
    tab.text = new TextDecoder("utf-8").decode(bytes);
    tab.identity.textContent = `${tab.name} · #${tab.sha256.slice(0, 12)}`;
    tab.identity.title = `sha256 ${tab.sha256}`;
    tab.status.textContent = "";
    return true;
  }

  buildTab(tab) {
    const tabButton = document.createElement("button");
    tabButton.type = "button";
    tabButton.id = `${tab.key}-tab`;
    tabButton.className = "tab";
    tabButton.setAttribute("role", "tab");
    tabButton.setAttribute("aria-controls", `${tab.key}-panel`);
    tabButton.setAttribute("aria-selected", "false");
    tabButton.tabIndex = -1;
    tabButton.dataset.napplet = tab.name;
    tabButton.textContent = tab.title;
    tabButton.addEventListener("click", () => this.select(tab));

    const panel = document.createElement("section");
    panel.id = `${tab.key}-panel`;
    panel.className = "tabpanel";
    panel.setAttribute("role", "tabpanel");
    panel.setAttribute("aria-labelledby", tabButton.id);
    panel.dataset.napplet = tab.name;
    panel.hidden = true;

    const toolbar = document.createElement("div");
    toolbar.className = "tab-toolbar";
    const identity = document.createElement("span");
    identity.className = "identity";
    identity.textContent = tab.name;
    const status = document.createElement("span");
    status.className = "tab-status";
    status.setAttribute("role", "status");

    const toggleId = `${tab.key}-llm`;
    const toggle = document.createElement("input");
    toggle.type = "checkbox";
    toggle.id = toggleId;
    toggle.className = "llm-toggle";
    toggle.checked = tab.llm;
    toggle.setAttribute("role", "switch");
    toggle.addEventListener("change", () => {
      tab.llm = toggle.checked;
      if (tab.text) this.loadFrame(tab);
    });
    const toggleLabel = document.createElement("label");
    toggleLabel.htmlFor = toggleId;
    toggleLabel.textContent = "LLM access";
    const toggleWrap = document.createElement("span");
    toggleWrap.className = "toggle";
    toggleWrap.append(toggle, toggleLabel);

    const reload = document.createElement("button");
    reload.type = "button";
    reload.className = "reload";
    reload.textContent = "Reload";
    reload.setAttribute("aria-label", `Reload ${tab.title}`);
    reload.addEventListener("click", () => this.reload(tab));
    const close = document.createElement("button");
    close.type = "button";
    close.className = "close";
    close.textContent = "Close";
    close.setAttribute("aria-label", `Close ${tab.title}`);
    close.addEventListener("click", () => this.close(tab));

    toolbar.append(identity, status, toggleWrap, reload, close);
    const holder = document.createElement("div");
    holder.className = "frame-holder";
    panel.append(toolbar, holder);

    this.tablist.append(tabButton);
    this.panels.append(panel);
    Object.assign(tab, { tabButton, panel, holder, identity, status, toggle });
  }

  /** Make `tab` the visible one. */
  select(tab, focus = false) {
    for (const other of this.tabs) {
      const selected = other === tab;
      other.tabButton.setAttribute("aria-selected", String(selected));
      other.tabButton.tabIndex = selected ? 0 : -1;
      other.panel.hidden = !selected;
    }
    if (focus) tab.tabButton.focus();
  }

  onTablistKey(event) {
    const index = this.tabs.findIndex((tab) => tab.tabButton === document.activeElement);
    if (index < 0) return;
    let next = null;
    if (event.key === "ArrowRight") next = (index + 1) % this.tabs.length;
    else if (event.key === "ArrowLeft") next = (index - 1 + this.tabs.length) % this.tabs.length;
    else if (event.key === "Home") next = 0;
    else if (event.key === "End") next = this.tabs.length - 1;
    if (next === null) return;
    event.preventDefault();
    this.select(this.tabs[next], true);
  }

  /** Fetch the napplet again (its bytes may have changed) and load a fresh frame. */
  async reload(tab) {
    if (!this.tabs.includes(tab)) return;
    const loaded = await this.fetchNapplet(tab);
    if (loaded && this.tabs.includes(tab)) await this.loadFrame(tab);
  }

  /** Close a tab: its endpoint is closed and its frame removed. */
  close(tab) {
    const index = this.tabs.indexOf(tab);
    if (index < 0) return;
    if (tab.record) this.retire(tab.record);
    tab.record = null;
    this.tabs.splice(index, 1);
    const wasSelected = tab.tabButton.getAttribute("aria-selected") === "true";
    tab.tabButton.remove();
    tab.panel.remove();
    if (wasSelected && this.tabs.length > 0) this.select(this.tabs[Math.min(index, this.tabs.length - 1)], true);
    this.updateEmpty();
    this.inspector.refreshEndpoints();
  }

  updateEmpty() {
    this.empty.hidden = this.tabs.length > 0;
  }

  /** Replace the tab's frame with a fresh one holding the current bytes. */
  async loadFrame(tab) {
    if (tab.record) this.retire(tab.record);
    const iframe = document.createElement("iframe");
    iframe.setAttribute("sandbox", "allow-scripts");
    iframe.setAttribute("referrerpolicy", "no-referrer");
    iframe.className = "napplet-frame";
    iframe.title = `Napplet: ${tab.title}`;
    tab.holder.replaceChildren(iframe);
    const record = {
      tab,
      iframe,
      window: iframe.contentWindow,
      llm: tab.llm,
      endpointId: null,
      opening: false,
      queue: [],
      loads: 0,
      starts: 0,
      announced: false,
      live: true,
    };
    tab.record = record;
    this.byWindow.set(record.window, record);
    iframe.addEventListener("load", () => this.onFrameLoad(record));
    if (record.llm && this.runtime()) await this.openEndpoint(record);
    if (!record.live) return;
    iframe.srcdoc = buildSrcdoc(tab.text, record.llm);
  }

  onFrameLoad(record) {
    if (!record.live) return;
    record.loads += 1;
    const announced = record.announced;
    record.announced = false;
    // The first document, and any document that announced itself (and got
    // its endpoint then), are done; a later document without the prelude
    // gets a new endpoint here.
    if (record.loads === 1 || announced) return;
    this.newDocument(record);
  }

  /** The napplet navigated its own frame: a new document is a new endpoint. */
  newDocument(record) {
    const old = record.endpointId;
    record.endpointId = null;
    record.queue = [];
    if (old !== null) {
      this.byEndpoint.delete(old);
      this.callRuntime("closeEndpoint", old);
    }
    if (record.llm && this.runtime()) this.openEndpoint(record);
    this.inspector.refreshEndpoints();
  }

  /** Open the runtime endpoint for a frame, then deliver its queued messages. */
  async openEndpoint(record) {
    const runtime = this.runtime();
    if (!runtime || !record.live || !record.llm || record.opening || record.endpointId !== null) return;
    record.opening = true;
    const identity = JSON.stringify({ name: record.tab.name, sha256: record.tab.sha256, domains: ["llm"] });
    let endpointId;
    try {
      endpointId = await runtime.openEndpoint(identity);
    } catch (err) {
      record.opening = false;
      console.error("napllm: openEndpoint failed", err);
      this.notify("error", `The runtime could not open napplet “${record.tab.name}”.`);
      return;
    }
    record.opening = false;
    endpointId = String(endpointId);
    if (!record.live) {
      this.callRuntime("closeEndpoint", endpointId);
      return;
    }
    record.endpointId = endpointId;
    this.byEndpoint.set(endpointId, record);
    this.inspector.refreshEndpoints();
    const queued = record.queue;
    record.queue = [];
    for (const wire of queued) this.deliver(record, wire);
  }

  /** The runtime has attached: open endpoints for frames already loaded. */
  async runtimeAttached() {
    for (const tab of this.tabs) {
      if (tab.record) await this.openEndpoint(tab.record);
    }
  }

  retire(record) {
    record.live = false;
    this.byWindow.delete(record.window);
    if (record.endpointId !== null) {
      this.byEndpoint.delete(record.endpointId);
      this.callRuntime("closeEndpoint", record.endpointId);
      record.endpointId = null;
    }
    record.queue = [];
    record.iframe.remove();
  }

  callRuntime(method, ...args) {
    const runtime = this.runtime();
    if (!runtime) return undefined;
    try {
      const result = runtime[method](...args);
      if (result && typeof result.then === "function") {
        result.then(undefined, (err) => console.error(`napllm: ${method} failed`, err));
      }
      return result;
    } catch (err) {
      console.error(`napllm: ${method} failed`, err);
      return undefined;
    }
  }

  /**
   * The window `message` listener: accept only live frames created here.
   *
   * @param {MessageEvent} event
   */
  onMessage(event) {
    const source = event.source;
    if (!source || source === window) return;
    const record = this.byWindow.get(source);
    if (!record || !record.live || !record.llm) return;
    const data = event.data;
    if (data && typeof data === "object" && data.type === DOCUMENT_START && Object.keys(data).length === 1) {
      // A document of this frame starts (its prelude says so before any of
      // its scripts run): every document after the first is a new endpoint.
      record.starts += 1;
      record.announced = true;
      if (record.starts > 1) this.newDocument(record);
      return;
    }
    const wire = toWireJson(event.data);
    if (record.endpointId === null) {
      if (record.queue.length < MAX_QUEUED_MESSAGES) record.queue.push(wire);
      return;
    }
    this.deliver(record, wire);
  }

  deliver(record, wire) {
    this.inspector.record(record.endpointId, "in", wire);
    this.callRuntime("receive", record.endpointId, wire);
  }

  /**
   * `napllmHost.post`: deliver an envelope to an endpoint's frame.
   *
   * @param {string} endpointId
   * @param {string} envelopeJson
   */
  post(endpointId, envelopeJson) {
    const record = this.byEndpoint.get(String(endpointId));
    if (!record || !record.live) return;
    let envelope;
    try {
      envelope = JSON.parse(envelopeJson);
    } catch {
      console.error("napllm: the runtime posted an envelope that is not JSON");
      return;
    }
    this.inspector.record(record.endpointId, "out", String(envelopeJson));
    record.window.postMessage(envelope, "*");
  }
}
