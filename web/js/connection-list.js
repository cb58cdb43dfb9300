/**
 * Views of the connections panel's lists (connections-state.js holds what
 * they show): the connections, with their load progress and a scripted
 * connection's use, and the standing grants.
 *
 * Rules
 * - Connections this device can run come first; those it cannot are listed
 *   last, in a collapsed group per need ("Needs a GPU with WebGPU") that
 *   says how to get it.
 * - Capability badges say what a connection can do ("reads images",
 *   "JSON output", "calls tools", or "text only"), never what it cannot.
 * - Only connections the user made (`settings.userDefined`) can be edited
 *   or removed; built-in ones belong to the runtime. Removal asks first and
 *   offers to delete the connection's downloaded files (offline.js).
 * - A connection whose model files the shell can list (offline.js) has a
 *   "Download for offline use" button.
 * - Progress is updated in place: a live region replaced on every step is
 *   announced erratically (or not at all) by screen readers.
 * - A re-render keeps the keyboard focus on the same control of the same
 *   entry, the next entry, or the fallback the panel names (dom.js
 *   `keepFocus`). Every value is inserted as text, never as markup.
 */

import { el, focusableHeading, keepFocus, str, whileBusy } from "./dom.js";
import { canDo } from "./connections-state.js";
import { fileRemovalOffer, offlineControl } from "./offline.js";

export class ConnectionListView {
  /**
   * @param {HTMLElement} list the `#connection-list` element.
   * @param {import('./connections-state.js').ConnectionsState} state
   * @param {object} parts
   * @param {() => object|null} parts.runtime the attached runtime API or null.
   * @param {(item: object) => void} parts.edit opens the form on a connection.
   * @param {() => HTMLElement|null} parts.fallbackFocus where the focus goes when its entry is gone.
   */
  constructor(list, state, { runtime, edit, fallbackFocus }) {
    this.list = list;
    this.state = state;
    this.runtime = runtime;
    this.edit = edit;
    this.fallbackFocus = fallbackFocus;
  }

  /** The entry of connection `id`, or undefined. */
  entry(id) {
    return [...this.list.querySelectorAll("li.connection")].find((node) => node.dataset.connectionId === id);
  }

  /** Draw the whole list (module rules). */
  render() {
    keepFocus(this.list, () => {
      if (this.state.connections.length === 0) {
        this.list.replaceChildren(el("li", { class: "empty" }, "No connections yet."));
        return;
      }
      const { ready, groups } = this.state.grouped();
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
    }, this.fallbackFocus);
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
    edit.addEventListener("click", () => this.edit(item));
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
      el("p", { class: "kind" }, this.state.kindInfo(item.kind).label),
      el("p", {}, "Model: ", el("code", {}, str(item.model))),
      el("p", { class: "route" }, `Route: ${str(item.route)}`),
      this.renderScriptUse(item),
      this.renderProgress(id),
      quiet ? null : badges,
      availability,
      offlineControl(item, (connectionId, label, fraction) => this.showProgress(connectionId, label, fraction)),
      actions,
    );
  }

  /** Keep and show a load's progress in its connection's entry (connections-state.js rules). */
  showProgress(connectionId, label, fraction) {
    const state = this.state.setProgress(connectionId, label, fraction);
    const entry = this.entry(connectionId);
    if (!entry) return;
    const shown = entry.querySelector(".engine-progress");
    if (shown && state) {
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
    const state = this.state.progress.get(connectionId);
    if (!state) return null;
    const percent = Math.round(state.fraction * 100);
    return el(
      "div",
      { class: "engine-progress", role: "status" },
      el("span", {}, `${state.label} (${percent}%)`),
      el("progress", { max: "1", value: String(state.fraction), "aria-label": state.label }),
    );
  }

  /** Show the use of scripted connection `connectionId` again in its entry. */
  showScriptUse(connectionId) {
    const entry = this.entry(connectionId);
    const item = this.state.byId(connectionId);
    if (!entry || !item) return;
    entry.querySelector(".script-progress")?.replaceWith(this.renderScriptUse(item));
  }

  /** "Requests received: N, M stopped before the end (next turn T of U)" (docs/napplets.md). */
  renderScriptUse(item) {
    if (item.kind !== "scripted") return null;
    const use = this.state.scriptUseOf(item);
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

  confirmRemove(item, actions) {
    const yes = el("button", { type: "button", class: "danger confirm-remove" }, "Remove");
    const no = el("button", { type: "button", class: "secondary" }, "Keep");
    const question = el("p", { class: "confirm", role: "group", "aria-label": "Confirm removal" },
      `Remove “${str(item.name)}”? Napplets using it must select again. `, yes, " ", no);
    const saved = [...actions.childNodes];
    actions.replaceChildren(question);
    no.focus();
    // Its downloaded model files may go with it (offline.js).
    const offer = fileRemovalOffer(item, this.state.connections).then((found) => {
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
}

export class GrantListView {
  /**
   * @param {HTMLElement} list the `#grant-list` element.
   * @param {HTMLElement} heading the grants' heading (the focus goes there when the list empties).
   * @param {import('./connections-state.js').ConnectionsState} state
   * @param {() => object|null} runtime the attached runtime API or null.
   */
  constructor(list, heading, state, runtime) {
    this.list = list;
    this.heading = heading;
    this.state = state;
    this.runtime = runtime;
  }

  render() {
    keepFocus(this.list, () => this.renderItems(), () => focusableHeading(this.heading));
  }

  renderItems() {
    if (this.state.grants.length === 0) {
      this.list.replaceChildren(el("li", { class: "empty" }, "No standing permissions."));
      return;
    }
    this.list.replaceChildren(
      ...this.state.grants.map((grant) => {
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
}
