/**
 * The napplet tabs on the page: the view of the napplet area (frames.js).
 * A tab's state is a plain record the area keeps (`{key, url, name, title,
 * origin, llm, sha256, text, promptApi, frame}`); this module only draws it
 * and reports the user's actions.
 *
 * Rules
 * - ARIA tabs: the tablist holds one `role=tab` button per napplet, each
 *   controlling its `role=tabpanel` section; one tab is selected; arrow
 *   keys, Home and End move between tabs. An empty tablist is hidden (a
 *   tablist needs tabs) and the placeholder shows instead.
 * - A tab's toolbar shows the napplet's identity (name, short hash, origin
 *   for a napplet from a URL, the full hash and URL as its title), a status
 *   line, the "LLM access" switch, Reload and Close.
 * - Every text is inserted as text, never as markup.
 * - Closing the last tab from its own toolbar moves the focus to the napplet
 *   area, not to `<body>`.
 */

import { el } from "./dom.js";

/** "title" for listed napplets, "title (origin)" for napplets from a URL. */
export function tabLabel(tab) {
  return tab.origin ? `${tab.title} (${tab.origin})` : tab.title;
}

export class TabStrip {
  /**
   * @param {object} parts
   * @param {HTMLElement} parts.tablist the role=tablist element.
   * @param {HTMLElement} parts.panels container of the tab panels.
   * @param {HTMLElement} parts.empty placeholder shown when no tab is open.
   */
  constructor({ tablist, panels, empty }) {
    this.tablist = tablist;
    this.panels = panels;
    this.empty = empty;
    /** The tabs shown, in order (the area's records). */
    this.tabs = [];
    this.tablist.addEventListener("keydown", (event) => this.onKey(event));
    this.updateEmpty();
  }

  /**
   * Add `tab`'s button and panel (toolbar and frame holder), select it.
   * `actions`: `{toggle(checked), reload(), close()}`, called on the user's
   * actions. The view's elements go to `tab.view`.
   */
  add(tab, actions) {
    const label = tabLabel(tab);
    const button = el(
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
    button.addEventListener("click", () => this.select(tab));

    const identity = el("span", { class: "identity" }, tab.origin ? `${tab.name} · from ${tab.origin}` : tab.name);
    const status = el("span", { class: "tab-status", role: "status" });
    const toggleId = `${tab.key}-llm`;
    const toggle = el("input", { type: "checkbox", id: toggleId, class: "llm-toggle", checked: tab.llm, role: "switch" });
    toggle.addEventListener("change", () => actions.toggle(toggle.checked));
    const reload = el("button", { type: "button", class: "reload", "aria-label": `Reload ${label}` }, "Reload");
    reload.addEventListener("click", () => actions.reload());
    const close = el("button", { type: "button", class: "close", "aria-label": `Close ${label}` }, "Close");
    close.addEventListener("click", () => actions.close());

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
        "aria-labelledby": button.id,
        dataset: { napplet: tab.name },
        hidden: true,
      },
      toolbar,
      holder,
    );
    this.tablist.append(button);
    this.panels.append(panel);
    tab.view = { button, panel, holder, identity, status, toggle };
    this.tabs.push(tab);
    this.select(tab);
    this.updateEmpty();
  }

  /** Make `tab` the visible one (and focus its button when `focus`). */
  select(tab, focus = false) {
    for (const other of this.tabs) {
      const selected = other === tab;
      other.view.button.setAttribute("aria-selected", String(selected));
      other.view.button.tabIndex = selected ? 0 : -1;
      other.view.panel.hidden = !selected;
    }
    if (focus) tab.view.button.focus();
  }

  onKey(event) {
    const index = this.tabs.findIndex((tab) => tab.view.button === document.activeElement);
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

  /** Remove `tab`'s button and panel; the neighbour is selected when it was. */
  remove(tab) {
    const index = this.tabs.indexOf(tab);
    if (index < 0) return;
    this.tabs.splice(index, 1);
    const wasSelected = tab.view.button.getAttribute("aria-selected") === "true";
    tab.view.button.remove();
    tab.view.panel.remove();
    const active = document.activeElement;
    const hadFocus = !active || active === document.body || !active.isConnected;
    if (wasSelected && this.tabs.length > 0) this.select(this.tabs[Math.min(index, this.tabs.length - 1)], true);
    this.updateEmpty();
    if (this.tabs.length === 0 && hadFocus) this.tablist.closest("[tabindex]")?.focus();
  }

  updateEmpty() {
    this.empty.hidden = this.tabs.length > 0;
    this.tablist.hidden = this.tabs.length === 0;
  }
}

/** Show `text` in `tab`'s status line. */
export function showStatus(tab, text) {
  tab.view.status.textContent = text;
}

/** Show `tab`'s identity: name, short hash and origin; the full hash and URL as its title. */
export function showIdentity(tab) {
  const { identity } = tab.view;
  identity.textContent = `${tab.name} · #${tab.sha256.slice(0, 12)}` + (tab.origin ? ` · from ${tab.origin}` : "");
  identity.title = `sha256 ${tab.sha256}` + (tab.origin ? `\nloaded from ${tab.url}` : "");
}

/** Put `iframe` in `tab`'s panel (replacing what was there). */
export function showFrame(tab, iframe) {
  tab.view.holder.replaceChildren(iframe);
}

/** Replace `tab`'s frame by a notice saying why it stopped (`level`: warning or error). */
export function showStopped(tab, text, level) {
  tab.view.holder.replaceChildren(el("p", { class: `frame-stopped ${level}`, role: "alert" }, text));
  showStatus(tab, "Stopped. Reload to start it again.");
}
