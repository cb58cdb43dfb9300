/**
 * The model chooser and the consent dialog (NAP-LLM, API Surface `select`;
 * Shell Behavior: authorization before every submission).
 *
 * Rules
 * - Dialogs are shown one at a time; the rest wait in a queue. Each names
 *   the requesting napplet (name + short hash).
 * - Every value from a napplet or a connection is inserted as text, never
 *   as markup.
 * - The chooser resolves with the chosen candidate's id, or `null` on
 *   Cancel or Esc. The consent dialog resolves with
 *   `{"allow": bool, "remember": bool}` as JSON text; Deny has the focus by
 *   default, "remember" is unchecked by default, Esc denies.
 * - `closeDialog(token)` (the runtime no longer needs it) closes an open
 *   dialog or drops a queued one, resolving it as cancel/deny.
 * - Focus moves into the dialog and returns to where it was afterwards.
 */

import { el, str } from "./dom.js";

const DENY = JSON.stringify({ allow: false, remember: false });

function parseJson(text) {
  try {
    const value = JSON.parse(text);
    return value && typeof value === "object" ? value : {};
  } catch {
    return {};
  }
}

const int = (value) => (Number.isInteger(value) && value >= 0 ? value : 0);

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

function plural(count, one, many) {
  return `${count} ${count === 1 ? one : many}`;
}

function capabilityBadges(capabilities) {
  const caps = capabilities && typeof capabilities === "object" ? capabilities : {};
  const list = el("ul", { class: "badges", "aria-label": "Capabilities" });
  const add = (text, on) => {
    list.append(el("li", { class: on ? "badge on" : "badge off" }, on ? text : `no ${text}`));
  };
  add("images", caps.images === true);
  add("JSON", caps.json === true);
  add("tools", caps.tools === true);
  if (caps.tools === true && Array.isArray(caps.toolChoiceModes) && caps.toolChoiceModes.length > 0) {
    list.append(el("li", { class: "badge info" }, `tool choice: ${caps.toolChoiceModes.filter((m) => typeof m === "string").join(", ")}`));
  }
  return list;
}

export class DialogQueue {
  /** @param {HTMLElement} host container the <dialog> elements are added to. */
  constructor(host) {
    this.host = host;
    this.queue = [];
    this.current = null;
    this.returnFocus = null;
  }

  /** Queue the chooser; resolves with a candidate id or null. */
  openChooser(token, requestJson) {
    return this.enqueue(String(token), "chooser", parseJson(requestJson), null);
  }

  /** Queue the consent dialog; resolves with `{"allow","remember"}` JSON text. */
  openConsent(token, disclosureJson) {
    return this.enqueue(String(token), "consent", parseJson(disclosureJson), DENY);
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
    return new Promise((resolve) => {
      this.queue.push({ token, kind, data, cancelValue, resolve, dialog: null });
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
      if (this.current === item) this.finish(item.cancelValue);
    });
    dialog.addEventListener("close", () => {
      if (this.current === item) this.finish(item.cancelValue);
    });
    this.host.append(dialog);
    dialog.showModal();
    initialFocus.focus();
  }

  finish(value) {
    const item = this.current;
    if (!item) return;
    this.current = null;
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
    const candidates = Array.isArray(data.candidates) ? data.candidates : [];
    const requirements = data.requirements && typeof data.requirements === "object" ? data.requirements : {};
    const wanted = [];
    if (typeof requirements.model === "string") wanted.push(`model ${requirements.model}`);
    for (const [key, label] of [["images", "image input"], ["json", "JSON output"], ["tools", "tool calling"]]) {
      if (requirements[key] === true) wanted.push(label);
    }
    const title = el("h2", { id: `${id}-title` }, "Choose a model");
    const description = el(
      "p",
      { id: `${id}-desc` },
      el("strong", {}, nappletLabel(data.napplet)),
      " asks to use a language model.",
      wanted.length > 0 ? ` It requires: ${wanted.join(", ")}.` : "",
      " Choosing one does not send anything yet; you will be asked before each request.",
    );
    const list = el("ul", { class: "candidates" });
    for (const candidate of candidates) {
      if (!candidate || typeof candidate !== "object" || typeof candidate.id !== "string") continue;
      const button = el(
        "button",
        { type: "button", class: "candidate", dataset: { candidateId: candidate.id } },
        el("span", { class: "candidate-name" }, str(candidate.name, candidate.id)),
        el("span", { class: "candidate-model" }, `Model: ${str(candidate.model)}`),
        el("span", { class: "candidate-route" }, `Route: ${str(candidate.route)}`),
        candidate.charges === true ? el("span", { class: "badge warn" }, "may charge") : null,
      );
      button.addEventListener("click", () => {
        if (this.current === item) this.finish(candidate.id);
      });
      list.append(el("li", {}, button, capabilityBadges(candidate.capabilities)));
    }
    const empty = list.children.length === 0
      ? el("p", { class: "empty" }, "No connection meets these requirements. Add one in the Connections panel.")
      : null;
    const cancel = el("button", { type: "button", class: "secondary", id: `${id}-cancel` }, "Cancel");
    cancel.addEventListener("click", () => {
      if (this.current === item) this.finish(item.cancelValue);
    });
    const dialog = el(
      "dialog",
      { class: "chooser-dialog", "aria-labelledby": `${id}-title`, "aria-describedby": `${id}-desc`, dataset: { token: item.token, kind: "chooser" } },
      title,
      description,
      empty ?? list,
      el("div", { class: "dialog-actions" }, cancel),
    );
    const first = list.querySelector("button");
    return { dialog, initialFocus: first ?? cancel };
  }

  buildConsent(item) {
    const data = item.data;
    const id = `consent-${Math.random().toString(36).slice(2)}`;
    const disclosed = data.disclosed && typeof data.disclosed === "object" ? data.disclosed : {};
    const connection = data.connection && typeof data.connection === "object" ? data.connection : {};
    const title = el("h2", { id: `${id}-title` }, "Send this request?");
    const description = el(
      "p",
      { id: `${id}-desc` },
      el("strong", {}, nappletLabel(data.napplet)),
      ` wants to send a request to ${str(connection.name, "a connection")}.`,
    );
    const facts = el("dl", { class: "facts" });
    const fact = (term, ...value) => facts.append(el("dt", {}, term), el("dd", {}, ...value));
    fact("Route", str(data.route));
    fact("Model", str(data.model));
    const messages = int(disclosed.messages);
    const characters = int(disclosed.characters);
    fact("Messages", `${plural(messages, "message", "messages")}, ${plural(characters, "character", "characters")}`);
    fact("Images", String(int(disclosed.images)));
    fact("Output", disclosed.format === "json" ? "a JSON object" : "text");
    fact("Output limit", Number.isInteger(disclosed.maxTokens) ? `${disclosed.maxTokens} tokens` : "none set by the napplet");

    const tools = Array.isArray(disclosed.toolDefinitions) ? disclosed.toolDefinitions.filter((t) => t && typeof t === "object") : [];
    if (tools.length > 0) {
      const list = el("ul", { class: "tool-definitions" });
      for (const tool of tools) {
        const params = tool.parameters === undefined ? "(no parameters)" : JSON.stringify(tool.parameters, null, 2);
        list.append(
          el(
            "li",
            {},
            el(
              "details",
              {},
              el("summary", {}, el("code", {}, str(tool.name, "(unnamed)")), str(tool.description) ? ` — ${str(tool.description)}` : ""),
              el("pre", {}, params ?? "null"),
            ),
          ),
        );
      }
      fact("Tool definitions", list);
    } else {
      fact("Tool definitions", "none");
    }
    const results = Array.isArray(disclosed.toolResults) ? disclosed.toolResults.filter((t) => t && typeof t === "object") : [];
    if (results.length > 0) {
      const list = el("ul", { class: "tool-results" });
      for (const result of results) {
        const parts = [plural(int(result.characters), "character", "characters")];
        if (int(result.images) > 0) parts.push(plural(int(result.images), "image", "images"));
        list.append(
          el(
            "li",
            {},
            el("code", {}, str(result.toolName, "(unnamed)")),
            ` (call ${str(result.toolCallId)}): ${parts.join(", ")}`,
            result.isError === true ? el("span", { class: "badge warn" }, "reports an error") : null,
          ),
        );
      }
      fact("Tool results", list);
    } else {
      fact("Tool results", "none");
    }
    fact(
      "Charges",
      data.charges === true
        ? el("strong", { class: "warn-text" }, "This provider may charge you for this request.")
        : "No charges expected from this provider.",
    );

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
    deny.addEventListener("click", () => {
      if (this.current === item) this.finish(DENY);
    });
    allow.addEventListener("click", () => {
      if (this.current === item) this.finish(JSON.stringify({ allow: true, remember: remember.checked }));
    });
    const dialog = el(
      "dialog",
      { class: "consent-dialog", "aria-labelledby": `${id}-title`, "aria-describedby": `${id}-desc`, dataset: { token: item.token, kind: "consent" } },
      title,
      description,
      facts,
      rememberRow,
      el("div", { class: "dialog-actions" }, deny, allow),
    );
    return { dialog, initialFocus: deny };
  }
}
