/**
 * A napplet frame's binding to the runtime as plain state objects whose
 * lifecycles are tables (NIP-5D web projection; NAP-LLM, Shell Behavior;
 * docs/design.md, "Endpoint"): `FrameBinding`, one `<iframe>` the shell
 * built (its secret, its documents, its load reports, its traffic budget),
 * and `DocumentBinding`, one document of it that started from the shell's
 * srcdoc (its two ports, its endpoint, what waits for the endpoint or for
 * the document's confirmation). Nothing here touches the DOM or calls the
 * runtime: the napplet area (frames.js) acts on what these objects answer.
 *
 * Rules
 * - Lifecycles are data. A document moves only as `DOCUMENT_TRANSITIONS`
 *   allows, a frame only as `FRAME_TRANSITIONS`, a load of the frame only
 *   as `LOAD_TRANSITIONS`; `move(event)` refuses any other event (returns
 *   false and changes nothing), so a late answer (an endpoint opened for a
 *   document already replaced) is recognised by the refusal, never by a
 *   counter.
 * - A document is `bound` by its `napllm.documentStart`, `opening` while
 *   the runtime opens its endpoint, `open` once it has one, and `closed`
 *   for good when it is `replaced` (the frame started another), its frame
 *   `navigatedAway`, or it is `closed` (tab closed, frame stopped or
 *   reloaded). A closed document drops what it held and closes its ports.
 * - A frame is `loading` until its first document starts, `bound` while
 *   its current document is, and `stopped` for good (its prelude never ran,
 *   it navigated away from the shell's page, it exceeded a bound, or it was
 *   closed).
 * - Each `load` of a frame must be matched by the load report a started
 *   document's prelude sends on its control port, in either order: a load
 *   is `waiting`, then `reported`; past `START_GRACE_MS` without a report
 *   the bound document is `asked` once (a ping), and a load nobody answers
 *   is `unreported` (the frame shows a document the shell did not make).
 * - Envelopes posted to the shell's window are held per document until a
 *   ping sent after they arrived is answered (`hold`, `pong`); one ping is
 *   in flight at a time. At most `MAX_UNCONFIRMED_MESSAGES` /
 *   `MAX_QUEUED_CHARS` wait for a confirmation and `MAX_QUEUED_MESSAGES` /
 *   `MAX_QUEUED_CHARS` for the endpoint; more is dropped.
 * - A frame may start at most `MAX_STARTS` documents per `RATE_WINDOW_MS`,
 *   and its documents together send at most `FLOOD_MAX_CHARS` /
 *   `FLOOD_MAX_MESSAGES` per window (`FloodMeter`; a reload does not reset it).
 */

import { advance, transition } from "../engines/lifecycle.js";

export { transition };

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
/** Most UTF-16 code units of envelopes one frame may send per window (binary values: one unit per byte). */
export const FLOOD_MAX_CHARS = 64 * 1024 * 1024;
/** Most envelopes one frame may send per window. */
export const FLOOD_MAX_MESSAGES = 4000;

/** A document's states and, per state, the events it accepts and the state each leads to. */
export const DOCUMENT_TRANSITIONS = Object.freeze({
  bound: Object.freeze({ open: "opening", replaced: "closed", navigatedAway: "closed", closed: "closed" }),
  opening: Object.freeze({ opened: "open", openFailed: "bound", replaced: "closed", navigatedAway: "closed", closed: "closed" }),
  open: Object.freeze({ replaced: "closed", navigatedAway: "closed", closed: "closed" }),
  closed: Object.freeze({}),
});

/** A frame's states and the events each accepts. */
export const FRAME_TRANSITIONS = Object.freeze({
  loading: Object.freeze({ documentStart: "bound", preludeMissing: "stopped", navigatedAway: "stopped", stopped: "stopped" }),
  bound: Object.freeze({ documentStart: "bound", navigatedAway: "stopped", stopped: "stopped" }),
  stopped: Object.freeze({}),
});

/** The states of one `load` event of a frame and the events each accepts. */
export const LOAD_TRANSITIONS = Object.freeze({
  waiting: Object.freeze({ reported: "reported", graceOver: "asked", unreported: "unreported" }),
  asked: Object.freeze({ reported: "reported", answered: "reported", noAnswer: "unreported" }),
  reported: Object.freeze({}),
  unreported: Object.freeze({}),
});

/** Wire texts in arrival order, bounded in count and in UTF-16 code units. */
class BoundedQueue {
  constructor(maxItems, maxChars) {
    this.maxItems = maxItems;
    this.maxChars = maxChars;
    this.items = [];
    this.chars = 0;
  }

  /** Append `item` (its `wire` counted); false, and nothing kept, when a bound would be passed. */
  push(item) {
    if (this.items.length >= this.maxItems || this.chars + item.wire.length > this.maxChars) return false;
    this.items.push(item);
    this.chars += item.wire.length;
    return true;
  }

  /** Remove and return the first `count` items. */
  take(count = this.items.length) {
    const taken = this.items.splice(0, count);
    for (const item of taken) this.chars -= item.wire.length;
    return taken;
  }

  clear() {
    this.items = [];
    this.chars = 0;
  }
}

/** The traffic budget of one frame: messages and code units per `RATE_WINDOW_MS`. */
export class FloodMeter {
  constructor() {
    this.times = [];
    this.costs = [];
    this.total = 0;
  }

  /**
   * Count `cost` units (frames.js `meter`: wire.js `measureWire`'s cost) at
   * `now` (ms); false once the window's budget was spent: by more than
   * `FLOOD_MAX_MESSAGES` messages, or by earlier messages holding more than
   * `FLOOD_MAX_CHARS` together. The message at hand was received (and
   * deserialized) already, so it is what ends the window's budget, never
   * what is refused for its own size: one message larger than the budget
   * gets its answer (too large), the next in the window stops the frame.
   */
  spend(cost, now) {
    let drop = 0;
    while (drop < this.times.length && now - this.times[drop] > RATE_WINDOW_MS) {
      this.total -= this.costs[drop];
      drop += 1;
    }
    if (drop > 0) {
      this.times.splice(0, drop);
      this.costs.splice(0, drop);
    }
    const before = this.total;
    this.times.push(now);
    this.costs.push(cost);
    this.total += cost;
    return this.times.length <= FLOOD_MAX_MESSAGES && before < FLOOD_MAX_CHARS;
  }
}

/** One document of a frame, bound by its prelude's start (module rules). */
export class DocumentBinding {
  /**
   * @param {FrameBinding} frame
   * @param {MessagePort} port carries every envelope to and from the document.
   * @param {MessagePort} control the prelude's load report and its pongs.
   */
  constructor(frame, port, control) {
    this.frame = frame;
    this.port = port;
    this.control = control;
    /** A key of `DOCUMENT_TRANSITIONS`. */
    this.state = "bound";
    /** The event that closed it (`replaced`, `navigatedAway`, `closed`), or null. */
    this.closedBy = null;
    /** The runtime's endpoint id while `open`, else null. */
    this.endpointId = null;
    /** Whether its prelude reported its load. */
    this.reported = false;
    this.pings = 0;
    this.pongs = 0;
    // A ping is wanted as soon as the one in flight is answered.
    this.pingWanted = false;
    // Metered envelopes waiting for the endpoint: {wire}.
    this.waiting = new BoundedQueue(MAX_QUEUED_MESSAGES, MAX_QUEUED_CHARS);
    // Envelopes posted to the shell's window, waiting for the ping that confirms them: {wire, ping}.
    this.unconfirmed = new BoundedQueue(MAX_UNCONFIRMED_MESSAGES, MAX_QUEUED_CHARS);
    /** A Python napplet's file channel (web/js/python-files.js), once its loader started. */
    this.pythonPort = null;
  }

  get live() {
    return this.state !== "closed";
  }

  /**
   * Take `event` (a key of its state's row in `DOCUMENT_TRANSITIONS`);
   * false when the table refuses it. Closing drops what it held and closes
   * its ports.
   */
  move(event) {
    const to = advance(this, DOCUMENT_TRANSITIONS, event);
    if (to === "closed") {
      this.closedBy = event;
      this.waiting.clear();
      this.unconfirmed.clear();
      try {
        this.port.onmessage = null;
        this.control.onmessage = null;
        this.port.close();
        this.control.close();
        if (this.pythonPort) this.pythonPort.close();
      } catch {
        // Already closed.
      }
    }
    return to !== null;
  }

  /** The endpoint `endpointId` opened: `open`, and the wire texts that waited for it (else null). */
  opened(endpointId) {
    if (!this.move("opened")) return null;
    this.endpointId = endpointId;
    return this.waiting.take().map((item) => item.wire);
  }

  /** A metered envelope: true when it is to be delivered now, false when it waits (or is dropped). */
  accept(wire) {
    if (!this.live) return false;
    if (this.state === "open") return true;
    this.waiting.push({ wire });
    return false;
  }

  /** Ask the document's prelude for a sign of life; returns the ping's number. */
  ping() {
    this.pings += 1;
    const ping = this.pings;
    try {
      this.control.postMessage({ ping });
    } catch {
      // A closed port: the document never answers.
    }
    return ping;
  }

  /** Whether the document answered ping `ping` (or a later one). */
  answered(ping) {
    return this.live && this.pongs >= ping;
  }

  /** Hold `wire`, posted to the shell's window, until a ping sent from now on is answered. */
  hold(wire) {
    if (!this.live || !this.unconfirmed.push({ wire, ping: this.pings + 1 })) return;
    // With a ping in flight (sent before this message arrived) the next one confirms it.
    if (this.pongs >= this.pings) this.ping();
    else this.pingWanted = true;
  }

  /**
   * The prelude answered ping `number`: each held wire text it confirms goes
   * to `release`, in order, while the document lives; then the ping that was
   * wanted meanwhile is sent.
   */
  pong(number, release) {
    // Only the prelude holds the control port; a pong is never above the pings sent.
    this.pongs = Math.min(this.pings, Math.max(this.pongs, number));
    let count = 0;
    while (count < this.unconfirmed.items.length && this.unconfirmed.items[count].ping <= this.pongs) count += 1;
    for (const item of this.unconfirmed.take(count)) {
      if (!this.live) break;
      release(item.wire);
    }
    if (this.live && this.pingWanted && this.pongs >= this.pings) {
      this.pingWanted = false;
      this.ping();
    }
  }
}

/** One frame the shell built for a tab (module rules). */
export class FrameBinding {
  /**
   * @param {object} parts
   * @param {object} parts.tab the tab that shows the frame.
   * @param {HTMLIFrameElement} parts.iframe
   * @param {boolean} parts.llm whether the frame's documents get the llm domain.
   * @param {string} parts.secret the secret its prelude sends with a start.
   * @param {string | null} [parts.pythonSecret] the secret its Python loader
   *   sends with a start (web/js/python-files.js); null: not a Python napplet.
   */
  constructor({ tab, iframe, llm, secret, pythonSecret = null }) {
    this.tab = tab;
    this.iframe = iframe;
    this.window = iframe.contentWindow;
    this.llm = llm;
    this.secret = secret;
    this.pythonSecret = pythonSecret;
    /** A key of `FRAME_TRANSITIONS`. */
    this.state = "loading";
    /** The document bound now, or null. */
    this.doc = null;
    /** Load number -> its state (`LOAD_TRANSITIONS`), while not settled. */
    this.loads = new Map();
    this.loadCount = 0;
    this.reports = 0;
    this.startTimes = [];
    this.meter = new FloodMeter();
  }

  get live() {
    return this.state !== "stopped";
  }

  /** Take `event` (`FRAME_TRANSITIONS`); false when refused. Stopping closes its document. */
  move(event) {
    const to = advance(this, FRAME_TRANSITIONS, event);
    if (to === "stopped") this.closeDocument(event === "navigatedAway" ? "navigatedAway" : "closed");
    return to !== null;
  }

  /** Close the current document with `event`; returns it (null when there was none). */
  closeDocument(event) {
    const doc = this.doc;
    if (!doc) return null;
    this.doc = null;
    doc.move(event);
    return doc;
  }

  /**
   * A valid `napllm.documentStart` at `now` (ms): the new document, bound
   * (the previous one is `replaced`), with `previous` the one replaced; or
   * null when the frame started too many documents in the window (the
   * ports are closed; the caller stops the frame).
   *
   * @returns {{doc: DocumentBinding, previous: DocumentBinding | null} | null}
   */
  start(port, control, now) {
    let drop = 0;
    while (drop < this.startTimes.length && now - this.startTimes[drop] > RATE_WINDOW_MS) drop += 1;
    if (drop > 0) this.startTimes.splice(0, drop);
    this.startTimes.push(now);
    if (this.startTimes.length > MAX_STARTS || !this.move("documentStart")) {
      port.close();
      control.close();
      return null;
    }
    const previous = this.closeDocument("replaced");
    this.doc = new DocumentBinding(this, port, control);
    return { doc: this.doc, previous };
  }

  /** A `load` event of the iframe: its number, `waiting` unless already reported. */
  loadEvent() {
    this.loadCount += 1;
    const number = this.loadCount;
    if (this.reports < number) this.loads.set(number, "waiting");
    return number;
  }

  /** `doc`'s prelude reported its load (counted once per document). */
  report(doc) {
    if (doc.reported) return;
    doc.reported = true;
    this.reports += 1;
    this.settleLoads(this.reports, "reported");
  }

  /** Move every unsettled load up to number `upTo` with `event`. */
  settleLoads(upTo, event) {
    for (const [number, state] of this.loads) {
      if (number > upTo) continue;
      const to = transition(LOAD_TRANSITIONS, state, event);
      if (to === "reported") this.loads.delete(number);
      else if (to !== null) this.loads.set(number, to);
    }
  }

  /**
   * `START_GRACE_MS` passed after load `number`: what the area does next.
   * `settled` (reported, or the frame is gone), `preludeMissing` (the first
   * document never started), `ask` with the ping sent to the bound document
   * (the load is `asked`), or `navigatedAway` (nobody can report it).
   *
   * @returns {{next: "settled" | "preludeMissing" | "navigatedAway"} | {next: "ask", doc: DocumentBinding, ping: number}}
   */
  graceOver(number) {
    const state = this.loads.get(number);
    if (!this.live || state === undefined) return { next: "settled" };
    if (number === 1 && this.state === "loading") return { next: "preludeMissing" };
    const doc = this.doc;
    if (doc && doc.live) {
      // Only one document of a frame is alive, so if it answers, the load was its own.
      this.loads.set(number, transition(LOAD_TRANSITIONS, state, "graceOver"));
      return { next: "ask", doc, ping: doc.ping() };
    }
    this.loads.set(number, "unreported");
    return { next: "navigatedAway" };
  }

  /** The answer to the ping `graceOver` sent for load `number` was due: true when it came. */
  answerDue(number, doc, ping) {
    if (!this.live || !this.loads.has(number)) return true;
    if (doc.answered(ping)) {
      this.reports = Math.max(this.reports, number);
      this.settleLoads(number, "answered");
      this.settleLoads(this.reports, "reported");
      return true;
    }
    this.loads.set(number, "unreported");
    return false;
  }
}
