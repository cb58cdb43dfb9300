/**
 * Napplet tabs, frames and endpoints (NIP-5D web projection; NAP-LLM, Shell
 * Behavior; docs/design.md, "Endpoint", "Napplet identity").
 *
 * Rules
 * - A napplet is loaded by fetching its HTML bytes; its identity is its
 *   name plus the hex sha256 of exactly those bytes.
 * - The frame is `<iframe sandbox="allow-scripts">` (no other token, no
 *   `allow` attribute) whose `srcdoc` is: the CSP `<meta>` first, then the
 *   prelude `<script>` (and the Prompt API layer's, see below), then the
 *   napplet's text (UTF-8). A `<!doctype html>`
 *   precedes them so the napplet renders in standards mode.
 * - A napplet whose page has `<meta name="napplet-prompt-api">` (read with
 *   DOMParser, `promptApiMode`) gets one more inline script right after the
 *   prelude: the Prompt API layer (web/prompt-api.js, bundled by build.py
 *   into js/prompt-api-source.js), which removes its own element and defines
 *   `LanguageModel` over `window.napplet.llm`. Without the element the srcdoc
 *   is exactly as before.
 * - The prelude defines `window.napplet.llm` only while the tab's "LLM
 *   access" is on; otherwise `window.napplet` is an empty frozen object and
 *   no endpoint is opened, so the frame's messages reach nothing.
 * - Binding (web/prelude.js): each frame built here gets a fresh secret in
 *   its prelude. The prelude posts `{type: "napllm.documentStart", secret}`
 *   with two transferred `MessagePort`s; only such a start, from the frame's
 *   own window and with that secret, binds a document: it opens an endpoint,
 *   and its first port carries every envelope *to* the document (so no reply
 *   can reach any other document of the frame). A document the napplet
 *   navigates to has no prelude, so it is never bound; a napplet reloading
 *   itself runs the prelude again and gets a new endpoint (the previous one
 *   is closed: its generations end, its handles expire).
 * - Envelopes *from* the document come two ways: over the port (the
 *   prelude's `window.napplet.llm`, and raw envelopes the napplet posts to
 *   its own window), and posted to this window (`window.parent.postMessage`,
 *   the NIP-5D web projection's transport). A message posted here carries
 *   only its frame's `WindowProxy` as `source`, which is the same for every
 *   document the frame ever shows, so it is attributed to the document bound
 *   when it arrives and held until that document *confirms* it: the shell
 *   sends a ping on the document's control port after the message arrived,
 *   and releases the message only when the prelude of that document answers.
 *   An answer proves the bound document was alive after the message was
 *   sent; a frame's documents live one after another (the shell page's
 *   `frame-src 'none'` keeps them all in one renderer process, where a
 *   document is destroyed before its successor runs a script), so the
 *   message was that document's own. A document that was replaced never
 *   answers, and what was held for it is dropped when the shell learns of
 *   the change (the next start, or the unreported load below). The messages
 *   of one transport keep their order; the two transports are not ordered
 *   with respect to each other. At most `MAX_UNCONFIRMED_MESSAGES` /
 *   `MAX_QUEUED_CHARS` wait per document, one ping is in flight at a time.
 *   Messages from a frame with no bound document or with LLM access off are
 *   dropped without their data being read; one carrying ports is read only
 *   when it has two, as a possible start.
 * - Each `load` of a frame must be matched by the load report a started
 *   document's prelude sends on its second (control) port, within
 *   `START_GRACE_MS` and in either order (then the bound document is asked
 *   once more, for a page too busy to report in time). A load nobody
 *   reports is either
 *   the first document (the prelude could not run: the page's Content
 *   Security Policy is named) or a document the napplet navigated to: its
 *   endpoint is closed, the tab's standing grants are revoked, the frame is
 *   removed and the tab says why. This only informs and cleans up: such a
 *   document never had a port, so it never reached the runtime.
 * - Bounded work: a frame may start at most `MAX_STARTS` documents per
 *   `RATE_WINDOW_MS`, and its documents together send at most
 *   `FLOOD_MAX_CHARS` / `FLOOD_MAX_MESSAGES` per window; past either it is stopped with a
 *   notice (other napplets are unaffected). Messages waiting for an
 *   endpoint are capped in count and bytes. Closed endpoints are removed
 *   from every map here and from the inspector.
 * - A napplet opened from a URL carries its origin: the tab, the inspector
 *   and the runtime's dialogs show it. Names are sanitised
 *   (`sanitiseName`). A napplet opened by a link (`?napplet=`) starts with
 *   LLM access off; the user turns it on in the tab.
 */

import { limitResponse } from "../engines/bounded.js";
import { preludeSource } from "../prelude.js";
import { el } from "./dom.js";
import { PROMPT_API_SOURCE } from "./prompt-api-source.js";
import { MAX_WIRE_CHARS, toWireJson } from "./wire.js";

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

/**
 * Largest napplet document accepted, in bytes. The download stops there:
 * a host that answers without a length, or keeps sending, is cut off
 * (engines/bounded.js `limitResponse`), never read to its end first.
 */
export const MAX_NAPPLET_BYTES = 8 * 1024 * 1024;
/** Most messages kept per document while its endpoint is being opened. */
export const MAX_QUEUED_MESSAGES = 256;
/** Most UTF-16 code units of wire text kept per document while its endpoint is being opened
 * (and, separately, while messages posted to the shell's window wait for their confirmation). */
export const MAX_QUEUED_CHARS = 8 * 1024 * 1024;
/** Most messages posted to the shell's window kept per document while they wait for its
 * prelude's confirmation (one round trip on the control port). */
export const MAX_UNCONFIRMED_MESSAGES = 1024;
/** The window over which starts and traffic are counted, in ms. */
export const RATE_WINDOW_MS = 10_000;
/** How long a frame's load may wait for its prelude's own report, in ms. */
export const START_GRACE_MS = 2000;
/** Most documents one frame may start per window (a napplet reloading itself). */
export const MAX_STARTS = 20;
/** Most UTF-16 code units of envelopes one frame may send per window. */
export const FLOOD_MAX_CHARS = 64 * 1024 * 1024;
/** Most envelopes one frame may send per window. */
export const FLOOD_MAX_MESSAGES = 4000;
/** Longest napplet name shown, in code points. */
export const MAX_NAME_LENGTH = 40;
/** Posted by the prelude before any napplet script (see web/prelude.js); never forwarded. */
const DOCUMENT_START = "napllm.documentStart";
/** What the tab says when its frame left the sandboxed page. */
export const LEFT_SANDBOX = "This napplet left its sandboxed page; its model access was closed.";

/** The `<meta name>` by which a napplet asks for the Prompt API layer (docs/napplets.md). */
export const PROMPT_API_META = "napplet-prompt-api";

/**
 * Whether a napplet's page opts in to the Prompt API layer, and how: the
 * `content` of its first `<meta name="napplet-prompt-api">` ("" when it has
 * none), or null when there is no such element. Read with the page's own
 * HTML parser (DOMParser: no script runs, nothing loads), so a comment or a
 * string that merely contains the text does not count.
 *
 * @param {string} text the napplet's HTML.
 * @returns {string | null}
 */
export function promptApiMode(text) {
  const doc = new DOMParser().parseFromString(text, "text/html");
  const meta = doc.querySelector(`meta[name="${PROMPT_API_META}" i]`);
  return meta ? (meta.getAttribute("content") || "").trim() : null;
}

/**
 * The Prompt API layer (web/prompt-api.js, bundled by build.py) as inline
 * script text: it removes its own element, then installs `LanguageModel`
 * per `mode`.
 *
 * @param {string} mode the opt-in's content (see `promptApiMode`).
 * @returns {string}
 */
export function promptApiScript(mode) {
  // Only the known token reaches the script text: the napplet's `content`
  // could otherwise end the inline script early ("</script>").
  const known = mode === "NappletLanguageModel" ? mode : "";
  return (
    "(() => { const own = document.currentScript; if (own) own.remove();\n" +
    PROMPT_API_SOURCE +
    "\nnapllmPromptApi.installPromptApi(window, " + JSON.stringify(known) + "); })();"
  );
}

/**
 * The srcdoc for a napplet document.
 *
 * @param {string} text the napplet's HTML, decoded as UTF-8.
 * @param {boolean} llm whether the llm domain is granted.
 * @param {string} secret the frame's secret (`newSecret()`).
 * @param {string | null} [promptApi] the napplet's Prompt API opt-in
 *   (`promptApiMode`); null or omitted: no layer.
 * @returns {string}
 */
export function buildSrcdoc(text, llm, secret, promptApi = null) {
  return (
    "<!doctype html>" +
    `<meta http-equiv="Content-Security-Policy" content="${NAPPLET_CSP}">` +
    `<script>${preludeSource(llm ? ["llm"] : [], secret)}</script>` +
    (promptApi === null ? "" : `<script>${promptApiScript(promptApi)}</script>`) +
    text
  );
}

/** 128 random bits as 32 hex digits: a frame's secret. */
export function newSecret() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// Bidi controls, other format characters, controls, separators and
// private-use code points never appear in a shown name.
const HIDDEN_CHARS = /[\p{Cc}\p{Cf}\p{Co}\p{Cs}\p{Zl}\p{Zp}\u034f\u115f\u1160\u3164\uffa0]/gu;
// Words that would make a napplet look like part of the shell.
const TRUST_WORDS = /\b(?:built[\s_-]*in|builtin|official|verified|trusted|system|napllm|shell)\b/giu;

/**
 * The name a napplet is shown under: NFKC-normalised, without invisible or
 * direction-changing characters, brackets, "#" or words claiming the shell's
 * trust ("built-in", "official"...), whitespace collapsed, at most
 * `MAX_NAME_LENGTH` code points; "napplet" when nothing is left.
 *
 * @param {unknown} raw
 * @returns {string}
 */
export function sanitiseName(raw) {
  let name = typeof raw === "string" ? raw : "";
  name = name.slice(0, 4 * MAX_NAME_LENGTH).normalize("NFKC");
  name = name.replace(HIDDEN_CHARS, "").replace(/[()[\]{}<>#·|"“”]/gu, " ");
  for (let i = 0; i < 3; i += 1) name = name.replace(TRUST_WORDS, " ");
  name = name.replace(/\s+/gu, " ").trim();
  const points = Array.from(name);
  if (points.length > MAX_NAME_LENGTH) name = points.slice(0, MAX_NAME_LENGTH - 1).join("").trimEnd() + "…";
  return name || "napplet";
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
  if (segments.length === 0) return sanitiseName(new URL(url).host);
  const last = segments[segments.length - 1];
  if (/^index\.html?$/i.test(last) && segments.length > 1) return sanitiseName(segments[segments.length - 2]);
  return sanitiseName(last);
}

/** The origin a napplet URL is shown with ("http://127.0.0.1:8000"). */
export function originOf(url) {
  try {
    return new URL(url).origin;
  } catch {
    return "";
  }
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


/** Drop timestamps older than the rate window from `times` (ms, ascending). */
function prune(times, now) {
  let drop = 0;
  while (drop < times.length && now - times[drop] > RATE_WINDOW_MS) drop += 1;
  if (drop > 0) times.splice(0, drop);
}

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
    // Numbers the tabs of this area (their keys `tab-N`, never reused).
    this.tabSerial = 0;
    // contentWindow -> frame record (the frames built here, while live).
    this.byWindow = new Map();
    // endpoint id -> document (open endpoints only).
    this.byEndpoint = new Map();
    this.tablist.addEventListener("keydown", (event) => this.onTablistKey(event));
    this.updateEmpty();
  }

  /** The tab whose current document holds endpoint `endpointId`, or null. */
  tabOfEndpoint(endpointId) {
    const doc = this.byEndpoint.get(String(endpointId));
    return doc ? doc.record.tab : null;
  }

  /** The label of an endpoint for the inspector: tab title, origin and id. */
  describeEndpoint(endpointId) {
    const doc = this.byEndpoint.get(endpointId);
    if (doc) return `${this.tabLabel(doc.record.tab)} · ${endpointId}`;
    return `${endpointId} (closed)`;
  }

  /** "title" for listed napplets, "title (origin)" for napplets from a URL. */
  tabLabel(tab) {
    return tab.origin ? `${tab.title} (${tab.origin})` : tab.title;
  }

  /**
   * Fetch a napplet and open it in a new tab.
   *
   * @param {{url: string, name: string, title?: string, fromUrl?: boolean, llm?: boolean}} source
   *   `fromUrl`: opened by URL rather than from the shell's list (its origin is
   *   shown); `llm`: the initial state of "LLM access" (default on).
   * @returns {Promise<object|null>} the tab, or null when loading failed.
   */
  async open({ url, name, title, fromUrl = false, llm = true }) {
    const absolute = new URL(url, location.href).href;
    if (!isHttpUrl(absolute)) {
      this.notify("error", "Only http and https napplet URLs can be opened.");
      return null;
    }
    this.tabSerial += 1;
    const clean = sanitiseName(name);
    const tab = {
      key: `tab-${this.tabSerial}`,
      url: absolute,
      name: clean,
      title: title ? sanitiseName(title) : clean,
      origin: fromUrl ? originOf(absolute) : "",
      llm: llm !== false,
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
    if (!tab.llm) tab.status.textContent = "LLM access is off: turn it on to let this napplet ask for models.";
    this.loadFrame(tab);
    return tab;
  }

  async fetchNapplet(tab) {
    tab.status.textContent = "Loading…";
    let bytes;
    let tooLarge = false;
    try {
      const response = await fetch(tab.url, { cache: "no-store", credentials: "same-origin" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const bounded = limitResponse(response, MAX_NAPPLET_BYTES, () => {
        tooLarge = true;
      });
      bytes = await bounded.arrayBuffer();
    } catch (err) {
      if (!tooLarge) {
        tab.status.textContent = "Could not load this napplet.";
        const why = err && /^HTTP \d{3}$/.test(err.message) ? err.message : "network error";
        this.notify("error", `Could not load napplet “${tab.name}” (${why}).`);
        return false;
      }
    }
    if (tooLarge || bytes.byteLength > MAX_NAPPLET_BYTES) {
      tab.status.textContent = "This napplet is too large.";
      this.notify("error", `Napplet “${tab.name}” is larger than ${MAX_NAPPLET_BYTES / 1048576} MiB.`);
      return false;
    }
    const text = new TextDecoder("utf-8").decode(bytes);
    // A declarative shadow root may be closed: frames inside it could not be
    // removed by the prelude (see web/prelude.js), so such napplets do not run.
    if (/shadowrootmode/i.test(text)) {
      tab.status.textContent = "This napplet uses declarative shadow roots, which napplets cannot use.";
      this.notify("error", `Napplet “${tab.name}” uses declarative shadow roots (shadowrootmode), which napplets cannot use.`);
      return false;
    }
    tab.sha256 = await sha256Hex(bytes);
    tab.text = text;
    tab.promptApi = promptApiMode(text);
    tab.identity.textContent = `${tab.name} · #${tab.sha256.slice(0, 12)}` + (tab.origin ? ` · from ${tab.origin}` : "");
    tab.identity.title = `sha256 ${tab.sha256}` + (tab.origin ? `\nloaded from ${tab.url}` : "");
    tab.status.textContent = "";
    return true;
  }

  /** Create the tab's button and panel (toolbar and frame holder) and add them to the page. */
  buildTab(tab) {
    const label = this.tabLabel(tab);
    const tabButton = el(
      "button",
      {
        type: "button",
        id: `${tab.key}-tab`,
        class: "tab",
        role: "tab",
        "aria-controls": `${tab.key}-panel`,
        "aria-selected": "false",
        tabIndex: -1,
        dataset: tab.origin ? { napplet: tab.name, origin: tab.origin } : { napplet: tab.name },
      },
      tab.title,
      tab.origin ? el("span", { class: "tab-origin" }, ` (${tab.origin})`) : null,
    );
    tabButton.addEventListener("click", () => this.select(tab));

    const identity = el("span", { class: "identity" }, tab.origin ? `${tab.name} · from ${tab.origin}` : tab.name);
    const status = el("span", { class: "tab-status", role: "status" });
    const toggleId = `${tab.key}-llm`;
    const toggle = el("input", { type: "checkbox", id: toggleId, class: "llm-toggle", checked: tab.llm, role: "switch" });
    toggle.addEventListener("change", () => {
      tab.llm = toggle.checked;
      if (tab.text) {
        tab.status.textContent = "";
        this.loadFrame(tab);
      }
    });
    const reload = el("button", { type: "button", class: "reload", "aria-label": `Reload ${label}` }, "Reload");
    reload.addEventListener("click", () => this.reload(tab));
    const close = el("button", { type: "button", class: "close", "aria-label": `Close ${label}` }, "Close");
    close.addEventListener("click", () => this.close(tab));

    const toolbar = el(
      "div",
      { class: "tab-toolbar" },
      identity,
      status,
      el("span", { class: "toggle" }, toggle, el("label", { for: toggleId }, "LLM access")),
      reload,
      close,
    );
    const holder = el("div", { class: "frame-holder" });
    const panel = el(
      "section",
      {
        id: `${tab.key}-panel`,
        class: "tabpanel",
        role: "tabpanel",
        "aria-labelledby": tabButton.id,
        dataset: { napplet: tab.name },
        hidden: true,
      },
      toolbar,
      holder,
    );

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
    if (loaded && this.tabs.includes(tab)) this.loadFrame(tab);
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
    const hadFocus = !document.activeElement || document.activeElement === document.body || !document.activeElement.isConnected;
    if (wasSelected && this.tabs.length > 0) this.select(this.tabs[Math.min(index, this.tabs.length - 1)], true);
    this.updateEmpty();
    // The last tab closed from its own toolbar: the focus goes to the napplet
    // area (its heading), not to <body>.
    if (this.tabs.length === 0 && hadFocus) this.tablist.closest("[tabindex]")?.focus();
    this.inspector.refreshEndpoints();
  }

  updateEmpty() {
    this.empty.hidden = this.tabs.length > 0;
    // An empty tablist is an ARIA error (a tablist needs tabs): hidden until one opens.
    this.tablist.hidden = this.tabs.length === 0;
  }

  /** Replace the tab's frame with a fresh one (a new secret) holding the current bytes. */
  loadFrame(tab) {
    if (tab.record) this.retire(tab.record);
    const iframe = document.createElement("iframe");
    iframe.setAttribute("sandbox", "allow-scripts");
    iframe.setAttribute("referrerpolicy", "no-referrer");
    iframe.className = "napplet-frame";
    iframe.title = `Napplet: ${this.tabLabel(tab)}`;
    const secret = newSecret();
    // srcdoc is set before insertion: the frame's first navigation is to the
    // srcdoc (no initial about:blank load event to tell apart).
    iframe.srcdoc = buildSrcdoc(tab.text, tab.llm, secret, tab.promptApi);
    tab.holder.replaceChildren(iframe);
    const record = {
      tab,
      iframe,
      window: iframe.contentWindow,
      llm: tab.llm,
      secret,
      // The document bound to the frame now: {record, port, endpointId, ...} or null.
      doc: null,
      loads: 0,
      starts: 0,
      reports: 0,
      startTimes: [],
      // Traffic of all the frame's documents (a reload does not reset it).
      times: [],
      chars: [],
      charTotal: 0,
      live: true,
    };
    tab.record = record;
    this.byWindow.set(record.window, record);
    iframe.addEventListener("load", () => this.onFrameLoad(record));
  }

  /**
   * A document of the frame finished loading. Its prelude reports the same
   * load on the document's control port; a load that no started document
   * reports within `START_GRACE_MS` is a document the shell did not make
   * (the order of the two reports does not matter).
   */
  onFrameLoad(record) {
    if (!record.live) return;
    record.loads += 1;
    const loads = record.loads;
    setTimeout(() => this.checkLoad(record, loads), START_GRACE_MS);
  }

  checkLoad(record, loads) {
    if (!record.live || record.reports >= loads) return;
    if (loads === 1 && record.starts === 0) {
      this.preludeDidNotStart(record);
      return;
    }
    // A busy page may have delayed the report: ask the document bound now.
    // Only one document of a frame is alive, so if it answers, the load was
    // its own; a document that was navigated away never answers.
    const doc = record.doc;
    if (doc && doc.live) {
      const ping = this.sendPing(doc);
      setTimeout(() => {
        if (!record.live || record.reports >= loads) return;
        if (doc.live && doc.pongs >= ping) {
          record.reports = Math.max(record.reports, loads);
          return;
        }
        this.leftSandbox(record);
      }, START_GRACE_MS);
      return;
    }
    this.leftSandbox(record);
  }

  /** The frame now shows a document that did not start from the shell's srcdoc. */
  leftSandbox(record) {
    const { tab } = record;
    this.stop(record, LEFT_SANDBOX, "warning");
    this.revokeGrants(tab);
  }

  /** The first document's prelude never ran: almost always the page's own CSP. */
  async preludeDidNotStart(record) {
    const { tab } = record;
    const policy = await pageCsp();
    if (!record.live) return;
    const text = policy
      ? `Napplet “${tab.name}” could not start: this page's Content-Security-Policy (${policy}) blocks the napplet's inline scripts. The deploy section of the README lists a policy that works.`
      : `Napplet “${tab.name}” could not start: its sandboxed page did not run the shell's prelude (a Content-Security-Policy of this page may block inline scripts).`;
    this.stop(record, text, "error");
  }

  /** Revoke the standing grants of `tab`'s napplet identity (name + sha256). */
  async revokeGrants(tab) {
    const runtime = this.runtime();
    if (!runtime || !tab.sha256) return;
    try {
      const list = JSON.parse(String(await runtime.listGrants()));
      for (const grant of Array.isArray(list) ? list : []) {
        const napplet = grant && typeof grant.napplet === "object" && grant.napplet ? grant.napplet : {};
        if (napplet.name === tab.name && napplet.shortHash === tab.sha256.slice(0, 12) && typeof grant.key === "string") {
          await runtime.revokeGrant(grant.key);
        }
      }
    } catch (err) {
      console.error("napllm: revoking the napplet's grants failed", err);
    }
  }

  /** Stop a frame for good: endpoint closed, frame removed, the tab says why. */
  stop(record, text, level) {
    if (!record.live) return;
    const { tab } = record;
    this.retire(record);
    if (tab.record === record) tab.record = null;
    tab.holder.replaceChildren(el("p", { class: `frame-stopped ${level}`, role: "alert" }, text));
    tab.status.textContent = "Stopped. Reload to start it again.";
    this.notify(level, text);
    this.inspector.refreshEndpoints();
  }

  /**
   * A valid `napllm.documentStart`: bind the new document to `port` (its
   * envelopes) and `control` (its prelude's load report).
   */
  startDocument(record, port, control) {
    record.starts += 1;
    const now = performance.now();
    prune(record.startTimes, now);
    record.startTimes.push(now);
    if (record.startTimes.length > MAX_STARTS) {
      port.close();
      control.close();
      this.stop(record, `Napplet “${record.tab.name}” reloaded itself too often and was stopped.`, "warning");
      return;
    }
    // The previous document (if any) is gone: its endpoint closes.
    if (record.doc) this.closeDocument(record.doc);
    const doc = {
      record,
      port,
      control,
      reported: false,
      pings: 0,
      pongs: 0,
      endpointId: null,
      opening: false,
      queue: [],
      queueChars: 0,
      // Messages posted to this window, attributed to this document, waiting
      // for its confirmation: [{wire, ping}] in arrival order (see onParentMessage).
      unconfirmed: [],
      unconfirmedChars: 0,
      // A ping is wanted as soon as the one in flight is answered.
      pingWanted: false,
      live: true,
    };
    record.doc = doc;
    port.onmessage = (event) => this.onPortMessage(doc, event);
    control.onmessage = (event) => {
      const data = event.data;
      if (!data || typeof data !== "object") return;
      if (Number.isInteger(data.pong)) {
        // (only the prelude holds this port; a pong is never above the pings sent)
        doc.pongs = Math.min(doc.pings, Math.max(doc.pongs, data.pong));
        this.confirm(doc);
        return;
      }
      if (doc.reported || data.loaded !== true) return;
      doc.reported = true;
      record.reports += 1;
    };
    if (record.llm && this.runtime()) this.openEndpoint(doc);
  }

  /** Close a document's port and endpoint (its work is cancelled by the runtime). */
  closeDocument(doc) {
    if (!doc.live) return;
    doc.live = false;
    doc.queue = [];
    doc.queueChars = 0;
    doc.unconfirmed = [];
    doc.unconfirmedChars = 0;
    try {
      doc.port.onmessage = null;
      doc.port.close();
      doc.control.close();
    } catch {
      // Already closed.
    }
    if (doc.record.doc === doc) doc.record.doc = null;
    if (doc.endpointId !== null) {
      const id = doc.endpointId;
      doc.endpointId = null;
      this.byEndpoint.delete(id);
      this.callRuntime("closeEndpoint", id);
      this.inspector.forgetEndpoint(id);
    }
  }

  /** Open the runtime endpoint for a document, then deliver its queued messages. */
  async openEndpoint(doc) {
    const runtime = this.runtime();
    const { record } = doc;
    if (!runtime || !doc.live || !record.llm || doc.opening || doc.endpointId !== null) return;
    doc.opening = true;
    const identity = JSON.stringify({
      name: record.tab.name,
      sha256: record.tab.sha256,
      domains: ["llm"],
      ...(record.tab.origin ? { origin: record.tab.origin } : {}),
    });
    let endpointId;
    try {
      endpointId = await runtime.openEndpoint(identity);
    } catch (err) {
      doc.opening = false;
      console.error("napllm: openEndpoint failed", err);
      this.notify("error", `The runtime could not open napplet “${record.tab.name}”.`);
      return;
    }
    doc.opening = false;
    endpointId = String(endpointId);
    if (!doc.live) {
      this.callRuntime("closeEndpoint", endpointId);
      return;
    }
    doc.endpointId = endpointId;
    this.byEndpoint.set(endpointId, doc);
    this.inspector.refreshEndpoints();
    const queued = doc.queue;
    doc.queue = [];
    doc.queueChars = 0;
    for (const wire of queued) this.deliver(doc, wire);
  }

  /** The runtime has attached: open endpoints for documents already started. */
  async runtimeAttached() {
    for (const tab of this.tabs) {
      if (tab.record && tab.record.doc) await this.openEndpoint(tab.record.doc);
    }
  }

  retire(record) {
    record.live = false;
    this.byWindow.delete(record.window);
    if (record.doc) this.closeDocument(record.doc);
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
   * The window `message` listener: a frame's `napllm.documentStart` (with its
   * secret and two ports), or an envelope a frame's document posted to its
   * parent (the NIP-5D web projection's transport; `onParentMessage`).
   * Messages from any other window are dropped unread.
   *
   * @param {MessageEvent} event
   */
  onMessage(event) {
    const source = event.source;
    if (!source) return;
    if (source === window) return;
    const record = this.byWindow.get(source);
    // The port count is checked before `data` is read: reading it is what
    // deserializes a message, so a flood from a frame that cannot be heard
    // costs nothing here.
    if (!record || !record.live) return;
    const ports = event.ports.length;
    if (ports === 0) {
      this.onParentMessage(record, event);
      return;
    }
    if (ports !== 2) return;
    const data = event.data;
    if (!data || typeof data !== "object" || data.type !== DOCUMENT_START) return;
    if (data.secret !== record.secret) return;
    this.startDocument(record, event.ports[0], event.ports[1]);
  }

  /**
   * An envelope posted to this window by a document of `record`'s frame.
   * `source` names the frame, not the document: the message is attributed to
   * the document bound now and released (metered already) only once that
   * document's prelude answers a ping sent after the message arrived (see
   * the header). Nothing else in the shell or the runtime sees it before.
   *
   * @param {object} record the frame.
   * @param {MessageEvent} event a message without ports.
   */
  onParentMessage(record, event) {
    const doc = record.doc;
    if (!doc || !doc.live || !record.llm) return;
    const data = event.data;
    // Envelopes are objects (the prelude forwards nothing else either); the
    // prelude's start is never an envelope, whichever way it comes.
    if (typeof data !== "object" || data === null || data.type === DOCUMENT_START) return;
    const wire = toWireJson(data);
    const cost = wire.startsWith('{"tooLarge"') ? MAX_WIRE_CHARS : wire.length;
    if (!this.meter(doc, cost)) {
      this.stop(record, `Napplet “${record.tab.name}” sent too many messages and was stopped.`, "warning");
      return;
    }
    if (doc.unconfirmed.length >= MAX_UNCONFIRMED_MESSAGES || doc.unconfirmedChars + wire.length > MAX_QUEUED_CHARS) {
      return;
    }
    let ping;
    if (doc.pongs >= doc.pings) {
      ping = this.sendPing(doc);
    } else {
      // The ping in flight was sent before this message arrived: the next one confirms it.
      ping = doc.pings + 1;
      doc.pingWanted = true;
    }
    doc.unconfirmed.push({ wire, ping });
    doc.unconfirmedChars += wire.length;
  }

  /** Ask the document's prelude for a sign of life; returns the ping's number. */
  sendPing(doc) {
    doc.pings += 1;
    const ping = doc.pings;
    try {
      doc.control.postMessage({ ping });
    } catch {
      // A closed port: the document never answers.
    }
    return ping;
  }

  /** The document answered up to `doc.pongs`: release what those pings confirm, in order. */
  confirm(doc) {
    let released = 0;
    while (doc.live && released < doc.unconfirmed.length && doc.unconfirmed[released].ping <= doc.pongs) {
      released += 1;
    }
    if (released > 0) {
      const ready = doc.unconfirmed.splice(0, released);
      for (const item of ready) doc.unconfirmedChars -= item.wire.length;
      for (const item of ready) {
        if (!doc.live) break;
        this.accept(doc, item.wire);
      }
    }
    if (doc.live && doc.pingWanted && doc.pongs >= doc.pings) {
      doc.pingWanted = false;
      this.sendPing(doc);
    }
  }

  /** One message on a document's port: metered, converted, queued or delivered. */
  onPortMessage(doc, event) {
    if (!doc.live) return;
    const wire = toWireJson(event.data);
    const cost = wire.startsWith('{"tooLarge"') ? MAX_WIRE_CHARS : wire.length;
    if (!this.meter(doc, cost)) {
      this.stop(doc.record, `Napplet “${doc.record.tab.name}” sent too many messages and was stopped.`, "warning");
      return;
    }
    this.accept(doc, wire);
  }

  /** A metered envelope of a bound document: queued until its endpoint opens, or delivered. */
  accept(doc, wire) {
    if (!doc.live || !doc.record.llm) return;
    if (doc.endpointId === null) {
      if (doc.queue.length >= MAX_QUEUED_MESSAGES || doc.queueChars + wire.length > MAX_QUEUED_CHARS) return;
      doc.queue.push(wire);
      doc.queueChars += wire.length;
      return;
    }
    this.deliver(doc, wire);
  }

  /** Count `cost` code units against the frame's budget; false when it is spent. */
  meter(doc, cost) {
    const budget = doc.record;
    const now = performance.now();
    let drop = 0;
    while (drop < budget.times.length && now - budget.times[drop] > RATE_WINDOW_MS) {
      budget.charTotal -= budget.chars[drop];
      drop += 1;
    }
    if (drop > 0) {
      budget.times.splice(0, drop);
      budget.chars.splice(0, drop);
    }
    budget.times.push(now);
    budget.chars.push(cost);
    budget.charTotal += cost;
    return budget.times.length <= FLOOD_MAX_MESSAGES && budget.charTotal <= FLOOD_MAX_CHARS;
  }

  deliver(doc, wire) {
    this.inspector.record(doc.endpointId, "in", wire);
    this.callRuntime("receive", doc.endpointId, wire);
  }

  /**
   * `napllmHost.postAll`: deliver the runtime's envelopes, in order.
   *
   * @param {string} batchJson `[[endpointId, envelope], ...]`
   */
  postAll(batchJson) {
    let batch;
    try {
      batch = JSON.parse(batchJson);
    } catch {
      batch = null;
    }
    if (!Array.isArray(batch)) {
      console.error("napllm: the runtime posted a batch that is not a JSON array");
      return;
    }
    // Envelopes of one run share this text: one that cannot be delivered (an
    // inspector or port that throws) must not cost the ones after it theirs.
    for (const item of batch) {
      if (!Array.isArray(item) || item.length !== 2) continue;
      try {
        this.deliverOut(String(item[0]), item[1]);
      } catch (err) {
        console.error("napllm: delivering an envelope failed", err);
      }
    }
  }

  /** Post `envelope` to an endpoint's document (dropped when it is gone). */
  deliverOut(endpointId, envelope) {
    const doc = this.byEndpoint.get(endpointId);
    if (!doc || !doc.live) return;
    this.inspector.record(doc.endpointId, "out", JSON.stringify(envelope));
    try {
      doc.port.postMessage(envelope);
    } catch (err) {
      console.error("napllm: posting to a napplet failed", err);
    }
  }
}

/**
 * The Content-Security-Policy this page runs under: its response header (read
 * back from the page's own URL) and any `<meta>` policy, joined by " , ";
 * "" when none is found.
 *
 * @returns {Promise<string>}
 */
export async function pageCsp() {
  const found = [];
  try {
    const response = await fetch(location.href, { method: "HEAD", cache: "no-store" });
    const header = response.headers.get("content-security-policy");
    if (header) found.push(header);
  } catch {
    // Offline: the meta policy (if any) is still reported.
  }
  for (const meta of document.querySelectorAll("meta[http-equiv]")) {
    if (meta.httpEquiv.toLowerCase() === "content-security-policy" && meta.content) found.push(meta.content);
  }
  return found.join(" , ").slice(0, 600);
}
