/**
 * The napllm host page: defines `window.napllmHost` (the bridge the Python
 * runtime calls), wires the UI modules and boots the runtime in Pyodide.
 *
 * Rules (bridge contract; NAP-LLM, Shell Behavior; NIP-5D web projection)
 * - Every value crossing the bridge is JSON text (or a promise of it); the
 *   page never hands JS objects to Python.
 * - `napllmHost` exists before Python starts. Until `attachRuntime` is
 *   called the boot indicator is visible and napplet messages are queued
 *   per frame.
 * - Only relative URLs: the page works under any sub-path.
 * - `?napplet=<http(s) url>` opens that napplet at start (development),
 *   with its origin shown and LLM access off until the person turns it on;
 *   query parameters are read with URLSearchParams only. Without it, the
 *   Chat napplet opens on the first visit (web/js/gallery.js).
 */

import { AccountSwitcher } from "./js/accounts.js";
import { ConnectionsPanel, Notices, warnSharedOrigin } from "./js/connections.js";
import { DialogQueue } from "./js/dialogs.js";
import { startRuntime } from "./js/boot-runtime.js";
import { NappletArea, isHttpUrl, nameFromUrl } from "./js/frames.js";
import { el } from "./js/dom.js";
import { parseJsonOr } from "./js/json.js";
import { FIRST_NAPPLET, galleryEntries, renderGallery, takeFirstVisit } from "./js/gallery.js";
import { Inspector } from "./js/inspector.js";
import { PanelToggle } from "./js/layout.js";
import { loadConnections, saveConnections } from "./js/storage.js";

const $ = (selector) => document.querySelector(selector);

let runtime = null;
const getRuntime = () => runtime;

const notices = new Notices($("#notice-list"), (id) => {
  const found = connections.connections.find((item) => item.id === id);
  return found && typeof found.name === "string" ? found.name : null;
});
const notify = (level, text) => notices.show({ level, text });

let area = null;
const inspector = new Inspector($("#inspector"), (endpointId) => (area ? area.describeEndpoint(endpointId) : endpointId));
area = new NappletArea({
  tablist: $("#napplet-tabs"),
  panels: $("#napplet-panels"),
  empty: $("#napplet-empty"),
  runtime: getRuntime,
  inspector,
  notify,
});
const connections = new ConnectionsPanel($("#connections"), getRuntime);
const accounts = new AccountSwitcher($("#account"), getRuntime);
// On narrow screens the connections column is a panel the toggle opens.
new PanelToggle($("#connections-toggle"), $("#layout"));
const tabOfEndpoint = (endpointId) => area.tabOfEndpoint(endpointId);
const tabOfKey = (key) => area.tabs.find((tab) => tab.key === key) ?? null;

/** Show (or clear) a refusal period of a napplet in its tab's toolbar and as a notice. */
function showRefusal(scope, endpointId, state) {
  const tab = tabOfKey(scope);
  const toolbar = tab && tab.view ? tab.view.panel.querySelector(".tab-toolbar") : null;
  const old = toolbar ? toolbar.querySelector(".request-refusal") : null;
  if (!state) {
    if (old) old.remove();
    return;
  }
  const when = Number.isFinite(state.until)
    ? `until ${new Date(state.until).toLocaleTimeString()}`
    : "until the page is reloaded";
  const why = state.reason === "denied" ? "after several denials in a row, its" : "its";
  const text = `Requests refused without asking ${when}`;
  notify("warning", `${tab ? tab.title : "A napplet"}: ${why} model requests are refused without asking ${when}.`);
  if (!toolbar) return;
  const again = el("button", { type: "button", class: "secondary ask-again" }, "Ask me again");
  again.addEventListener("click", () => dialogs.lift(scope));
  const badge = el(
    "span",
    { class: "request-refusal", role: "status", dataset: { until: Number.isFinite(state.until) ? String(state.until) : "reload" } },
    text,
    again,
  );
  if (old) old.replaceWith(badge);
  else toolbar.insertBefore(badge, toolbar.querySelector(".toggle"));
}

const dialogs = new DialogQueue($("#dialog-host"), {
  scopeOf: (endpointId) => tabOfEndpoint(endpointId)?.key ?? null,
  closeNapplet: (endpointId) => {
    const tab = tabOfEndpoint(endpointId);
    if (tab) area.close(tab);
  },
  onBlockChange: showRefusal,
});

window.addEventListener("message", (event) => area.onMessage(event));

// ---------------------------------------------------------------- boot UI

const bootPanel = $("#boot");
const bootLabel = $("#boot-label");
const bootBar = $("#boot-progress");

/** Update the boot indicator: `fraction` in 0..1. */
function bootProgress(label, fraction) {
  if (runtime) return;
  if (typeof label === "string" && label) bootLabel.textContent = label;
  const value = Number(fraction);
  if (Number.isFinite(value)) bootBar.value = Math.min(1, Math.max(0, value));
}

function bootFailed(error, details) {
  bootPanel.hidden = true;
  const panel = $("#boot-error");
  panel.hidden = false;
  $("#boot-error-message").textContent = error && error.message ? error.message : String(error);
  const extra = details.filter(Boolean).join("\n");
  $("#boot-error-details").textContent = extra;
  $("#boot-error-details-wrap").hidden = extra.length === 0;
  $("#boot-error-retry").focus();
  document.body.dataset.boot = "failed";
}

$("#boot-error-retry").addEventListener("click", () => location.reload());

// ---------------------------------------------------------------- the bridge

/**
 * The runtime's view of the page. See the module docstring and the bridge
 * contract for shapes; every argument is JSON text unless named otherwise.
 */
const napllmHost = Object.freeze({
  /**
   * Deliver `[[endpointId, envelope], ...]` (JSON text), in order, each to
   * its endpoint's frame (dropped when the frame is gone).
   */
  postAll(batchJson) {
    area.postAll(String(batchJson));
  },
  /** Show the chooser; resolves with `{"id","revision"}` JSON text (the list picked from) or null. */
  openChooser(token, requestJson) {
    return dialogs.openChooser(token, String(requestJson));
  },
  /** Show the consent dialog; resolves with `{"allow","remember","digest"}` JSON text. */
  openConsent(token, disclosureJson) {
    return dialogs.openConsent(token, String(disclosureJson));
  },
  /** Replace the candidates of an open or queued chooser (the connections changed). */
  updateChooser(token, requestJson) {
    dialogs.updateChooser(token, String(requestJson));
  },
  /** Close or drop a chooser/consent dialog, resolving it as cancel/deny. */
  closeDialog(token) {
    dialogs.closeDialog(token);
  },
  /** Record an envelope reported by the runtime ("in", "out", or a "note"). */
  inspect(endpointId, direction, envelopeJson) {
    const dir = direction === "out" || direction === "in" ? direction : "note";
    inspector.recordFromRuntime(String(endpointId), dir, String(envelopeJson));
  },
  /** Re-render the connections panel. */
  connectionsChanged(listJson) {
    connections.update(String(listJson));
    sharedOriginCheck(String(listJson));
  },
  /** The connection kinds the runtime supports (napllm.kinds; JSON text), sent once at start. */
  connectionKinds(listJson) {
    connections.setKinds(String(listJson));
  },
  /** Re-render the standing grants. */
  grantsChanged(listJson) {
    connections.updateGrants(String(listJson));
  },
  /** Show a notice in the shell UI: `{"level","text","connectionId"?}`. */
  notice(noticeJson) {
    const value = parseJsonOr(noticeJson, undefined);
    if (value !== undefined) notices.show(value);
  },
  /** Model download/load progress of an engine, shown in its connection's entry. */
  engineProgress(connectionId, label, fraction) {
    connections.setProgress(String(connectionId), String(label), Number(fraction));
  },
  /** A scripted connection received a request: its count, shown in its entry. */
  scriptProgress(progressJson) {
    connections.setScriptProgress(String(progressJson));
  },
  /** Persist the connection list in IndexedDB. */
  saveConnections(json) {
    return saveConnections(String(json));
  },
  /** The persisted connection list, "[]" when empty. */
  loadConnections() {
    return loadConnections();
  },
  bootProgress,
  /** Called once by the runtime when it accepts envelopes. */
  attachRuntime(api) {
    if (runtime) return;
    // A Python object handed over as an argument is released after the
    // call returns unless it is copied.
    runtime = api && typeof api.copy === "function" ? api.copy() : api;
    bootProgress("Ready", 1);
    bootPanel.hidden = true;
    document.body.dataset.boot = "ready";
    connections.setReady(true);
    connections.renderConnections();
    accounts.apply();
    area.runtimeAttached();
    refreshRuntimeLists();
  },
});

/** The one-time warning about tokens on a shared github.io origin (README, deploy). */
function sharedOriginCheck(listJson) {
  let storage = null;
  try {
    storage = window.localStorage;
  } catch {
    storage = null;
  }
  warnSharedOrigin(listJson, location.href, storage, notify);
}

/** Read the lists once at attach, unless the runtime has pushed newer ones meanwhile. */
async function refreshRuntimeLists() {
  const seen = [connections.connectionsVersion, connections.grantsVersion];
  try {
    const list = await runtime.listConnections();
    if (typeof list === "string" && connections.connectionsVersion === seen[0]) connections.update(list);
    if (typeof list === "string") sharedOriginCheck(list);
    const grants = await runtime.listGrants();
    if (typeof grants === "string" && connections.grantsVersion === seen[1]) connections.updateGrants(grants);
  } catch {
    console.error("napllm: could not read the connection list from the runtime");
  }
}

Object.defineProperty(window, "napllmHost", { value: napllmHost, writable: false, configurable: false });

// ---------------------------------------------------------------- napplets

/** Fetch napplets/index.json and fill the gallery and the napplet list; returns the entries. */
async function loadNappletIndex() {
  const select = $("#napplet-select");
  const base = new URL("./", location.href).href;
  let parsed = null;
  try {
    const response = await fetch(new URL("./napplets/index.json", base), { cache: "no-cache" });
    if (response.ok) parsed = await response.json();
  } catch {
    parsed = null;
  }
  // Index paths are relative to the shell's own folder (dist/).
  const usable = galleryEntries(parsed, base);
  select.replaceChildren(
    ...usable.map((entry) => {
      const option = new Option(entry.title, entry.name);
      option.dataset.url = entry.url;
      option.dataset.title = entry.title;
      return option;
    }),
  );
  $("#napplet-open").disabled = usable.length === 0;
  if (usable.length === 0) select.append(new Option("No napplets found", ""));
  renderGallery($("#napplet-gallery"), usable, (entry) =>
    area.open({ url: entry.url, name: entry.name, title: entry.title }),
  );
  return usable;
}

$("#napplet-list-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const option = $("#napplet-select").selectedOptions[0];
  if (!option || !option.dataset.url) return;
  area.open({ url: option.dataset.url, name: option.value, title: option.dataset.title });
});

$("#napplet-url-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("#napplet-url");
  let url;
  try {
    url = new URL(input.value.trim(), location.href).href;
  } catch {
    url = "";
  }
  if (!isHttpUrl(url)) {
    notify("error", "Enter an http or https URL of a napplet page.");
    input.focus();
    return;
  }
  // Typed by the person: LLM access starts on; the origin is shown.
  area.open({ url, name: nameFromUrl(url), fromUrl: true });
  input.value = "";
});

/** Open the napplet of a `?napplet=` link; without one, the Chat napplet on the first visit. */
function openAtStart(entries) {
  const requested = new URLSearchParams(location.search).get("napplet");
  if (!requested) {
    const first = entries.find((entry) => entry.name === FIRST_NAPPLET);
    if (first && takeFirstVisit()) area.open({ url: first.url, name: first.name, title: first.title });
    return;
  }
  let url = "";
  try {
    url = new URL(requested, location.href).href;
  } catch {
    url = "";
  }
  if (!isHttpUrl(url)) {
    notify("error", "The napplet parameter must be an http or https URL.");
    return;
  }
  // A link may come from anyone: the napplet opens with LLM access off
  // until the person turns it on in its tab, and its origin is shown.
  area.open({ url, name: nameFromUrl(url), fromUrl: true, llm: false });
}

// ---------------------------------------------------------------- boot

async function boot() {
  const messages = [];
  try {
    bootProgress("Loading the Python runtime…", 0.05);
    const { loadPyodide } = await import("./pyodide/pyodide.mjs");
    bootProgress("Starting Python…", 0.15);
    const py = await loadPyodide({ indexURL: new URL("./pyodide/", location.href).href });
    bootProgress("Loading napllm…", 0.5);
    // loadPackage reports failures through errorCallback instead of rejecting.
    await py.loadPackage("napllm", {
      messageCallback: () => {},
      errorCallback: (message) => messages.push(String(message)),
    });
    bootProgress("Starting the runtime…", 0.7);
    await startRuntime(py);
    if (!runtime) bootProgress("Waiting for the runtime…", 0.95);
  } catch (error) {
    console.error("napllm: boot failed", error);
    bootFailed(error, messages);
  }
}

document.body.dataset.boot = "booting";
loadNappletIndex().then(openAtStart, () => openAtStart([]));
boot();
