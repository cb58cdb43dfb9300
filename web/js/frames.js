/**
 * The napplet area: napplet tabs, their frames and their endpoints
 * (NIP-5D web projection; NAP-LLM, Shell Behavior; docs/design.md,
 * "Endpoint", "Napplet identity"). It ties three parts together: the
 * napplet's page (napplet-page.js: srcdoc, CSP, identity, names), the
 * binding state of each frame and document with its lifecycle tables
 * (frame-binding.js) and the tab view (tab-view.js); here are the fetching,
 * the message routing and the calls to the runtime.
 *
 * Rules
 * - A napplet is loaded by fetching its HTML bytes (at most
 *   `MAX_NAPPLET_BYTES`); its identity is its name plus the hex sha256 of
 *   exactly those bytes. The frame is `<iframe sandbox="allow-scripts">`
 *   (no other token, no `allow` attribute) whose `srcdoc` is
 *   napplet-page.js `buildSrcdoc`.
 * - The prelude defines `window.napplet.llm` only while the tab's "LLM
 *   access" is on; otherwise `window.napplet` is an empty frozen object and
 *   no endpoint is opened: the frame's messages reach no runtime, and each
 *   request envelope (a request type with a usable id), on either
 *   transport, is answered here with `unsupported` and one fixed message
 *   (NAP-LLM, Error Handling: domain unavailable), which says no more than
 *   the missing `window.napplet.llm` does; anything else gets nothing. The
 *   messages are metered and confirmed as with LLM access on.
 * - Binding (web/prelude.js): each frame built here gets a fresh secret in
 *   its prelude. The prelude posts `{type: "napllm.documentStart", secret}`
 *   with two transferred `MessagePort`s; only such a start, from the frame's
 *   own window and with that secret, binds a document: it opens an endpoint,
 *   and its first port carries every envelope *to* the document (so no reply
 *   can reach any other document of the frame). A document the napplet
 *   navigates to has no prelude, so it is never bound; a napplet reloading
 *   itself runs the prelude again and gets a new endpoint (the previous
 *   document is `replaced`: its endpoint closes, its generations end, its
 *   handles expire).
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
 *   with respect to each other (frame-binding.js has the bounds).
 *   Messages from a frame with no bound document are
 *   dropped without their data being read; one carrying ports is read only
 *   when it has two, as a possible start.
 * - Each `load` of a frame must be matched by the load report a started
 *   document's prelude sends on its control port, within `START_GRACE_MS`
 *   and in either order (then the bound document is asked once more, for a
 *   page too busy to report in time; frame-binding.js `LOAD_TRANSITIONS`).
 *   A load nobody reports is either the first document (the prelude could
 *   not run: the page's Content Security Policy is named) or a document the
 *   napplet navigated to: the frame is stopped (`navigatedAway`: its
 *   endpoint is closed), the standing grants of the napplet's identity are
 *   revoked (by the identity the runtime keys them by, `revokeNappletGrants`),
 *   the frame is removed and the tab says why. This only informs and cleans
 *   up: such a document never had a port, so it never reached the runtime.
 * - Bounded work: a frame may start at most `MAX_STARTS` documents per
 *   `RATE_WINDOW_MS`, and its documents together send at most
 *   `FLOOD_MAX_CHARS` / `FLOOD_MAX_MESSAGES` per window; past either it is
 *   stopped with a notice (other napplets are unaffected). Closed endpoints
 *   are removed from every map here and from the inspector.
 * - A napplet opened from a URL carries its origin: the tab, the inspector
 *   and the runtime's dialogs show it. Names are sanitised
 *   (`sanitiseName`). A napplet opened by a link (`?napplet=`) starts with
 *   LLM access off; the user turns it on in the tab.
 */

import { limitResponse } from "../engines/bounded.js";
import { FrameBinding, START_GRACE_MS } from "./frame-binding.js";
import { buildSrcdoc, isHttpUrl, newSecret, originOf, pageCsp, promptApiMode, pythonMode, sanitiseName, sha256Hex } from "./napplet-page.js";
import { PythonFiles } from "./python-files.js";
import { TabStrip, showFrame, showIdentity, showStatus, showStopped, tabLabel } from "./tab-view.js";
import { measureWire, refusalWithoutLlm } from "./wire.js";

export {
  FLOOD_MAX_CHARS,
  FLOOD_MAX_MESSAGES,
  MAX_QUEUED_CHARS,
  MAX_QUEUED_MESSAGES,
  MAX_STARTS,
  MAX_UNCONFIRMED_MESSAGES,
  RATE_WINDOW_MS,
  START_GRACE_MS,
} from "./frame-binding.js";
export {
  MAX_NAME_LENGTH,
  NAPPLET_CSP,
  PROMPT_API_META,
  buildSrcdoc,
  isHttpUrl,
  nameFromUrl,
  newSecret,
  originOf,
  pageCsp,
  promptApiMode,
  promptApiScript,
  sanitiseName,
  sha256Hex,
} from "./napplet-page.js";

/**
 * Largest napplet document accepted, in bytes. The download stops there:
 * a host that answers without a length, or keeps sending, is cut off
 * (engines/bounded.js `limitResponse`), never read to its end first.
 */
export const MAX_NAPPLET_BYTES = 8 * 1024 * 1024;
/** Posted by the prelude before any napplet script (see web/prelude.js); never forwarded. */
const DOCUMENT_START = "napllm.documentStart";
/** What the tab says when its frame left the sandboxed page. */
export const LEFT_SANDBOX = "This napplet left its sandboxed page; its model access was closed.";

/**
 * The identity of `tab`'s napplet as the runtime takes it (JSON text for
 * `openEndpoint` and `revokeNappletGrants`; napllm.browser.bridge
 * `identity_from_json`).
 */
export function identityJson(tab) {
  return JSON.stringify({
    name: tab.name,
    sha256: tab.sha256,
    domains: ["llm"],
    ...(tab.origin ? { origin: tab.origin } : {}),
  });
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
    this.strip = new TabStrip({ tablist, panels, empty });
    this.runtime = runtime;
    this.inspector = inspector;
    this.notify = notify;
    // Numbers the tabs of this area (their keys `tab-N`, never reused).
    this.tabSerial = 0;
    // contentWindow -> FrameBinding (the frames built here, while live).
    this.byWindow = new Map();
    // endpoint id -> DocumentBinding (open endpoints only).
    this.byEndpoint = new Map();
    // The files Python napplets' frames are handed (python-files.js).
    this.python = new PythonFiles();
  }

  /** The tabs open, in order. */
  get tabs() {
    return this.strip.tabs;
  }

  /** The tab whose current document holds endpoint `endpointId`, or null. */
  tabOfEndpoint(endpointId) {
    const doc = this.byEndpoint.get(String(endpointId));
    return doc ? doc.frame.tab : null;
  }

  /** The label of an endpoint for the inspector: tab title, origin and id. */
  describeEndpoint(endpointId) {
    const doc = this.byEndpoint.get(endpointId);
    if (doc) return `${tabLabel(doc.frame.tab)} · ${endpointId}`;
    return `${endpointId} (closed)`;
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
      promptApi: null,
      python: null,
      // The FrameBinding shown now, or null.
      frame: null,
      view: null,
    };
    this.strip.add(tab, {
      toggle: (checked) => {
        tab.llm = checked;
        if (tab.text) {
          showStatus(tab, "");
          this.loadFrame(tab);
        }
      },
      reload: () => this.reload(tab),
      close: () => this.close(tab),
    });
    const loaded = await this.fetchNapplet(tab);
    if (!loaded) return tab;
    if (!tab.llm) showStatus(tab, "LLM access is off: turn it on to let this napplet ask for models.");
    this.loadFrame(tab);
    return tab;
  }

  /** Fetch `tab`'s napplet (bounded); true when its bytes, hash and text are set. */
  async fetchNapplet(tab) {
    showStatus(tab, "Loading…");
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
        showStatus(tab, "Could not load this napplet.");
        const why = err && /^HTTP \d{3}$/.test(err.message) ? err.message : "network error";
        this.notify("error", `Could not load napplet “${tab.name}” (${why}).`);
        return false;
      }
    }
    if (tooLarge || bytes.byteLength > MAX_NAPPLET_BYTES) {
      showStatus(tab, "This napplet is too large.");
      this.notify("error", `Napplet “${tab.name}” is larger than ${MAX_NAPPLET_BYTES / 1048576} MiB.`);
      return false;
    }
    const text = new TextDecoder("utf-8").decode(bytes);
    // A declarative shadow root may be closed: frames inside it could not be
    // removed by the prelude (see web/prelude.js), so such napplets do not run.
    if (/shadowrootmode/i.test(text)) {
      showStatus(tab, "This napplet uses declarative shadow roots, which napplets cannot use.");
      this.notify("error", `Napplet “${tab.name}” uses declarative shadow roots (shadowrootmode), which napplets cannot use.`);
      return false;
    }
    tab.sha256 = await sha256Hex(bytes);
    tab.text = text;
    tab.promptApi = promptApiMode(text);
    tab.python = pythonMode(text);
    showIdentity(tab);
    showStatus(tab, "");
    return true;
  }

  /** Fetch the napplet again (its bytes may have changed) and load a fresh frame. */
  async reload(tab) {
    if (!this.tabs.includes(tab)) return;
    const loaded = await this.fetchNapplet(tab);
    if (loaded && this.tabs.includes(tab)) this.loadFrame(tab);
  }

  /** Close a tab: its endpoint is closed and its frame removed. */
  close(tab) {
    if (!this.tabs.includes(tab)) return;
    if (tab.frame) this.retire(tab.frame, "stopped");
    tab.frame = null;
    this.strip.remove(tab);
    this.inspector.refreshEndpoints();
  }

  /** Replace the tab's frame with a fresh one (a new secret) holding the current bytes. */
  loadFrame(tab) {
    if (tab.frame) this.retire(tab.frame, "stopped");
    const iframe = document.createElement("iframe");
    iframe.setAttribute("sandbox", "allow-scripts");
    iframe.setAttribute("referrerpolicy", "no-referrer");
    iframe.className = "napplet-frame";
    iframe.title = `Napplet: ${tabLabel(tab)}`;
    const secret = newSecret();
    const python = tab.python ? { secret: newSecret(), packages: tab.python } : null;
    // srcdoc is set before insertion: the frame's first navigation is to the
    // srcdoc (no initial about:blank load event to tell apart).
    iframe.srcdoc = buildSrcdoc(tab.text, tab.llm, secret, tab.promptApi, python);
    showFrame(tab, iframe);
    const frame = new FrameBinding({ tab, iframe, llm: tab.llm, secret, pythonSecret: python && python.secret });
    tab.frame = frame;
    this.byWindow.set(frame.window, frame);
    iframe.addEventListener("load", () => this.onFrameLoad(frame));
  }

  /** Stop `frame` with `event` (`FRAME_TRANSITIONS`): its document and endpoint close, the iframe goes. */
  retire(frame, event) {
    const doc = frame.doc;
    if (!frame.move(event)) return false;
    this.byWindow.delete(frame.window);
    if (doc) this.forgetEndpoint(doc);
    frame.iframe.remove();
    return true;
  }

  /**
   * Stop a frame for good: endpoint closed, frame removed, the tab says why.
   * `event`: `stopped`, `preludeMissing` or `navigatedAway`.
   */
  stop(frame, event, text, level) {
    const { tab } = frame;
    if (!this.retire(frame, event)) return;
    if (tab.frame === frame) tab.frame = null;
    showStopped(tab, text, level);
    this.notify(level, text);
    this.inspector.refreshEndpoints();
  }

  /**
   * A document of the frame finished loading. Its prelude reports the same
   * load on the document's control port; a load that no started document
   * reports within `START_GRACE_MS` is a document the shell did not make
   * (the order of the two reports does not matter).
   */
  onFrameLoad(frame) {
    if (!frame.live) return;
    const number = frame.loadEvent();
    setTimeout(() => this.checkLoad(frame, number), START_GRACE_MS);
  }

  checkLoad(frame, number) {
    const step = frame.graceOver(number);
    if (step.next === "preludeMissing") this.preludeDidNotStart(frame);
    else if (step.next === "navigatedAway") this.leftSandbox(frame);
    else if (step.next === "ask") {
      // A busy page may have delayed the report: the bound document was asked.
      setTimeout(() => {
        if (!frame.answerDue(number, step.doc, step.ping)) this.leftSandbox(frame);
      }, START_GRACE_MS);
    }
  }

  /** The frame now shows a document that did not start from the shell's srcdoc. */
  leftSandbox(frame) {
    const { tab } = frame;
    this.stop(frame, "navigatedAway", LEFT_SANDBOX, "warning");
    this.revokeGrants(tab);
  }

  /** The first document's prelude never ran: almost always the page's own CSP. */
  async preludeDidNotStart(frame) {
    const { tab } = frame;
    const policy = await pageCsp();
    if (!frame.live) return;
    const text = policy
      ? `Napplet “${tab.name}” could not start: this page's Content-Security-Policy (${policy}) blocks the napplet's inline scripts. The deploy section of the README lists a policy that works.`
      : `Napplet “${tab.name}” could not start: its sandboxed page did not run the shell's prelude (a Content-Security-Policy of this page may block inline scripts).`;
    this.stop(frame, "preludeMissing", text, "error");
  }

  /**
   * Revoke the standing grants of `tab`'s napplet: the runtime matches them
   * by the identity it keyed them by (name and the full sha256), the same
   * text `openEndpoint` takes.
   */
  async revokeGrants(tab) {
    const runtime = this.runtime();
    if (!runtime || !tab.sha256 || typeof runtime.revokeNappletGrants !== "function") return;
    try {
      await runtime.revokeNappletGrants(identityJson(tab));
    } catch (err) {
      console.error("napllm: revoking the napplet's grants failed", err);
    }
  }

  /**
   * A valid `napllm.documentStart`: bind the new document to `port` (its
   * envelopes) and `control` (its prelude's load report and pongs).
   */
  startDocument(frame, port, control) {
    const previous = frame.doc;
    const started = frame.start(port, control, performance.now());
    if (started === null) {
      this.stop(frame, "stopped", `Napplet “${frame.tab.name}” reloaded itself too often and was stopped.`, "warning");
      return;
    }
    // The previous document (if any) is gone: its endpoint closes.
    if (previous) this.forgetEndpoint(previous);
    const { doc } = started;
    port.onmessage = (event) => this.onPortMessage(doc, event);
    control.onmessage = (event) => {
      const data = event.data;
      if (!data || typeof data !== "object") return;
      if (Number.isInteger(data.pong)) doc.pong(data.pong, (wire) => this.accept(doc, wire));
      else if (data.loaded === true) frame.report(doc);
    };
    if (frame.llm && this.runtime()) this.openEndpoint(doc);
  }

  /** A closed document's endpoint: closed in the runtime (its work is cancelled) and forgotten. */
  forgetEndpoint(doc) {
    const id = doc.endpointId;
    if (id === null) return;
    doc.endpointId = null;
    this.byEndpoint.delete(id);
    this.callRuntime("closeEndpoint", id);
    this.inspector.forgetEndpoint(id);
  }

  /** Open the runtime endpoint for a document, then deliver what waited for it. */
  async openEndpoint(doc) {
    const runtime = this.runtime();
    const { frame } = doc;
    if (!runtime || !frame.llm || !doc.move("open")) return;
    let endpointId;
    try {
      endpointId = String(await runtime.openEndpoint(identityJson(frame.tab)));
    } catch (err) {
      doc.move("openFailed");
      console.error("napllm: openEndpoint failed", err);
      this.notify("error", `The runtime could not open napplet “${frame.tab.name}”.`);
      return;
    }
    const waited = doc.opened(endpointId);
    if (waited === null) {
      // The document closed while its endpoint was being opened.
      this.callRuntime("closeEndpoint", endpointId);
      return;
    }
    this.byEndpoint.set(endpointId, doc);
    this.inspector.refreshEndpoints();
    for (const wire of waited) this.deliver(doc, wire);
  }

  /** The runtime has attached: open endpoints for documents already started. */
  async runtimeAttached() {
    for (const tab of this.tabs) {
      if (tab.frame && tab.frame.doc) await this.openEndpoint(tab.frame.doc);
    }
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
    const frame = this.byWindow.get(source);
    // The port count is checked before `data` is read: reading it is what
    // deserializes a message, so a flood from a frame with no bound
    // document costs nothing here.
    if (!frame || !frame.live) return;
    const ports = event.ports.length;
    if (ports === 0) {
      this.onParentMessage(frame, event);
      return;
    }
    // One port: a Python napplet's loader asking for its files (python-files.js).
    if (ports === 1) this.python.start(frame, event);
    if (ports !== 2) return;
    const data = event.data;
    if (!data || typeof data !== "object" || data.type !== DOCUMENT_START) return;
    if (data.secret !== frame.secret) return;
    this.startDocument(frame, event.ports[0], event.ports[1]);
  }

  /**
   * An envelope posted to this window by a document of `frame`. `source`
   * names the frame, not the document: the message is attributed to the
   * document bound now and released (metered already) only once that
   * document's prelude answers a ping sent after the message arrived (see
   * the header). Nothing else in the shell or the runtime sees it before.
   *
   * @param {FrameBinding} frame
   * @param {MessageEvent} event a message without ports.
   */
  onParentMessage(frame, event) {
    const doc = frame.doc;
    if (!doc || !doc.live) return;
    const data = event.data;
    // Envelopes are objects (the prelude forwards nothing else either); the
    // prelude's start is never an envelope, whichever way it comes.
    if (typeof data !== "object" || data === null || data.type === DOCUMENT_START) return;
    const wire = this.meter(frame, data);
    if (wire !== null) doc.hold(wire);
  }

  /** One message on a document's port: metered, converted, then waiting or delivered. */
  onPortMessage(doc, event) {
    if (!doc.live) return;
    const wire = this.meter(doc.frame, event.data);
    if (wire !== null) this.accept(doc, wire);
  }

  /**
   * Convert `data` and count what it holds against the frame's budget
   * (wire.js `measureWire`: binary values by their bytes): its wire text, or
   * null (and the frame stopped) once the budget is spent.
   */
  meter(frame, data) {
    const { wire, cost } = measureWire(data);
    if (frame.meter.spend(cost, performance.now())) return wire;
    this.stop(frame, "stopped", `Napplet “${frame.tab.name}” sent too many messages and was stopped.`, "warning");
    return null;
  }

  /**
   * A metered envelope of a bound document: waiting until its endpoint
   * opens, or delivered. With LLM access off there is no endpoint: a
   * request is answered here with the error a missing llm domain gets
   * (wire.js `refusalWithoutLlm`), anything else is dropped.
   */
  accept(doc, wire) {
    if (!doc.frame.llm) {
      const refusal = refusalWithoutLlm(wire);
      if (refusal !== null && doc.live) this.postTo(doc, refusal);
      return;
    }
    if (doc.accept(wire)) this.deliver(doc, wire);
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
    this.postTo(doc, envelope);
  }

  /** Post `envelope` on `doc`'s port (its prelude dispatches it as a message from the parent). */
  postTo(doc, envelope) {
    try {
      doc.port.postMessage(envelope);
    } catch (err) {
      console.error("napllm: posting to a napplet failed", err);
    }
  }
}
