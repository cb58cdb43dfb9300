/**
 * The connections form (add or edit one connection): the view that reads
 * and checks what the user typed and hands it to the runtime.
 *
 * Rules
 * - The form starts with the kind: its other fields appear once one is
 *   picked, and only the fields of that kind show (hidden ones are
 *   disabled, so never validated). The kinds are the runtime's
 *   (connections-state.js); this module keeps no copy.
 * - The secret field (token / API key) is a password input that is never
 *   filled back: blank on edit means "keep the saved one" (`credential:
 *   null`). Its value is never logged or kept after the form closes.
 * - Add / edit call the runtime with JSON text
 *   `{"name","kind","model","settings","credential","capabilities","charges"}`;
 *   a failure is shown as the runtime's safe text or a fixed sentence, never
 *   an exception's text.
 * - A secret typed into a URL is refused before anything is sent
 *   (`urlSecretProblem`; the runtime checks the same).
 * - Closing the form gives the focus back to the control that opened it (or
 *   the edited entry's new Edit button, or "Add connection").
 */

import { byIds, str } from "./dom.js";
import { isObjectOrArray, parseJsonOr } from "./json.js";
import { DiscoveryView } from "./connection-discovery.js";
import { UNKNOWN_KIND, modelFromGgufUrl } from "./connections-state.js";

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

/** The text of a runtime failure safe to show in the form (never a traceback). */
function failureText(result) {
  if (typeof result === "string") {
    // Not a structured answer: nothing to show.
    const value = parseJsonOr(result, null, isObjectOrArray);
    if (value && typeof value.error === "string") return value.error;
  }
  return null;
}

export class ConnectionForm {
  /**
   * @param {HTMLFormElement} form the `#connection-form` element.
   * @param {import('./connections-state.js').ConnectionsState} state
   * @param {object} parts
   * @param {() => object|null} parts.runtime the attached runtime API or null.
   * @param {HTMLButtonElement} parts.addButton "Add connection" (its `aria-expanded` follows the form).
   * @param {(id: string) => HTMLElement|undefined} parts.entry the list entry of a connection.
   */
  constructor(form, state, { runtime, addButton, entry }) {
    this.form = form;
    this.state = state;
    this.runtime = runtime;
    this.addButton = addButton;
    this.entry = entry;
    this.editing = null;
    this.returnFocus = null;
    this.title = form.querySelector("#connection-form-title");
    this.error = form.querySelector("#connection-form-error");
    this.fields = byIds(form, {
      name: "connection-name", kind: "connection-kind", baseUrl: "connection-base-url",
      forwardsTo: "connection-forwards-to", modelUrl: "connection-model-url", script: "connection-script",
      model: "connection-model", secret: "connection-secret", json: "connection-cap-json",
      tools: "connection-cap-tools", images: "connection-cap-images", charges: "connection-charges",
    });
    this.kindSummary = form.querySelector("#connection-kind-summary");
    this.kindFields = form.querySelector("#connection-kind-fields");
    this.modelHint = form.querySelector("#connection-model-hint");
    this.secretLabel = form.querySelector("#connection-secret-label");
    this.secretHint = form.querySelector("#connection-secret-hint");
    this.discovery = new DiscoveryView(form, runtime, (server, model) => this.useFound(server, model));
    this.discovery.button.addEventListener("click", () =>
      this.discovery.look(this.kindName(), this.fields.secret.value, this.fields.baseUrl.value),
    );
    this.fields.kind.addEventListener("change", () => this.applyKind());
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.submit();
    });
    form.querySelector("#connection-cancel").addEventListener("click", () => this.close());
    form.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault();
        this.close();
      }
    });
  }

  /** Offer the kinds the runtime published (test-only kinds are not offered). */
  showKinds() {
    const options = [new Option("Choose a kind…", "")];
    for (const [kind, info] of this.state.kinds) {
      if (info.testOnly !== true) options.push(new Option(info.label, kind));
    }
    this.fields.kind.replaceChildren(...options);
  }

  /** The kind the form is for: the edited connection's, else the chosen one ("" when none). */
  kindName() {
    return this.editing ? str(this.editing.kind) : this.fields.kind.value;
  }

  /** The kind record the form is for, or null. */
  formKind() {
    const name = this.editing ? this.editing.kind : this.fields.kind.value;
    return name ? this.state.kindInfo(name) : null;
  }

  /** Open the form on `item` (edit) or empty (null: add). */
  open(item) {
    // The control that opened the form (Add or an entry's Edit) gets the focus back.
    if (this.form.hidden || !this.form.contains(document.activeElement)) this.returnFocus = document.activeElement;
    this.editing = item;
    this.form.reset();
    this.error.textContent = "";
    this.discovery.reset();
    this.fields.kind.disabled = item !== null;
    if (item) {
      this.title.textContent = `Edit “${str(item.name)}”`;
      const settings = item.settings && typeof item.settings === "object" ? item.settings : {};
      const caps = item.capabilities && typeof item.capabilities === "object" ? item.capabilities : {};
      if (![...this.fields.kind.options].some((option) => option.value === item.kind)) {
        this.fields.kind.append(new Option(this.state.kindInfo(item.kind).label, str(item.kind)));
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
      this.title.textContent = "Add a connection";
      this.fields.kind.value = "";
    }
    this.applyKind();
    this.form.hidden = false;
    this.addButton.setAttribute("aria-expanded", "true");
    (item ? this.fields.name : this.fields.kind).focus();
  }

  close() {
    this.form.reset();
    this.form.hidden = true;
    this.discovery.reset();
    this.addButton.setAttribute("aria-expanded", "false");
    const editedId = this.editing ? str(this.editing.id) : null;
    this.editing = null;
    const back = this.returnFocus;
    this.returnFocus = null;
    // After a Save the entry may have been re-rendered: its new Edit button.
    const entry = editedId === null ? null : this.entry(editedId);
    const target = back instanceof HTMLElement && back.isConnected && !back.disabled
      ? back
      : entry?.querySelector("button.edit") ?? (this.addButton.disabled ? null : this.addButton);
    if (target) target.focus();
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
    this.discovery.offer(info.discover === true);
    if (typeof info.secretLabel === "string") {
      this.secretLabel.textContent = info.secretLabel;
      const saved = this.editing && this.editing.hasCredential === true;
      this.secretHint.textContent = saved
        ? "A secret is saved. Leave blank to keep it."
        : "Optional. Stored only in this browser's shell storage, never given to napplets.";
    }
  }

  /** Fill the form from a found server and one of its models. */
  useFound(server, model) {
    if (!this.editing && this.state.kinds.has(server.kind) && this.fields.kind.value !== server.kind) {
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
    const kind = this.state.kindInfo(kindName);
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

  /** Why the typed fields cannot be sent (and the field to focus), or null. */
  problem(kind) {
    if (kind === null) return { text: "Choose a kind of connection first.", field: this.fields.kind };
    if (kind.modelUrl === true && !this.fields.model.value.trim() && !modelFromGgufUrl(this.fields.modelUrl.value.trim())) {
      return { text: "Enter a model id: the GGUF URL has no file name.", field: null };
    }
    const secretInUrl =
      (kind.baseUrl === true ? urlSecretProblem(this.fields.baseUrl.value.trim(), true) : null) ??
      (kind.modelUrl === true ? urlSecretProblem(this.fields.modelUrl.value.trim(), false) : null);
    if (secretInUrl) {
      return { text: secretInUrl, field: typeof kind.secretLabel === "string" ? this.fields.secret : this.fields.baseUrl };
    }
    return null;
  }

  async submit() {
    const runtime = this.runtime();
    if (!runtime) return;
    const save = this.form.querySelector("#connection-save");
    if (save.getAttribute("aria-disabled") === "true") return;
    if (!this.form.reportValidity()) return;
    const problem = this.problem(this.formKind());
    if (problem) {
      this.error.textContent = problem.text;
      problem.field?.focus();
      return;
    }
    const json = this.formJson();
    this.error.textContent = "";
    // Busy, not disabled: disabling the focused Save button drops the focus to <body>.
    save.setAttribute("aria-disabled", "true");
    try {
      const result = this.editing
        ? await runtime.editConnection(str(this.editing.id), json)
        : await runtime.addConnection(json);
      const failure = failureText(result);
      if (failure) {
        this.error.textContent = failure;
        return;
      }
      this.close();
    } catch (error) {
      // The exception text may carry a traceback; show a fixed sentence.
      console.error("napllm: the connection could not be saved", error?.name ?? "");
      this.error.textContent = "The connection could not be saved. Check the fields and try again.";
    } finally {
      save.removeAttribute("aria-disabled");
    }
  }
}
