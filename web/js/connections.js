/**
 * The connections panel: the user's connections, the standing consent
 * grants and the shell's notices (DESIGN.md "Connection", "Consent").
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
 * - When another tab saves connections (storage.js tells this one), the
 *   runtime re-reads them (`syncConnections`) and pushes the new lists; the
 *   same happens once at attach. Its answer `{"unreadable": n}` is shown as
 *   "n saved connection(s) could not be read by this version" (such entries
 *   are kept as they are, never overwritten).
 */

import { el, focusableHeading, keepFocus, str, whileBusy } from "./dom.js";
import { onConnectionsChanged } from "./storage.js";

const KINDS = {
  lmsp: { label: "LMSP service", baseUrl: true, secret: "Access token", capabilities: false, charges: false },
  openai: { label: "OpenAI-compatible server", baseUrl: true, secret: "API key", capabilities: true, charges: true },
  wasm: { label: "llama.cpp in this browser (WebAssembly)", modelUrl: true, capabilities: false, charges: false },
  webllm: { label: "WebLLM on WebGPU", capabilities: false, charges: false },
  // The model id is a Hugging Face hub id (owner/name) or the URL of an ONNX model folder.
  onnx: { label: "ONNX model in this browser (WebGPU)", capabilities: false, charges: false },
  // Napplet development: each generation plays the next turn of a JSON script (docs/napplets.md).
  scripted: { label: "Scripted responses — for napplet development", script: true, capabilities: false, charges: false },
};

function parseList(text) {
  try {
    const value = JSON.parse(text);
    return Array.isArray(value) ? value.filter((item) => item && typeof item === "object") : [];
  } catch {
    return [];
  }
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
    try {
      const value = JSON.parse(result);
      if (value && typeof value === "object" && typeof value.error === "string") return value.error;
    } catch {
      // Not a structured answer: nothing to show.
    }
  }
  return null;
}

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
    /** connection id -> {label, fraction}: model download/load progress of an engine. */
    this.progress = new Map();
    // Bumped by every push, so a slower read at attach never overwrites a newer list.
    this.connectionsVersion = 0;
    this.grantsVersion = 0;
    this.editing = null;
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
      modelUrl: this.form.querySelector("#connection-model-url"),
      script: this.form.querySelector("#connection-script"),
      model: this.form.querySelector("#connection-model"),
      secret: this.form.querySelector("#connection-secret"),
      json: this.form.querySelector("#connection-cap-json"),
      tools: this.form.querySelector("#connection-cap-tools"),
      images: this.form.querySelector("#connection-cap-images"),
      charges: this.form.querySelector("#connection-charges"),
    };
    this.secretLabel = this.form.querySelector("#connection-secret-label");
    this.secretHint = this.form.querySelector("#connection-secret-hint");
    this.addButton.addEventListener("click", () => this.openForm(null));
    this.fields.kind.addEventListener("change", () => this.applyKind());
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
        } catch {
          console.error("napllm: could not read the stored connections");
        }
      } while (this.syncAgain);
    })().finally(() => {
      this.syncing = null;
    });
  }

  /** Show how many stored entries this version cannot read (`{"unreadable": n}` JSON text). */
  showUnreadable(answer) {
    let count = 0;
    try {
      const value = JSON.parse(String(answer));
      count = Number.isSafeInteger(value?.unreadable) && value.unreadable > 0 ? value.unreadable : 0;
    } catch {
      count = 0;
    }
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

  renderConnections() {
    // A re-render (after Save, Remove or a push) keeps the keyboard focus on
    // the same control of the same entry, the next entry, or "Add connection".
    keepFocus(this.list, () => {
      if (this.connections.length === 0) {
        this.list.replaceChildren(el("li", { class: "empty" }, "No connections yet."));
        return;
      }
      this.list.replaceChildren(...this.connections.map((item) => this.renderConnection(item)));
    }, () => (this.addButton.disabled ? null : this.addButton));
  }

  renderConnection(item) {
    const id = str(item.id);
    const caps = item.capabilities && typeof item.capabilities === "object" ? item.capabilities : {};
    const badges = el("ul", { class: "badges", "aria-label": "Capabilities" });
    const badge = (text, on) => badges.append(el("li", { class: on ? "badge on" : "badge off" }, on ? text : `no ${text}`));
    badge("images", caps.images === true);
    badge("JSON", caps.json === true);
    badge("tools", caps.tools === true);
    if (item.charges === true) badges.append(el("li", { class: "badge warn" }, "may charge"));
    if (item.hasCredential === true) badges.append(el("li", { class: "badge info" }, "credential saved"));
    const availability = item.available === false
      ? el("p", { class: "unavailable" }, `Unavailable: ${str(item.unavailableReason ?? item.unavailable_reason, "not supported on this device")}`)
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
    const kindLabel = KINDS[item.kind]?.label ?? str(item.kind);
    return el(
      "li",
      { class: "connection", dataset: { connectionId: id, focusKey: id } },
      el("h3", { id: headingId }, str(item.name, id)),
      el("p", { class: "kind" }, kindLabel),
      el("p", {}, "Model: ", el("code", {}, str(item.model))),
      el("p", { class: "route" }, `Route: ${str(item.route)}`),
      this.renderProgress(id),
      badges,
      availability,
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
    no.addEventListener("click", () => {
      actions.replaceChildren(...saved);
      saved[1].focus();
    });
    yes.addEventListener("click", async () => {
      const runtime = this.runtime();
      if (!runtime) return;
      try {
        await runtime.removeConnection(str(item.id));
      } catch (err) {
        console.error("napllm: removeConnection failed");
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
            } catch {
              console.error("napllm: revokeGrant failed");
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
    this.fields.kind.disabled = item !== null;
    if (item) {
      this.formTitle.textContent = `Edit “${str(item.name)}”`;
      const settings = item.settings && typeof item.settings === "object" ? item.settings : {};
      const caps = item.capabilities && typeof item.capabilities === "object" ? item.capabilities : {};
      this.fields.name.value = str(item.name);
      this.fields.kind.value = KINDS[item.kind] ? item.kind : "lmsp";
      this.fields.baseUrl.value = str(settings.baseUrl);
      this.fields.modelUrl.value = str(settings.url);
      this.fields.script.value = str(settings.script);
      this.fields.model.value = str(item.model);
      this.fields.json.checked = caps.json === true;
      this.fields.tools.checked = caps.tools === true;
      this.fields.images.checked = caps.images === true;
      this.fields.charges.checked = item.charges === true;
    } else {
      this.formTitle.textContent = "Add a connection";
    }
    this.applyKind();
    this.form.hidden = false;
    this.addButton.setAttribute("aria-expanded", "true");
    this.fields.name.focus();
  }

  closeForm() {
    this.form.reset();
    this.form.hidden = true;
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

  /** Show only the fields of the chosen kind (hidden ones are disabled, so never validated). */
  applyKind() {
    const kind = KINDS[this.fields.kind.value] ?? KINDS.lmsp;
    const show = (field, on) => {
      const group = field.closest(".field");
      group.hidden = !on;
      field.disabled = !on;
    };
    show(this.fields.baseUrl, Boolean(kind.baseUrl));
    show(this.fields.modelUrl, Boolean(kind.modelUrl));
    show(this.fields.secret, Boolean(kind.secret));
    show(this.fields.script, Boolean(kind.script));
    this.fields.script.required = Boolean(kind.script);
    this.fields.baseUrl.required = Boolean(kind.baseUrl);
    this.fields.modelUrl.required = Boolean(kind.modelUrl);
    this.fields.model.required = !kind.modelUrl && !kind.script;
    const capGroup = this.form.querySelector("#connection-capabilities");
    capGroup.hidden = !kind.capabilities;
    capGroup.disabled = !kind.capabilities;
    const chargeGroup = this.fields.charges.closest(".field");
    chargeGroup.hidden = !kind.charges;
    this.fields.charges.disabled = !kind.charges;
    if (kind.secret) {
      this.secretLabel.textContent = kind.secret;
      const saved = this.editing && this.editing.hasCredential === true;
      this.secretHint.textContent = saved
        ? "A secret is saved. Leave blank to keep it."
        : "Optional. Stored only in this browser's shell storage, never given to napplets.";
    }
  }

  /** The JSON text sent to `addConnection` / `editConnection`. */
  formJson() {
    const kindName = this.editing ? this.editing.kind : this.fields.kind.value;
    const kind = KINDS[kindName] ?? KINDS.lmsp;
    const settings = {};
    if (kind.baseUrl) settings.baseUrl = this.fields.baseUrl.value.trim();
    if (kind.modelUrl) settings.url = this.fields.modelUrl.value.trim();
    if (kind.script) settings.script = this.fields.script.value;
    let model = this.fields.model.value.trim();
    if (!model && kind.modelUrl) model = modelFromGgufUrl(settings.url);
    if (!model && kind.script) model = "scripted";
    const secret = kind.secret ? this.fields.secret.value : "";
    const capabilities = kind.capabilities
      ? { json: this.fields.json.checked, tools: this.fields.tools.checked, images: this.fields.images.checked }
      : {};
    return JSON.stringify({
      name: this.fields.name.value.trim(),
      kind: kindName,
      model,
      settings,
      credential: secret === "" ? null : secret,
      capabilities,
      charges: kind.charges ? this.fields.charges.checked : false,
    });
  }

  async submit() {
    const runtime = this.runtime();
    if (!runtime) return;
    if (this.form.querySelector("#connection-save").getAttribute("aria-disabled") === "true") return;
    if (!this.form.reportValidity()) return;
    const kind = KINDS[this.editing ? this.editing.kind : this.fields.kind.value] ?? KINDS.lmsp;
    if (kind.modelUrl && !this.fields.model.value.trim() && !modelFromGgufUrl(this.fields.modelUrl.value.trim())) {
      this.formError.textContent = "Enter a model id: the GGUF URL has no file name.";
      return;
    }
    const problem =
      (kind.baseUrl ? urlSecretProblem(this.fields.baseUrl.value.trim(), true) : null) ??
      (kind.modelUrl ? urlSecretProblem(this.fields.modelUrl.value.trim(), false) : null);
    if (problem) {
      this.formError.textContent = problem;
      (kind.secret ? this.fields.secret : this.fields.baseUrl).focus();
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
    } catch {
      // The exception text may carry a traceback; show a fixed sentence.
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
