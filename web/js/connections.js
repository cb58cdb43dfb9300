/**
 * The connections panel: the user's connections, the standing consent
 * grants and the shell's notices (docs/design.md, "Connection", "Consent").
 *
 * Rules
 * - The list is whatever the runtime last sent (`connectionsChanged`); it
 *   never contains a credential, only `hasCredential`.
 * - The secret field (token / API key) is a password input that is never
 *   filled back: blank on edit means "keep the saved one" (`credential:
 *   null`). Its value is never logged or kept after the form closes.
 * - Add / edit / remove call the runtime with JSON text
 *   `{"name","kind","model","settings","credential","capabilities","charges"}`.
 * - Only connections the user made (`settings.userDefined`) can be edited
 *   or removed; built-in ones belong to the runtime.
 * - Every value is inserted as text, never as markup.
 * - A connection whose model files the shell can list (offline.js) has a
 *   "Download for offline use" button: the files are stored without
 *   loading the model, on a device that cannot run it too.
 * - The connection kinds (labels, one-line summaries, which form fields a
 *   kind has, what a device needs to run it) are the runtime's
 *   (napllm.kinds), published once at start (`napllmHost.connectionKinds`);
 *   this module keeps no copy. The form starts with the kind: its other
 *   fields appear once one is picked.
 * - Capability badges say what a connection can do ("reads images",
 *   "JSON output", "calls tools", or "text only"), never what it cannot.
 * - Connections this device cannot run are listed last, in a collapsed group
 *   per need ("Needs a GPU with WebGPU") that says how to get it.
 * - "Look for running servers" probes local model servers only when pressed
 *   (the runtime's `discoverServers`, napllm.discovery): each server found
 *   lists its models, and picking one fills the form; a server that refuses
 *   this page shows the runtime's fix for that server.
 * - When another tab saves connections (storage.js tells this one), the
 *   runtime re-reads them (`syncConnections`) and pushes the new lists; the
 *   same happens once at attach. Its answer `{"unreadable": n}` is shown as
 *   "n saved connection(s) could not be read by this version" (such entries
 *   are kept as they are, never overwritten).
 */

import { el, focusableHeading, keepFocus, str, whileBusy } from "./dom.js";
import { isObjectOrArray, parseJsonOr } from "./json.js";
import { CONNECTIONS_LISTED, fileRemovalOffer, offlineControl } from "./offline.js";
import { onConnectionsChanged } from "./storage.js";

function parseList(text) {
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

const USERINFO_TEXT =
  "The URL must not contain a user name or password (user:secret@). Put the token or API key in the Access token / API key field instead.";
const QUERY_TEXT =
  "The base URL must not have a query (?...) or fragment (#...). Put a token or API key in the Access token / API key field instead.";

/**
 * Why a URL typed in the form may not be used, or null. Secrets belong in
 * the token field only: user info is refused in any URL, a query or
 * fragment in a base URL (`base`). The runtime checks the same
 * (napllm.connections.check_base_url); this only answers sooner, so the
 * text never even reaches it. The message never repeats the URL.
 */
export function urlSecretProblem(value, base) {
  const text = String(value ?? "");
  if (!text) return null;
  let url;
  try {
    url = new URL(text);
  } catch {
    return null;
  }
  if (url.username || url.password || /^[a-z][a-z0-9+.-]*:\/\/[^/?#]*@/i.test(text)) return USERINFO_TEXT;
  if (base && (url.search || url.hash || text.includes("?") || text.includes("#"))) return QUERY_TEXT;
  return null;
}

/** The localStorage key that records that the shared-origin warning was shown. */
export const SHARED_ORIGIN_KEY = "napllm.sharedOriginWarningShown";

export const SHARED_ORIGIN_TEXT =
  "This shell runs in a folder of a shared github.io site: every other page of that site can read the access tokens saved here (they are kept in this origin's IndexedDB). Serve napllm from a dedicated origin (its own domain or subdomain) before saving tokens you care about.";

/**
 * Whether the page at `href` shares its origin with other sites: a page
 * under a path (a project page, `user.github.io/project/`) on a
 * `*.github.io` host, whose origin `user.github.io` every other project of
 * that user shares. Pure: `href` is any URL text; false when unparsable.
 */
export function isSharedOriginPath(href) {
  let url;
  try {
    url = new URL(String(href));
  } catch {
    return false;
  }
  const host = url.hostname.toLowerCase().replace(/\.$/, "");
  if (host === "github.io" || !host.endsWith(".github.io")) return false;
  const folder = url.pathname.slice(0, url.pathname.lastIndexOf("/") + 1);
  return folder !== "/";
}

/**
 * Show the shared-origin warning once (ever, per origin) when the page is
 * on a shared origin (`isSharedOriginPath(href)`) and a connection in
 * `listJson` (public summaries) has a saved token. `storage` is
 * localStorage-like (`getItem`/`setItem`; failures are ignored, and then the
 * warning shows once per page); `notify(level, text)` shows it.
 * Returns whether it was shown now.
 */
export function warnSharedOrigin(listJson, href, storage, notify) {
  if (!isSharedOriginPath(href)) return false;
  if (!parseList(listJson).some((item) => item.hasCredential === true)) return false;
  try {
    if (storage && storage.getItem(SHARED_ORIGIN_KEY) === "1") return false;
  } catch {
    // Storage refused: fall back to once per page.
  }
  if (warnSharedOrigin.shown) return false;
  warnSharedOrigin.shown = true;
  try {
    if (storage) storage.setItem(SHARED_ORIGIN_KEY, "1");
  } catch {
    // Ignored: see above.
  }
  notify("warning", SHARED_ORIGIN_TEXT);
  return true;
}
warnSharedOrigin.shown = false;

/** The text of a runtime failure safe to show in the form (never a traceback). */
function failureText(result) {
  if (typeof result === "string") {
    // Not a structured answer: nothing to show.
    const value = parseJsonOr(result, null, isObjectOrArray);
    if (value && typeof value.error === "string") return value.error;
  }
  return null;
}

/** Fallback label of a kind the runtime did not describe (or before it did). */
const UNKNOWN_KIND = { label: "", summary: "" };

/** Words for a discovery finding's status (napllm.discovery.Finding). */
const FOUND_STATUS = {
  found: "Running.",
  "needs-key": "Running, and it asks for a key.",
  cors: "Running, but it does not accept requests from this page.",
  blocked: "The browser did not let this page reach it.",
  "not-a-model-server": "Something else answers on this port.",
};

export class ConnectionsPanel {
  /**
   * @param {HTMLElement} root the connections section (ids in index.html).
   * @param {() => object|null} runtime the attached runtime API or null.
   */
  constructor(root, runtime) {
    this.root = root;
    this.runtime = runtime;
    this.connections = [];
    this.grants = [];
    /** kind -> the runtime's record of it (napllm.kinds); empty until published. */
    this.kinds = new Map();
    /** connection id -> {label, fraction}: model download/load progress of an engine. */
    this.progress = new Map();
    /** connection id -> {revision, requests, nextTurn, turns}: a scripted connection's use. */
    this.scriptUse = new Map();
    // Bumped by every push, so a slower read at attach never overwrites a newer list.
    this.connectionsVersion = 0;
    this.grantsVersion = 0;
    this.editing = null;
    this.discoverySerial = 0;
    this.list = root.querySelector("#connection-list");
    this.grantList = root.querySelector("#grant-list");
    this.addButton = root.querySelector("#connection-add");
    this.form = root.querySelector("#connection-form");
    this.formTitle = root.querySelector("#connection-form-title");
    this.formError = root.querySelector("#connection-form-error");
    this.fields = {
      name: this.form.querySelector("#connection-name"),
      kind: this.form.querySelector("#connection-kind"),
      baseUrl: this.form.querySelector("#connection-base-url"),
      forwardsTo: this.form.querySelector("#connection-forwards-to"),
      modelUrl: this.form.querySelector("#connection-model-url"),
      script: this.form.querySelector("#connection-script"),
      model: this.form.querySelector("#connection-model"),
      secret: this.form.querySelector("#connection-secret"),
      json: this.form.querySelector("#connection-cap-json"),
      tools: this.form.querySelector("#connection-cap-tools"),
      images: this.form.querySelector("#connection-cap-images"),
      charges: this.form.querySelector("#connection-charges"),
    };
    this.kindSummary = this.form.querySelector("#connection-kind-summary");
    this.kindFields = this.form.querySelector("#connection-kind-fields");
    this.modelHint = this.form.querySelector("#connection-model-hint");
    this.secretLabel = this.form.querySelector("#connection-secret-label");
    this.secretHint = this.form.querySelector("#connection-secret-hint");
    this.discovery = this.form.querySelector("#connection-discovery");
    this.discoverButton = this.form.querySelector("#connection-discover");
    this.discoveryResults = this.form.querySelector("#connection-discovery-results");
    this.addButton.addEventListener("click", () => this.openForm(null));
    this.fields.kind.addEventListener("change", () => this.applyKind());
    this.discoverButton.addEventListener("click", () => this.discover());
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.submit();
    });
    this.form.querySelector("#connection-cancel").addEventListener("click", () => this.closeForm());
    this.form.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault();
        this.closeForm();
      }
    });
    this.unreadable = el("p", { id: "connections-unreadable", class: "notice warning", role: "status", hidden: true });
    this.list.after(this.unreadable);
    this.syncing = null;
    this.syncAgain = false;
    onConnectionsChanged(() => this.sync());
    this.setReady(false);
    this.renderConnections();
    this.renderGrants();
  }

  /** `napllmHost.connectionKinds`: the kinds the runtime supports (JSON text, napllm.kinds). */
  setKinds(listJson) {
    this.kinds = parseKinds(listJson);
    const options = [new Option("Choose a kind…", "")];
    for (const [kind, info] of this.kinds) {
      if (info.testOnly !== true) options.push(new Option(info.label, kind));
    }
    this.fields.kind.replaceChildren(...options);
    this.renderConnections();
  }

  /** The runtime's record of `kind`, or a bare one naming it. */
  kindInfo(kind) {
    return this.kinds.get(kind) ?? { ...UNKNOWN_KIND, label: str(kind) };
  }

  /** Enable editing once the runtime is attached (and read the stored connections again). */
  setReady(ready) {
    this.addButton.disabled = !ready;
    this.root.querySelector("#connections-waiting").hidden = ready;
    if (ready) this.sync();
  }

  /**
   * Ask the runtime to re-read the stored connections (one sync at a time;
   * a change announced during a sync runs one more). Without a runtime the
   * change is picked up at attach.
   */
  sync() {
    const runtime = this.runtime();
    if (!runtime || typeof runtime.syncConnections !== "function") return;
    if (this.syncing) {
      this.syncAgain = true;
      return;
    }
    this.syncing = (async () => {
      do {
        this.syncAgain = false;
        try {
          this.showUnreadable(await runtime.syncConnections());
        } catch (error) {
          console.error("napllm: could not read the stored connections", error?.name ?? "");
        }
      } while (this.syncAgain);
    })().finally(() => {
      this.syncing = null;
    });
  }

  /** Show how many stored entries this version cannot read (`{"unreadable": n}` JSON text). */
  showUnreadable(answer) {
    const value = parseJsonOr(answer, null, isObjectOrArray);
    const count = Number.isSafeInteger(value?.unreadable) && value.unreadable > 0 ? value.unreadable : 0;
    this.unreadable.hidden = count === 0;
    this.unreadable.textContent = count === 1
      ? "1 saved connection could not be read by this version. It is kept unchanged."
      : `${count} saved connections could not be read by this version. They are kept unchanged.`;
    this.unreadable.dataset.count = String(count);
  }

  /** `napllmHost.connectionsChanged`. */
  update(listJson) {
    this.connectionsVersion += 1;
    this.connections = parseList(listJson);
    this.renderConnections();
    document.dispatchEvent(new CustomEvent(CONNECTIONS_LISTED, { detail: this.connections }));
  }

  /**
   * `napllmHost.engineProgress`: a model download or load of a connection.
   * Shown as a progress bar in that connection's entry; removed when the
   * fraction reaches 1 (ready) or is negative (the load failed; the runtime
   * reports the failure itself as a notice).
   */
  setProgress(connectionId, label, fraction) {
    const value = Number.isFinite(fraction) ? fraction : 0;
    if (value >= 1 || value < 0) this.progress.delete(connectionId);
    else this.progress.set(connectionId, { label: str(label), fraction: value });
    const entry = [...this.list.querySelectorAll("li.connection")].find(
      (node) => node.dataset.connectionId === connectionId,
    );
    if (!entry) return;
    const shown = entry.querySelector(".engine-progress");
    const state = this.progress.get(connectionId);
    if (shown && state) {
      // Updated in place: a live region replaced on every step is announced
      // erratically (or not at all) by screen readers.
      shown.querySelector("span").textContent = `${state.label} (${Math.round(state.fraction * 100)}%)`;
      const meter = shown.querySelector("progress");
      meter.value = state.fraction;
      meter.setAttribute("aria-label", state.label);
      return;
    }
    shown?.remove();
    const bar = this.renderProgress(connectionId);
    if (bar) entry.querySelector(".route")?.after(bar);
  }

  /**
   * `napllmHost.scriptProgress`: JSON text `{"connectionId", "revision",
   * "requests", "stopped", "nextTurn" (1-based or null), "turns"}` after
   * each request a scripted connection received and each stream stopped
   * before its end. Shown in its entry as "Requests received: N, M stopped
   * before the end" (docs/napplets.md), for the revision it was counted for.
   */
  setScriptProgress(progressJson) {
    let value = null;
    try {
      value = JSON.parse(String(progressJson));
    } catch {
      return;
    }
    const count = (n) => (Number.isSafeInteger(n) && n >= 0 ? n : 0);
    if (!value || typeof value !== "object" || typeof value.connectionId !== "string") return;
    const use = {
      revision: count(value.revision),
      requests: count(value.requests),
      stopped: count(value.stopped),
      nextTurn: value.nextTurn === null ? null : count(value.nextTurn),
      turns: count(value.turns),
    };
    this.scriptUse.set(value.connectionId, use);
    const entry = [...this.list.querySelectorAll("li.connection")].find(
      (node) => node.dataset.connectionId === value.connectionId,
    );
    const item = this.connections.find((c) => str(c.id) === value.connectionId);
    if (!entry || !item) return;
    entry.querySelector(".script-progress")?.replaceWith(this.renderScriptProgress(item));
  }

  renderScriptProgress(item) {
    if (item.kind !== "scripted") return null;
    const stored = this.scriptUse.get(str(item.id));
    // A new revision (an edit) starts the script again: its count starts at 0.
    const use = stored && stored.revision === item.revision
      ? stored
      : { requests: 0, stopped: 0, nextTurn: 1, turns: 0 };
    const next = use.nextTurn === null
      ? "no turn left"
      : use.turns > 0 ? `next turn ${use.nextTurn} of ${use.turns}` : `next turn ${use.nextTurn}`;
    const stopped = use.stopped > 0 ? `, ${use.stopped} stopped before the end` : "";
    return el(
      "p",
      {
        class: "script-progress",
        role: "status",
        dataset: { requests: String(use.requests), stopped: String(use.stopped) },
      },
      `Requests received: ${use.requests}${stopped} (${next})`,
    );
  }

  renderProgress(connectionId) {
    const state = this.progress.get(connectionId);
    if (!state) return null;
    const percent = Math.round(state.fraction * 100);
    return el(
      "div",
      { class: "engine-progress", role: "status" },
      el("span", {}, `${state.label} (${percent}%)`),
      el("progress", { max: "1", value: String(state.fraction), "aria-label": state.label }),
    );
  }

  /** `napllmHost.grantsChanged`. */
  updateGrants(listJson) {
    this.grantsVersion += 1;
    this.grants = parseList(listJson);
    this.renderGrants();
  }

  /**
   * The list: connections that can run here, then one collapsed group per
   * need of those that cannot (`li.unavailable-group`, a `<details>` saying
   * what is needed and how to get it, with those connections inside).
   */
  renderConnections() {
    // A re-render (after Save, Remove or a push) keeps the keyboard focus on
    // the same control of the same entry, the next entry, or "Add connection".
    keepFocus(this.list, () => {
      if (this.connections.length === 0) {
        this.list.replaceChildren(el("li", { class: "empty" }, "No connections yet."));
        return;
      }
      const ready = this.connections.filter((item) => item.available !== false);
      const groups = new Map();
      for (const item of this.connections) {
        if (item.available !== false) continue;
        const info = this.kindInfo(item.kind);
        const needs = str(info.needs) || "Not available on this device";
        if (!groups.has(needs)) groups.set(needs, { how: str(info.needsHow), items: [] });
        groups.get(needs).items.push(item);
      }
      const entries = ready.map((item) => this.renderConnection(item, false));
      for (const [needs, group] of groups) {
        const count = group.items.length;
        entries.push(
          el(
            "li",
            { class: "unavailable-group" },
            el(
              "details",
              {},
              el("summary", {}, `${needs} (${count} ${count === 1 ? "model" : "models"})`),
              group.how ? el("p", { class: "how" }, group.how) : null,
              el("ul", { class: "connection-list quiet" }, ...group.items.map((item) => this.renderConnection(item, true))),
            ),
          ),
        );
      }
      this.list.replaceChildren(...entries);
    }, () => (this.addButton.disabled ? null : this.addButton));
  }

  renderConnection(item, quiet) {
    const id = str(item.id);
    const badges = el("ul", { class: "badges", "aria-label": "Can do" });
    for (const word of canDo(item.capabilities)) badges.append(el("li", { class: "badge on" }, word));
    if (item.charges === true) badges.append(el("li", { class: "badge warn" }, "may charge"));
    if (item.hasCredential === true) badges.append(el("li", { class: "badge info" }, "credential saved"));
    const availability = quiet
      ? el("p", { class: "unavailable-reason" }, str(item.unavailableReason ?? item.unavailable_reason, "This device cannot run it."))
      : el("p", { class: "available" }, "Available");
    const headingId = `connection-${id.replace(/[^A-Za-z0-9_-]/g, "_")}-name`;
    const edit = el("button", { type: "button", class: "edit", "aria-describedby": headingId }, "Edit");
    edit.addEventListener("click", () => this.openForm(item));
    const remove = el("button", { type: "button", class: "remove danger", "aria-describedby": headingId }, "Remove");
    const actions = el("div", { class: "row-actions" }, edit, remove);
    remove.addEventListener("click", () => this.confirmRemove(item, actions));
    if (!this.runtime()) {
      edit.disabled = true;
      remove.disabled = true;
    }
    const settings = item.settings && typeof item.settings === "object" ? item.settings : {};
    if (settings.userDefined !== true) {
      // Built-in and test connections belong to the runtime, not the user.
      actions.replaceChildren(el("p", { class: "muted" }, "Provided by napllm"));
    }
    return el(
      "li",
      { class: quiet ? "connection quiet" : "connection", dataset: { connectionId: id, focusKey: id } },
      el("h3", { id: headingId }, str(item.name, id)),
      el("p", { class: "kind" }, this.kindInfo(item.kind).label),
      el("p", {}, "Model: ", el("code", {}, str(item.model))),
      el("p", { class: "route" }, `Route: ${str(item.route)}`),
      this.renderScriptProgress(item),
      this.renderProgress(id),
      quiet ? null : badges,
      availability,
      offlineControl(item, (connectionId, label, fraction) => this.setProgress(connectionId, label, fraction)),
      actions,
    );
  }

  confirmRemove(item, actions) {
    const yes = el("button", { type: "button", class: "danger confirm-remove" }, "Remove");
    const no = el("button", { type: "button", class: "secondary" }, "Keep");
    const question = el("p", { class: "confirm", role: "group", "aria-label": "Confirm removal" },
      `Remove “${str(item.name)}”? Napplets using it must select again. `, yes, " ", no);
    const saved = [...actions.childNodes];
    actions.replaceChildren(question);
    no.focus();
    // Its downloaded model files may go with it (offline.js).
    const offer = fileRemovalOffer(item, this.connections).then((found) => {
      if (found && question.isConnected) question.append(" ", found.element);
      return found;
    });
    no.addEventListener("click", () => {
      actions.replaceChildren(...saved);
      saved[1].focus();
    });
    yes.addEventListener("click", async () => {
      const runtime = this.runtime();
      if (!runtime) return;
      try {
        await runtime.removeConnection(str(item.id));
        await (await offer)?.remove();
      } catch (error) {
        console.error("napllm: removeConnection failed", error?.name ?? "");
        actions.replaceChildren(...saved);
        saved[1].focus();
      }
    });
  }

  renderGrants() {
    keepFocus(this.grantList, () => this.renderGrantItems(), () => focusableHeading(this.root.querySelector("#grants-heading")));
  }

  renderGrantItems() {
    if (this.grants.length === 0) {
      this.grantList.replaceChildren(el("li", { class: "empty" }, "No standing permissions."));
      return;
    }
    this.grantList.replaceChildren(
      ...this.grants.map((grant) => {
        const napplet = grant.napplet && typeof grant.napplet === "object" ? grant.napplet : {};
        const connection = str(grant.connectionName) || str(grant.connectionId);
        const text = `${str(napplet.name, "napplet")} (#${str(napplet.shortHash)}) may use ${connection} in profile ${str(grant.account)}`;
        const revoke = el("button", { type: "button", class: "revoke" }, "Revoke");
        revoke.setAttribute("aria-label", `Revoke: ${text}`);
        revoke.addEventListener("click", () => {
          const runtime = this.runtime();
          if (!runtime) return;
          whileBusy(revoke, async () => {
            try {
              await runtime.revokeGrant(str(grant.key));
            } catch (error) {
              console.error("napllm: revokeGrant failed", error?.name ?? "");
            }
          });
        });
        return el("li", { class: "grant", dataset: { grantKey: str(grant.key), focusKey: str(grant.key) } }, el("span", {}, text), " ", revoke);
      }),
    );
  }

  openForm(item) {
    // The control that opened the form (Add or an entry's Edit) gets the focus back.
    if (this.form.hidden || !this.form.contains(document.activeElement)) this.returnFocus = document.activeElement;
    this.editing = item;
    this.form.reset();
    this.formError.textContent = "";
    this.discoveryResults.replaceChildren();
    this.fields.kind.disabled = item !== null;
    if (item) {
      this.formTitle.textContent = `Edit “${str(item.name)}”`;
      const settings = item.settings && typeof item.settings === "object" ? item.settings : {};
      const caps = item.capabilities && typeof item.capabilities === "object" ? item.capabilities : {};
      if (![...this.fields.kind.options].some((option) => option.value === item.kind)) {
        this.fields.kind.append(new Option(this.kindInfo(item.kind).label, str(item.kind)));
      }
      this.fields.kind.value = str(item.kind);
      this.fields.name.value = str(item.name);
      this.fields.baseUrl.value = str(settings.baseUrl);
      this.fields.forwardsTo.value = str(settings.forwardsTo);
      this.fields.modelUrl.value = str(settings.url);
      this.fields.script.value = str(settings.script);
      this.fields.model.value = str(item.model);
      this.fields.json.checked = caps.json === true;
      this.fields.tools.checked = caps.tools === true;
      this.fields.images.checked = caps.images === true;
      this.fields.charges.checked = item.charges === true;
    } else {
      this.formTitle.textContent = "Add a connection";
      this.fields.kind.value = "";
    }
    this.applyKind();
    this.form.hidden = false;
    this.addButton.setAttribute("aria-expanded", "true");
    (item ? this.fields.name : this.fields.kind).focus();
  }

  closeForm() {
    this.form.reset();
    this.form.hidden = true;
    this.discoverySerial += 1;
    this.discoveryResults.replaceChildren();
    this.addButton.setAttribute("aria-expanded", "false");
    const editedId = this.editing ? str(this.editing.id) : null;
    this.editing = null;
    const back = this.returnFocus;
    this.returnFocus = null;
    // After a Save the entry may have been re-rendered: its new Edit button.
    const entry = editedId === null
      ? null
      : [...this.list.querySelectorAll("li.connection")].find((node) => node.dataset.connectionId === editedId);
    const target = back instanceof HTMLElement && back.isConnected && !back.disabled
      ? back
      : entry?.querySelector("button.edit") ?? (this.addButton.disabled ? null : this.addButton);
    if (target) target.focus();
  }

  /** The kind record the form is for (the edited connection's, else the chosen one), or null. */
  formKind() {
    const name = this.editing ? this.editing.kind : this.fields.kind.value;
    return name ? this.kindInfo(name) : null;
  }

  /**
   * Show only the fields of the chosen kind (hidden ones are disabled, so
   * never validated); with no kind chosen yet only the kind and name show.
   */
  applyKind() {
    const kind = this.formKind();
    const picked = kind !== null;
    const info = kind ?? UNKNOWN_KIND;
    this.kindSummary.textContent = str(info.summary);
    this.kindFields.hidden = !picked;
    const show = (field, on) => {
      const group = field.closest(".field");
      group.hidden = !on;
      field.disabled = !on;
    };
    show(this.fields.baseUrl, info.baseUrl === true);
    show(this.fields.forwardsTo, info.forwardsTo === true);
    show(this.fields.modelUrl, info.modelUrl === true);
    show(this.fields.secret, typeof info.secretLabel === "string");
    show(this.fields.script, info.script === true);
    show(this.fields.model, picked);
    this.fields.script.required = info.script === true;
    this.fields.baseUrl.required = info.baseUrl === true;
    this.fields.modelUrl.required = info.modelUrl === true;
    this.fields.model.required = picked && info.modelUrl !== true && info.script !== true;
    this.modelHint.textContent = str(info.modelHint);
    const capGroup = this.form.querySelector("#connection-capabilities");
    capGroup.hidden = info.declareCapabilities !== true;
    capGroup.disabled = info.declareCapabilities !== true;
    const chargeGroup = this.fields.charges.closest(".field");
    chargeGroup.hidden = info.askCharges !== true;
    this.fields.charges.disabled = info.askCharges !== true;
    this.discovery.hidden = info.discover !== true;
    this.discoverButton.disabled = info.discover !== true;
    if (typeof info.secretLabel === "string") {
      this.secretLabel.textContent = info.secretLabel;
      const saved = this.editing && this.editing.hasCredential === true;
      this.secretHint.textContent = saved
        ? "A secret is saved. Leave blank to keep it."
        : "Optional. Stored only in this browser's shell storage, never given to napplets.";
    }
  }

  /**
   * "Look for running servers": ask the runtime to probe the usual local
   * ports (napllm.discovery) and list what answered. A typed secret goes
   * only to servers of the chosen kind, and only to the base URL's address
   * when one is filled in (the runtime's `secret_goes_to`).
   */
  async discover() {
    const runtime = this.runtime();
    if (!runtime || typeof runtime.discoverServers !== "function") return;
    const serial = (this.discoverySerial += 1);
    const kind = this.editing ? str(this.editing.kind) : this.fields.kind.value;
    this.discoverButton.disabled = true;
    this.discoveryResults.replaceChildren(el("p", { class: "muted" }, "Looking for model servers on this computer…"));
    let servers = [];
    try {
      const answer = JSON.parse(String(await runtime.discoverServers(location.origin, kind, this.fields.secret.value, this.fields.baseUrl.value)));
      servers = Array.isArray(answer?.servers) ? answer.servers.filter((s) => s && typeof s === "object") : [];
    } catch (error) {
      console.error("napllm: discoverServers failed", error?.name ?? "");
      servers = [];
    } finally {
      if (serial === this.discoverySerial) this.discoverButton.disabled = false;
    }
    if (serial !== this.discoverySerial) return; // the form was closed or asked again meanwhile
    this.renderDiscovery(servers);
  }

  /** Show the servers `discover` found (`Finding.to_json()` records). */
  renderDiscovery(servers) {
    const seen = servers.filter((s) => typeof FOUND_STATUS[s.status] === "string");
    const unreadable = servers.filter((s) => s.status === "unreadable");
    const absent = servers.filter((s) => s.status === "absent").map((s) => `${str(s.label)} (${str(s.address)})`);
    const nodes = seen.map((server) => {
      const label = `${str(server.label, "A server")} at ${str(server.address)}`;
      const models = Array.isArray(server.models) ? server.models.filter((m) => typeof m === "string") : [];
      const status = server.status === "found" && models.length === 0
        ? "Running, but it lists no models."
        : FOUND_STATUS[server.status] ?? "";
      const list = el("ul", { class: "found-models" });
      for (const model of models) {
        const use = el("button", { type: "button", class: "secondary use-model", dataset: { model } }, `Use ${model}`);
        use.addEventListener("click", () => this.useFound(server, model));
        list.append(el("li", {}, use));
      }
      return el(
        "li",
        { class: "found-server", dataset: { server: str(server.server), status: str(server.status) } },
        el("h4", {}, label),
        el("p", {}, status),
        str(server.fix) ? el("p", { class: "fix" }, str(server.fix)) : null,
        models.length > 0 ? list : null,
      );
    });
    const summary = seen.length === 0
      ? "No model server answered on this computer."
      : `${seen.length} ${seen.length === 1 ? "server" : "servers"} found.`;
    // A cross-origin isolated page cannot tell "refuses this page" from "not
    // running": those addresses are listed, collapsed, with what to change if one runs.
    const unsure = unreadable.length === 0
      ? null
      : el(
        "details",
        { class: "unreadable-servers" },
        el("summary", {}, `Nothing this page could read at ${unreadable.map((s) => `${str(s.label)} (${str(s.address)})`).join(", ")}. Is one of them running?`),
        el(
          "ul",
          {},
          ...unreadable.map((server) => el("li", { dataset: { server: str(server.server) } }, str(server.fix))),
        ),
      );
    this.discoveryResults.replaceChildren(
      el("p", { class: "discovery-summary" }, summary),
      nodes.length > 0 ? el("ul", { class: "found-servers" }, ...nodes) : null,
      unsure,
      absent.length > 0 ? el("p", { class: "muted" }, `Nothing answered at: ${absent.join(", ")}.`) : null,
    );
  }

  /** Fill the form from a found server and one of its models. */
  useFound(server, model) {
    if (!this.editing && this.kinds.has(server.kind) && this.fields.kind.value !== server.kind) {
      this.fields.kind.value = server.kind;
      this.applyKind();
    }
    this.fields.baseUrl.value = str(server.baseUrl);
    this.fields.model.value = model;
    if (!this.fields.name.value.trim()) this.fields.name.value = `${model} (${str(server.label)})`;
    this.fields.model.focus();
  }

  /** The JSON text sent to `addConnection` / `editConnection`. */
  formJson() {
    const kindName = this.editing ? this.editing.kind : this.fields.kind.value;
    const kind = this.kindInfo(kindName);
    const settings = {};
    if (kind.baseUrl === true) settings.baseUrl = this.fields.baseUrl.value.trim();
    if (kind.forwardsTo === true && this.fields.forwardsTo.value.trim()) settings.forwardsTo = this.fields.forwardsTo.value.trim();
    if (kind.modelUrl === true) settings.url = this.fields.modelUrl.value.trim();
    if (kind.script === true) settings.script = this.fields.script.value;
    let model = this.fields.model.value.trim();
    if (!model && kind.modelUrl === true) model = modelFromGgufUrl(settings.url);
    if (!model && kind.script === true) model = "scripted";
    const secret = typeof kind.secretLabel === "string" ? this.fields.secret.value : "";
    const capabilities = kind.declareCapabilities === true
      ? { json: this.fields.json.checked, tools: this.fields.tools.checked, images: this.fields.images.checked }
      : {};
    return JSON.stringify({
      name: this.fields.name.value.trim(),
      kind: kindName,
      model,
      settings,
      credential: secret === "" ? null : secret,
      capabilities,
      charges: kind.askCharges === true ? this.fields.charges.checked : false,
    });
  }

  async submit() {
    const runtime = this.runtime();
    if (!runtime) return;
    if (this.form.querySelector("#connection-save").getAttribute("aria-disabled") === "true") return;
    if (!this.form.reportValidity()) return;
    const kind = this.formKind();
    if (kind === null) {
      this.formError.textContent = "Choose a kind of connection first.";
      this.fields.kind.focus();
      return;
    }
    if (kind.modelUrl === true && !this.fields.model.value.trim() && !modelFromGgufUrl(this.fields.modelUrl.value.trim())) {
      this.formError.textContent = "Enter a model id: the GGUF URL has no file name.";
      return;
    }
    const problem =
      (kind.baseUrl === true ? urlSecretProblem(this.fields.baseUrl.value.trim(), true) : null) ??
      (kind.modelUrl === true ? urlSecretProblem(this.fields.modelUrl.value.trim(), false) : null);
    if (problem) {
      this.formError.textContent = problem;
      (typeof kind.secretLabel === "string" ? this.fields.secret : this.fields.baseUrl).focus();
      return;
    }
    const json = this.formJson();
    this.formError.textContent = "";
    const save = this.form.querySelector("#connection-save");
    // Busy, not disabled: disabling the focused Save button drops the focus to <body>.
    save.setAttribute("aria-disabled", "true");
    try {
      const result = this.editing
        ? await runtime.editConnection(str(this.editing.id), json)
        : await runtime.addConnection(json);
      const failure = failureText(result);
      if (failure) {
        this.formError.textContent = failure;
        return;
      }
      this.closeForm();
    } catch (error) {
      // The exception text may carry a traceback; show a fixed sentence.
      console.error("napllm: the connection could not be saved", error?.name ?? "");
      this.formError.textContent = "The connection could not be saved. Check the fields and try again.";
    } finally {
      save.removeAttribute("aria-disabled");
    }
  }
}

/** The shell's notices (`napllmHost.notice`), in an aria-live region. */
export class Notices {
  /** @param {HTMLElement} list the aria-live list element. */
  constructor(list, connectionName, limit = 6) {
    this.list = list;
    this.connectionName = connectionName;
    this.limit = limit;
    this.serial = 0;
  }

  /** Show `{level, text, connectionId?}`. */
  show(notice) {
    const level = ["info", "warning", "error"].includes(notice?.level) ? notice.level : "info";
    const text = str(notice?.text);
    if (!text) return;
    const about = typeof notice.connectionId === "string" ? this.connectionName(notice.connectionId) : null;
    const dismiss = el("button", { type: "button", class: "dismiss", "aria-label": "Dismiss notice" }, "×");
    const item = el(
      "li",
      { class: `notice ${level}`, dataset: { level, focusKey: String((this.serial += 1)) } },
      el("span", { class: "level" }, level === "info" ? "Note" : level === "warning" ? "Warning" : "Error"),
      " ",
      el("span", { class: "text" }, about ? `${about}: ${text}` : text),
      dismiss,
    );
    // The focus moves to the next notice's Dismiss (else the napplet area), not <body>.
    dismiss.addEventListener("click", () => keepFocus(this.list, () => item.remove(), () => document.querySelector("#napplet-area")));
    this.list.append(item);
    while (this.list.children.length > this.limit) this.list.firstElementChild.remove();
  }
}
