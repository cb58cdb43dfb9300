/**
 * The model chooser and the consent dialog (NAP-LLM, API Surface `select`;
 * Shell Behavior: authorization before every submission).
 *
 * Rules
 * - Dialogs are shown one at a time; the rest wait in a queue. Each names
 *   the requesting napplet (name + short hash).
 * - Every value from a napplet or a connection is inserted as text, never
 *   as markup.
 * - The chooser resolves with `{"id": candidate id, "revision": n}` as JSON
 *   text, or `null` on Cancel or Esc. `n` is the `revision` of the list the
 *   clicked row was rendered from (captured with the row, never read at
 *   click time), so the runtime binds only a candidate the person saw and
 *   shows the list again when it changed in between. The consent dialog
 *   resolves with `{"allow": bool, "remember": bool, "digest": text}` as
 *   JSON text, `digest` being the disclosure's own (the runtime takes an
 *   Allow only for the disclosure it asked about); Deny has the focus by
 *   default, "remember" is unchecked by default, Esc denies.
 * - `updateChooser(token, json)` replaces the candidates (and the revision)
 *   of an open or queued chooser when the connections change (added,
 *   edited, removed, in this tab or another); the new rows are armed
 *   afresh. An update older than the list shown is ignored.
 * - `closeDialog(token)` (the runtime no longer needs it) closes an open
 *   dialog or drops a queued one, resolving it as cancel/deny.
 * - Focus moves into the dialog and returns to where it was afterwards.
 *
 * Lock-out (a napplet that keeps asking): every dialog of a napplet (its
 * `endpointId`, grouped by `scopeOf`, i.e. its tab) offers "Close this
 * napplet" (`closeNapplet`) and "Refuse its requests until the page is
 * reloaded"; both drop its queued dialogs at once. After
 * `DENIALS_BEFORE_PAUSE` denials in a row (Deny, Cancel, Esc) its requests
 * are refused without a dialog for `PAUSE_MS` (doubling each time, up to
 * `MAX_PAUSE_MS`); `onBlockChange` shows the period to the user. A refused
 * request is answered after `REFUSAL_DELAY_MS`, so a napplet re-sending in
 * a loop cannot make the shell busy.
 *
 * Deliberate activation (a napplet can open a dialog under the pointer):
 * Allow, the "remember" box and the chooser's candidates are guarded by an
 * `ArmGuard` (arm-guard.js: disabled for `ARM_DELAY_MS`, then only a single
 * click pressed on the control counts). Deny, Cancel, Close and Refuse act
 * at once (they only take access away). The initial focus is Deny (Cancel
 * in the chooser), so Enter never means Allow.
 *
 * What the consent dialog discloses is consent-facts.js; this module owns
 * the queue, the answers and the lock-out, and the chooser's rows.
 */

import { ArmGuard } from "./arm-guard.js";
import { canDo } from "./connections.js";
import { disclosureFacts } from "./consent-facts.js";
import { el, str } from "./dom.js";
import { isObjectOrArray, parseJsonOr } from "./json.js";

const DENY = JSON.stringify({ allow: false, remember: false });

/** Denials in a row after which a napplet's requests are refused without a dialog. */
export const DENIALS_BEFORE_PAUSE = 3;
/** The first refusal period (ms); each later one doubles, up to `MAX_PAUSE_MS`. */
export const PAUSE_MS = 30_000;
export const MAX_PAUSE_MS = 10 * 60_000;
/** Delay (ms) before a refused request is answered (throttles a re-send loop). */
export const REFUSAL_DELAY_MS = 500;

const parseJson = (text) => parseJsonOr(text, {}, isObjectOrArray);

/** A list revision from the runtime; -1 (never equal to one) when missing or bad. */
const revisionOf = (value) => (Number.isSafeInteger(value) && value >= 0 ? value : -1);

/**
 * "name (#shortHash)" for a napplet record `{name, sha256, shortHash, origin?}`,
 * followed by " from <origin>" for a napplet loaded from a URL.
 */
export function nappletLabel(napplet) {
  const name = str(napplet?.name, "(unnamed napplet)");
  const hash = str(napplet?.shortHash) || str(napplet?.sha256).slice(0, 12);
  const origin = str(napplet?.origin);
  return (hash ? `${name} (#${hash})` : name) + (origin ? ` from ${origin}` : "");
}

/** What a connection can do, as badges (`canDo`: never what it cannot). */
function capabilityBadges(capabilities) {
  const caps = capabilities && typeof capabilities === "object" ? capabilities : {};
  const list = el("ul", { class: "badges", "aria-label": "Can do" });
  for (const word of canDo(caps)) list.append(el("li", { class: "badge on" }, word));
  if (caps.tools === true && Array.isArray(caps.toolChoiceModes) && caps.toolChoiceModes.length > 0) {
    list.append(el("li", { class: "badge info" }, `tool choice: ${caps.toolChoiceModes.filter((m) => typeof m === "string").join(", ")}`));
  }
  return list;
}

export class DialogQueue {
  /**
   * @param {HTMLElement} host container the <dialog> elements are added to.
   * @param {object} [options]
   * @param {(endpointId: string) => string|null} [options.scopeOf] the napplet
   *   (tab) an endpoint belongs to; refusals are per scope. Default: the endpoint.
   * @param {(endpointId: string) => void} [options.closeNapplet] closes the
   *   napplet of an endpoint (its tab); without it "Close" is not offered.
   * @param {(scope: string, endpointId: string, state: {until: number, reason: string}|null) => void} [options.onBlockChange]
   *   shows (state) or clears (null) a refusal period; `until` is a
   *   `Date.now()` time or `Infinity` (until the page is reloaded).
   */
  constructor(host, options = {}) {
    this.host = host;
    this.queue = [];
    this.current = null;
    this.returnFocus = null;
    this.scopeOf = typeof options.scopeOf === "function" ? options.scopeOf : (id) => id;
    this.closeNapplet = typeof options.closeNapplet === "function" ? options.closeNapplet : null;
    this.onBlockChange = typeof options.onBlockChange === "function" ? options.onBlockChange : () => {};
    /** scope -> {denials, pauses, until, timer, endpointId} */
    this.scopes = new Map();
  }

  /** The refusal record of `scope` (created empty). */
  scopeState(scope) {
    let state = this.scopes.get(scope);
    if (!state) {
      state = { denials: 0, pauses: 0, until: 0, timer: null, endpointId: "" };
      this.scopes.set(scope, state);
    }
    return state;
  }

  /** Whether requests of `scope` are refused without a dialog now. */
  refused(scope) {
    const state = scope === null ? null : this.scopes.get(scope);
    return Boolean(state && state.until > Date.now());
  }

  /** Refuse `scope`'s requests until `until` (a Date.now() time or Infinity). */
  refuse(scope, endpointId, until, reason) {
    const state = this.scopeState(scope);
    state.until = until;
    state.denials = 0;
    state.endpointId = endpointId;
    clearTimeout(state.timer);
    state.timer = null;
    if (Number.isFinite(until)) {
      state.timer = setTimeout(() => this.lift(scope), Math.max(0, until - Date.now()));
    }
    this.dropScope(scope);
    this.onBlockChange(scope, endpointId, { until, reason });
  }

  /** End a refusal period of `scope` (the user asked, or it expired). */
  lift(scope) {
    const state = this.scopes.get(scope);
    if (!state || state.until === 0) return;
    clearTimeout(state.timer);
    state.timer = null;
    state.until = 0;
    this.onBlockChange(scope, state.endpointId, null);
  }

  /** Resolve every queued dialog of `scope` as cancel/deny (not the open one). */
  dropScope(scope) {
    const kept = [];
    for (const item of this.queue) {
      if (item.scope === scope) item.resolve(item.cancelValue);
      else kept.push(item);
    }
    this.queue = kept;
  }

  /** Count a denial of the open dialog's napplet; pause it after too many. */
  denied(item) {
    if (item.scope === null) return;
    const state = this.scopeState(item.scope);
    state.denials += 1;
    if (state.denials >= DENIALS_BEFORE_PAUSE) {
      const period = Math.min(MAX_PAUSE_MS, PAUSE_MS * 2 ** state.pauses);
      state.pauses += 1;
      this.refuse(item.scope, item.endpointId, Date.now() + period, "denied");
    }
  }

  /** A granting answer: the napplet's denials in a row start again. */
  granted(item) {
    if (item.scope !== null) this.scopeState(item.scope).denials = 0;
  }

  /** Queue the chooser; resolves with `{"id","revision"}` JSON text or null. */
  openChooser(token, requestJson) {
    return this.enqueue(String(token), "chooser", parseJson(requestJson), null);
  }

  /** Queue the consent dialog; resolves with `{"allow","remember","digest"}` JSON text. */
  openConsent(token, disclosureJson) {
    return this.enqueue(String(token), "consent", parseJson(disclosureJson), DENY);
  }

  /**
   * The connections changed while the chooser for `token` is open or
   * queued: show the candidates of `requestJson` instead (the napplet and
   * its requirements stay as first shown). The new candidates are armed
   * afresh (`ARM_DELAY_MS`), so a click meant for a row that moved is not
   * taken for the row now under the pointer.
   */
  updateChooser(token, requestJson) {
    const key = String(token);
    const update = parseJson(requestJson);
    const candidates = update.candidates;
    const revision = revisionOf(update.revision);
    const newer = (item) => revision > revisionOf(item.data.revision);
    const queued = this.queue.find((item) => item.token === key && item.kind === "chooser");
    if (queued) {
      if (newer(queued)) queued.data = { ...queued.data, candidates, revision };
      return;
    }
    const item = this.current;
    if (!item || item.token !== key || item.kind !== "chooser" || !item.candidatesNode) return;
    if (!newer(item)) return;
    item.data = { ...item.data, candidates, revision };
    const hadFocus = item.candidatesNode.contains(document.activeElement);
    const { node, buttons } = this.chooserCandidates(item);
    item.candidatesNode.replaceWith(node);
    item.candidatesNode = node;
    item.guard.stop();
    item.guard = new ArmGuard(item.dialog, buttons);
    if (hadFocus && item.cancelButton) item.cancelButton.focus();
  }

  /** Close or drop the dialog for `token`, resolving it as cancel/deny. */
  closeDialog(token) {
    const key = String(token);
    if (this.current && this.current.token === key) {
      this.finish(this.current.cancelValue);
      return;
    }
    const index = this.queue.findIndex((item) => item.token === key);
    if (index >= 0) {
      const [item] = this.queue.splice(index, 1);
      item.resolve(item.cancelValue);
    }
  }

  /** Whether a dialog is open or waiting. */
  get busy() {
    return this.current !== null || this.queue.length > 0;
  }

  enqueue(token, kind, data, cancelValue) {
    const endpointId = typeof data.endpointId === "string" && data.endpointId ? data.endpointId : null;
    const scoped = endpointId === null ? null : this.scopeOf(endpointId);
    const scope = endpointId === null ? null : String(scoped ?? endpointId);
    return new Promise((resolve) => {
      if (this.refused(scope)) {
        setTimeout(() => resolve(cancelValue), REFUSAL_DELAY_MS);
        return;
      }
      this.queue.push({ token, kind, data, cancelValue, resolve, dialog: null, endpointId, scope, guard: null });
      if (!this.current) this.showNext();
    });
  }

  showNext() {
    const item = this.queue.shift();
    if (!item) {
      const target = this.returnFocus;
      this.returnFocus = null;
      if (target && target.isConnected && typeof target.focus === "function") target.focus();
      return;
    }
    if (!this.returnFocus) this.returnFocus = document.activeElement;
    this.current = item;
    const { dialog, initialFocus } = item.kind === "chooser" ? this.buildChooser(item) : this.buildConsent(item);
    item.dialog = dialog;
    dialog.addEventListener("cancel", (event) => {
      // Esc: cancel/deny (and keep the browser from closing it behind our back).
      event.preventDefault();
      if (this.current === item) this.deny(item);
    });
    dialog.addEventListener("close", () => {
      if (this.current === item) this.finish(item.cancelValue);
    });
    this.host.append(dialog);
    dialog.showModal();
    initialFocus.focus();
  }

  /** The user said no (Deny, Cancel, Esc): counts towards a pause. */
  deny(item) {
    if (this.current !== item) return;
    this.denied(item);
    if (this.current === item) this.finish(item.cancelValue);
  }

  /** The user allowed or chose: the denial count starts again. */
  grant(item, value) {
    if (this.current !== item) return;
    this.granted(item);
    this.finish(value);
  }

  /** "Close this napplet": its dialogs go, then its tab. */
  closeFromDialog(item) {
    if (this.current !== item) return;
    if (item.scope !== null) this.dropScope(item.scope);
    this.finish(item.cancelValue);
    if (this.closeNapplet && item.endpointId !== null) this.closeNapplet(item.endpointId);
  }

  /** "Refuse its requests until the page is reloaded". */
  blockFromDialog(item) {
    if (this.current !== item || item.scope === null) return;
    this.refuse(item.scope, item.endpointId, Infinity, "blocked");
    this.finish(item.cancelValue);
  }

  /** The row with "Close this napplet" and "Refuse …", or null without an endpoint. */
  escapeRow(item, id) {
    if (item.endpointId === null) return null;
    const row = el("div", { class: "dialog-escape" });
    if (this.closeNapplet) {
      const close = el("button", { type: "button", class: "secondary close-napplet", id: `${id}-close` }, "Close this napplet");
      close.addEventListener("click", () => this.closeFromDialog(item));
      row.append(close);
    }
    const block = el(
      "button",
      { type: "button", class: "secondary block-napplet", id: `${id}-block` },
      "Refuse its requests until the page is reloaded",
    );
    block.addEventListener("click", () => this.blockFromDialog(item));
    row.append(block);
    return row;
  }

  /**
   * The <dialog> element of `item`: a heading and a description that name
   * and describe it (ARIA), then `body`, the action buttons and the escape
   * row (`escapeRow`).
   *
   * @param {object} item the queued dialog (its `token` and `kind`).
   * @param {string} id the prefix of the dialog's element ids.
   * @param {string} heading the heading's text.
   * @param {Array<Node|string|null>} description the description's parts.
   * @param {Array<Node|null>} body what stands between the description and the actions.
   * @param {HTMLButtonElement[]} actions the buttons in the action row.
   * @returns {HTMLDialogElement}
   */
  dialogFor(item, id, heading, description, body, actions) {
    return el(
      "dialog",
      { class: `${item.kind}-dialog`, "aria-labelledby": `${id}-title`, "aria-describedby": `${id}-desc`, dataset: { token: item.token, kind: item.kind } },
      el("h2", { id: `${id}-title` }, heading),
      el("p", { id: `${id}-desc` }, ...description),
      ...body,
      el("div", { class: "dialog-actions" }, ...actions),
      this.escapeRow(item, id),
    );
  }

  finish(value) {
    const item = this.current;
    if (!item) return;
    this.current = null;
    if (item.guard) item.guard.stop();
    if (item.dialog) {
      if (item.dialog.open) item.dialog.close();
      item.dialog.remove();
    }
    item.resolve(value);
    this.showNext();
  }

  buildChooser(item) {
    const data = item.data;
    const id = `chooser-${Math.random().toString(36).slice(2)}`;
    item.dialogId = id;
    item.renders = 0;
    const requirements = data.requirements && typeof data.requirements === "object" ? data.requirements : {};
    const wanted = [];
    if (typeof requirements.model === "string") wanted.push(`model ${requirements.model}`);
    for (const [key, label] of [["images", "image input"], ["json", "JSON output"], ["tools", "tool calling"]]) {
      if (requirements[key] === true) wanted.push(label);
    }
    const { node, buttons } = this.chooserCandidates(item);
    item.candidatesNode = node;
    // Shown again after a pick on a list that has changed since (the runtime
    // binds only what the person saw): say why the dialog is back.
    const changed = revisionOf(data.revision) > 0
      ? el("p", { class: "changed", id: `${id}-changed` }, "The connections changed while this request waited; these are the ones that fit now.")
      : null;
    const cancel = el("button", { type: "button", class: "secondary", id: `${id}-cancel` }, "Cancel");
    cancel.addEventListener("click", () => this.deny(item));
    const dialog = this.dialogFor(item, id, "Choose a model", [
      el("strong", {}, nappletLabel(data.napplet)),
      " asks to use a language model.",
      wanted.length > 0 ? ` It requires: ${wanted.join(", ")}.` : "",
      " Choosing one does not send anything yet; you will be asked before each request.",
    ], [changed, node], [cancel]);
    item.guard = new ArmGuard(dialog, buttons);
    item.cancelButton = cancel;
    return { dialog, initialFocus: cancel };
  }

  /** The chooser's candidate list (or the "none fits" text) and its buttons. */
  chooserCandidates(item) {
    const candidates = Array.isArray(item.data.candidates) ? item.data.candidates : [];
    // The revision these rows show: a click answers with it, whatever the
    // list shows by the time the runtime reads the answer.
    const revision = revisionOf(item.data.revision);
    const list = el("ul", { class: "candidates" });
    const buttons = [];
    // Ids stay unique when `updateChooser` renders the list again.
    item.renders = (item.renders ?? 0) + 1;
    const id = `${item.dialogId ?? "chooser"}-r${item.renders}`;
    for (const candidate of candidates) {
      if (!candidate || typeof candidate !== "object" || typeof candidate.id !== "string") continue;
      // Screen readers: the button's visible text is its name (voice control
      // users say what they see); the capabilities, outside it, describe it.
      const cid = `${id}-c${buttons.length}`;
      const badges = capabilityBadges(candidate.capabilities);
      // The items, not the list: a list's own label ("Capabilities") would replace them.
      const capIds = [...badges.children].map((item, index) => {
        item.id = `${cid}-cap${index}`;
        return item.id;
      });
      const button = el(
        "button",
        {
          type: "button",
          class: "candidate",
          dataset: { candidateId: candidate.id },
          "aria-describedby": capIds.join(" "),
        },
        el("span", { class: "candidate-name" }, str(candidate.name, candidate.id)),
        el("span", { class: "candidate-model" }, `Model: ${str(candidate.model)}`),
        el("span", { class: "candidate-route" }, `Route: ${str(candidate.route)}`),
        candidate.charges === true ? el("span", { class: "badge warn" }, "may charge") : null,
      );
      button.addEventListener("click", (event) => {
        if (this.current === item && item.guard.deliberate(event, button)) {
          this.grant(item, JSON.stringify({ id: candidate.id, revision }));
        }
      });
      buttons.push(button);
      list.append(el("li", {}, button, badges));
    }
    const node = list.children.length === 0
      ? el("p", { class: "empty" }, "No connection meets these requirements. Add one in the Connections panel.")
      : list;
    return { node, buttons };
  }

  buildConsent(item) {
    const data = item.data;
    const id = `consent-${Math.random().toString(36).slice(2)}`;
    const connection = data.connection && typeof data.connection === "object" ? data.connection : {};
    const rememberId = `${id}-remember`;
    const remember = el("input", { type: "checkbox", id: rememberId, class: "remember" });
    const rememberRow = el(
      "p",
      { class: "remember-row" },
      remember,
      " ",
      el("label", { for: rememberId }, "Allow this napplet on this connection until I close the page"),
    );
    const deny = el("button", { type: "button", class: "secondary deny", id: `${id}-deny` }, "Deny");
    const allow = el("button", { type: "button", class: "primary allow", id: `${id}-allow` }, "Allow");
    deny.addEventListener("click", () => this.deny(item));
    allow.addEventListener("click", (event) => {
      if (this.current === item && item.guard.deliberate(event, allow)) {
        this.grant(item, JSON.stringify({ allow: true, remember: remember.checked, digest: str(data.digest) }));
      }
    });
    remember.addEventListener("click", (event) => {
      // An accidental click must not tick it: undo the toggle.
      if (!item.guard.deliberate(event, remember)) event.preventDefault();
    });
    const dialog = this.dialogFor(item, id, "Send this request?", [
      el("strong", {}, nappletLabel(data.napplet)),
      ` wants to send a request to ${str(connection.name, "a connection")}.`,
    ], [disclosureFacts(data), rememberRow], [deny, allow]);
    item.guard = new ArmGuard(dialog, [allow, remember]);
    return { dialog, initialFocus: deny };
  }
}
