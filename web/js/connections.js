/**
 * The connections panel: the user's connections, the standing consent
 * grants and the shell's notices (docs/design.md, "Connection", "Consent").
 * The panel ties its parts together: what it knows (connections-state.js)
 * and its views, the list and the grants (connection-list.js), the form
 * (connection-form.js) with "Look for running servers"
 * (connection-discovery.js). Each part opens with the rules it owns.
 *
 * Rules
 * - The runtime pushes the lists, the kinds and the progress of loads
 *   (`napllmHost.connectionsChanged`, `grantsChanged`, `connectionKinds`,
 *   `engineProgress`, `scriptProgress`); each push updates the state, then
 *   the view that shows it.
 * - Add / edit / remove call the runtime with JSON text; nothing is
 *   changed here before it answers.
 * - When another tab saves connections (storage.js tells this one), the
 *   runtime re-reads them (`syncConnections`) and pushes the new lists; the
 *   same happens once at attach. Its answer `{"unreadable": n}` is shown as
 *   "n saved connection(s) could not be read by this version" (such entries
 *   are kept as they are, never overwritten).
 * - On a shared github.io origin, a saved token brings a warning once
 *   (`warnSharedOrigin`).
 * - Every value is inserted as text, never as markup.
 */

import { CatalogueView } from "../catalogue/view.js";
import { ConnectionForm } from "./connection-form.js";
import { ConnectionListView, GrantListView } from "./connection-list.js";
import { ConnectionsState, parseList } from "./connections-state.js";
import { el, keepFocus, str } from "./dom.js";
import { isObjectOrArray, parseJsonOr } from "./json.js";
import { CONNECTIONS_LISTED } from "./offline.js";
import { onConnectionsChanged } from "./storage.js";
import { StorageRemovalOffer } from "./storage-offer.js";

export { canDo, modelFromGgufUrl, parseKinds } from "./connections-state.js";
export { urlSecretProblem } from "./connection-form.js";

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

export class ConnectionsPanel {
  /**
   * @param {HTMLElement} root the connections section (ids in index.html).
   * @param {() => object|null} runtime the attached runtime API or null.
   */
  constructor(root, runtime) {
    this.root = root;
    this.runtime = runtime;
    this.state = new ConnectionsState();
    this.addButton = root.querySelector("#connection-add");
    this.list = new ConnectionListView(root.querySelector("#connection-list"), this.state, {
      runtime,
      edit: (item) => this.form.open(item),
      fallbackFocus: () => (this.addButton.disabled ? null : this.addButton),
    });
    this.grantList = new GrantListView(root.querySelector("#grant-list"), root.querySelector("#grants-heading"), this.state, runtime);
    this.form = new ConnectionForm(root.querySelector("#connection-form"), this.state, {
      runtime,
      addButton: this.addButton,
      entry: (id) => this.list.entry(id),
    });
    this.addButton.addEventListener("click", () => this.form.open(null));
    // The model catalogue: one click from a listed model to a ready connection.
    this.catalogue = new CatalogueView(this.addButton, runtime);
    // After the Storage panel deleted a model: remove the connections that read it?
    this.removalOffer = new StorageRemovalOffer(runtime);
    this.unreadable = el("p", { id: "connections-unreadable", class: "notice warning", role: "status", hidden: true });
    this.list.list.after(this.unreadable);
    this.syncing = null;
    this.syncAgain = false;
    onConnectionsChanged(() => this.sync());
    this.setReady(false);
    this.renderConnections();
    this.grantList.render();
  }

  /** The connections the runtime last listed (public summaries). */
  get connections() {
    return this.state.connections;
  }

  /** Bumped by every push of the connections (web/shell.js reads it at attach). */
  get connectionsVersion() {
    return this.state.connectionsVersion;
  }

  /** Bumped by every push of the grants. */
  get grantsVersion() {
    return this.state.grantsVersion;
  }

  /** `napllmHost.connectionKinds`: the kinds the runtime supports (JSON text, napllm.kinds). */
  setKinds(listJson) {
    this.state.setKinds(listJson);
    this.form.showKinds();
    this.renderConnections();
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
    this.state.setConnections(listJson);
    this.renderConnections();
    this.catalogue.connectionsListed(this.state.connections);
    document.dispatchEvent(new CustomEvent(CONNECTIONS_LISTED, { detail: this.state.connections }));
  }

  /**
   * `napllmHost.engineProgress`: a model download or load of a connection.
   * Shown as a progress bar in that connection's entry; removed when the
   * fraction reaches 1 (ready) or is negative (the load failed; the runtime
   * reports the failure itself as a notice).
   */
  setProgress(connectionId, label, fraction) {
    this.list.showProgress(connectionId, label, fraction);
  }

  /**
   * `napllmHost.scriptProgress`: JSON text `{"connectionId", "revision",
   * "requests", "stopped", "nextTurn" (1-based or null), "turns"}` after
   * each request a scripted connection received and each stream stopped
   * before its end. Shown in its entry as "Requests received: N, M stopped
   * before the end" (docs/napplets.md), for the revision it was counted for.
   */
  setScriptProgress(progressJson) {
    const connectionId = this.state.setScriptUse(progressJson);
    if (connectionId !== null) this.list.showScriptUse(connectionId);
  }

  /** `napllmHost.grantsChanged`. */
  updateGrants(listJson) {
    this.state.setGrants(listJson);
    this.grantList.render();
  }

  /** Draw the connections again (after a push, or once the runtime is attached). */
  renderConnections() {
    this.list.render();
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
