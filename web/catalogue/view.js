/**
 * The model catalogue in the connections panel: "Browse models" opens a
 * list of small open models for every engine, each with its download
 * size and how it fits this device, a filter, each entry's details and
 * one button to download it and add it as a ready connection (add.js).
 *
 * Rules
 * - Nothing is downloaded before the user presses an entry's "Download and
 *   add"; opening the view reads only the catalogue (the shell's own file)
 *   and this device's facts (source.js). The suggestion at the top ("Suggested
 *   for this device", fit.js `suggestion`) only shows that entry.
 * - Each entry's details say where its files come from (their host), its
 *   size (marked "about" when the catalogue's figure is an estimate: the
 *   host's own size is confirmed before the download), its memory, context
 *   and licence. A licence that must be accepted (Llama, Gemma) is linked
 *   and needs a ticked box before the button does anything.
 * - Text from the catalogue is inserted as text (dom.js `el`), never markup.
 * - Per-engine behaviour comes from the catalogue's engine table, never from
 *   an engine kind named here.
 * - First run: while the user has no connection of their own and has not
 *   dismissed it, a card above the catalogue names the model suggested for
 *   this device with its download size (read like the view: the shell's own
 *   catalogue and this device's facts, after the connections are listed).
 *   "Show it" opens the catalogue at that entry; nothing is downloaded
 *   before its own button. "Not now" hides the card for good (this
 *   browser's `localStorage`); a connection of the user's own hides it too.
 */

import { el } from "../js/dom.js";
import { engineDeclarations } from "../engines/declarations.js";
import { formatBytes } from "../engines/room.js";
import { STORAGE_CHANGED } from "../js/offline.js";
import { addFromCatalogue } from "./add.js";
import { filterEntries, fitOf, readCatalogue, suggestion, VERDICT_TEXT } from "./fit.js";
import { catalogueText, deviceFacts } from "./source.js";

const SIZE_CHOICES = [["", "Any size"], [String(512 * 1024 * 1024), "Up to 512 MB"], [String(1024 ** 3), "Up to 1 GB"], [String(2 * 1024 ** 3), "Up to 2 GB"]];
const CAPABILITY_CHOICES = [["", "Any capability"], ["json", "JSON output"], ["tools", "Tool calling"], ["images", "Image input"]];

function parameterText(count) {
  return count >= 1e9 ? `${(count / 1e9).toFixed(1)} B parameters` : `${Math.round(count / 1e6)} M parameters`;
}

function hostOf(url) {
  try {
    return new URL(url).host;
  } catch {
    return "";
  }
}

function sizeText(entry) {
  return `${entry.estimate ? "about " : ""}${formatBytes(entry.downloadBytes)}`;
}

function select(id, label, choices) {
  const control = el("select", { id });
  for (const [value, text] of choices) control.append(new Option(text, value));
  return [el("label", { for: id }, label), control];
}

/** `localStorage` key: the user dismissed the first-run card. */
export const FIRST_RUN_KEY = "napllm.firstRunDismissed";

function firstRunDismissed() {
  try {
    return localStorage.getItem(FIRST_RUN_KEY) === "1";
  } catch {
    return true; // no storage: never nag on every visit
  }
}

export class CatalogueView {
  /**
   * @param {HTMLElement} after the element the "Browse models" button goes after.
   * @param {() => object|null} runtime the attached runtime API or null.
   */
  constructor(after, runtime) {
    this.runtime = runtime;
    this.catalogue = null;
    this.device = null;
    this.loading = null;
    this.open = false;
    this.button = el("button", { type: "button", id: "catalogue-open", class: "secondary", "aria-expanded": "false", "aria-controls": "catalogue" }, "Browse models");
    const [textLabel, text] = [el("label", { for: "catalogue-filter-text" }, "Search"), el("input", { id: "catalogue-filter-text", type: "search", autocomplete: "off" })];
    const [engineLabel, engine] = select("catalogue-filter-engine", "Engine", [["", "Any engine"]]);
    const [capabilityLabel, capability] = select("catalogue-filter-capability", "Capability", CAPABILITY_CHOICES);
    const [sizeLabel, size] = select("catalogue-filter-size", "Download size", SIZE_CHOICES);
    this.filters = { text, engine, capability, size };
    this.status = el("p", { id: "catalogue-status", class: "muted", role: "status" });
    this.suggested = el("p", { id: "catalogue-suggestion", class: "catalogue-suggestion", hidden: true });
    this.list = el("ul", { id: "catalogue-list", class: "catalogue-list" });
    this.section = el("section", { id: "catalogue", class: "catalogue", "aria-labelledby": "catalogue-heading", hidden: true },
      el("h3", { id: "catalogue-heading" }, "Model catalogue"),
      el("p", { class: "muted" }, "Small open models that run in this browser. Nothing is downloaded until you press Download and add."),
      this.suggested,
      el("div", { class: "catalogue-filters", role: "search", "aria-label": "Filter the catalogue" },
        el("div", {}, textLabel, text), el("div", {}, engineLabel, engine),
        el("div", {}, capabilityLabel, capability), el("div", {}, sizeLabel, size)),
      this.status,
      this.list);
    this.firstRunCard = el("section", { id: "first-run", class: "first-run", "aria-labelledby": "first-run-heading", hidden: true });
    this.firstRunState = "unknown"; // "unknown" | "shown" | "done"
    after.after(this.button, this.firstRunCard, this.section);
    this.button.addEventListener("click", () => this.toggle());
    for (const control of Object.values(this.filters)) control.addEventListener("input", () => this.render());
  }

  /**
   * The connections were listed (public summaries): offer the first-run
   * card while none is the user's own (module rules). Never rejects.
   */
  async connectionsListed(connections) {
    const own = connections.some((c) => c?.settings?.userDefined === true);
    if (own || firstRunDismissed()) {
      this.hideFirstRun();
      return;
    }
    if (this.firstRunState !== "unknown") return;
    this.firstRunState = "shown";
    await this.load(false);
    if (this.firstRunState !== "shown" || !this.catalogue) return;
    const { entries, engines } = this.catalogue;
    const best = suggestion(entries, this.device, engines);
    const show = el("button", { type: "button", id: "first-run-show" }, best ? "Show it" : "Browse models");
    const later = el("button", { type: "button", id: "first-run-dismiss", class: "secondary" }, "Not now");
    show.addEventListener("click", async () => {
      if (!this.open) await this.toggle();
      if (best) this.showEntry(best.id);
    });
    later.addEventListener("click", () => {
      try {
        localStorage.setItem(FIRST_RUN_KEY, "1");
      } catch {
        // the card still goes for this page
      }
      this.hideFirstRun();
      this.button.focus();
    });
    this.firstRunCard.replaceChildren(
      el("h3", { id: "first-run-heading" }, "Get a model for real use"),
      el("p", {}, "TinyChat, built in, is a tiny test model. ", best
        ? el("span", {}, "Suggested for this device: ", el("strong", {}, best.name), ` (${engines[best.engine].label}, ${sizeText(best)} download).`)
        : "No model in the catalogue fits this device well; the catalogue lists those that may be slow."),
      el("p", { class: "muted" }, "Nothing is downloaded until you press Download and add."),
      el("div", { class: "first-run-actions" }, show, later));
    this.firstRunCard.dataset.id = best ? best.id : "";
    this.firstRunCard.hidden = false;
  }

  hideFirstRun() {
    this.firstRunState = "done";
    this.firstRunCard.hidden = true;
  }

  /** Open or close the view (reads the catalogue and the device facts the first time). */
  async toggle() {
    this.open = !this.open;
    this.section.hidden = !this.open;
    this.button.setAttribute("aria-expanded", String(this.open));
    if (this.open) await this.load();
  }

  /**
   * Read the catalogue and this device's facts (once; a failed read is tried
   * again), then draw the list unless `render` is false.
   */
  async load(render = true) {
    if (this.catalogue) {
      if (render) this.render();
      return;
    }
    if (!this.loading) {
      this.status.textContent = "Reading the catalogue…";
      this.loading = Promise.all([catalogueText(), deviceFacts(), engineDeclarations()])
        .then(([text, device, declared]) => {
          // Only engine kinds this build declares (never one the file invents).
          this.catalogue = readCatalogue(text, new Set(declared.map((d) => d.kind)));
          this.device = device;
          for (const [kind, info] of Object.entries(this.catalogue.engines)) this.filters.engine.append(new Option(info.label, kind));
        })
        .catch(() => {
          this.status.textContent = "The catalogue could not be read. Try again later.";
        })
        .finally(() => {
          this.loading = null;
        });
    }
    await this.loading;
    if (this.catalogue && (render || this.open)) this.render();
  }

  /** Draw the suggestion and the entries the filter keeps. */
  render() {
    if (!this.catalogue) return;
    const { entries, engines } = this.catalogue;
    const best = suggestion(entries, this.device, engines);
    this.suggested.hidden = false;
    this.suggested.replaceChildren(best
      ? el("span", {}, "Suggested for this device: ",
        el("button", { type: "button", class: "link", dataset: { id: best.id } }, best.name),
        ` (${engines[best.engine].label}, ${sizeText(best)} download).`)
      : "No model in the catalogue fits this device well; those that may be slow are listed.");
    this.suggested.querySelector("button")?.addEventListener("click", () => this.showEntry(best.id));
    this.suggested.dataset.id = best ? best.id : "";
    const shown = filterEntries(entries, {
      text: this.filters.text.value,
      engine: this.filters.engine.value,
      capability: this.filters.capability.value,
      maxBytes: Number(this.filters.size.value) || 0,
    });
    this.list.replaceChildren(...shown.map((entry) => this.entryItem(entry)));
    this.status.textContent = `${shown.length} of ${entries.length} models shown.`;
  }

  /** Show the details of entry `id` (the filter is cleared if it hid it). */
  showEntry(id) {
    let item = this.list.querySelector(`li[data-id="${CSS.escape(id)}"]`);
    if (!item) {
      for (const control of Object.values(this.filters)) control.value = "";
      this.render();
      item = this.list.querySelector(`li[data-id="${CSS.escape(id)}"]`);
    }
    const toggle = item?.querySelector(".catalogue-toggle");
    if (toggle && toggle.getAttribute("aria-expanded") !== "true") toggle.click();
    toggle?.focus();
  }

  entryItem(entry) {
    const engine = this.catalogue.engines[entry.engine];
    const fit = fitOf(entry, this.device, this.catalogue.engines);
    const detailsId = `catalogue-details-${entry.id.replace(/[^A-Za-z0-9_-]/g, "_")}`;
    const toggle = el("button", { type: "button", class: "catalogue-toggle link", "aria-expanded": "false", "aria-controls": detailsId }, entry.name);
    const verdict = el("span", { class: `catalogue-verdict verdict-${fit.verdict}` }, VERDICT_TEXT[fit.verdict]);
    const summary = el("p", { class: "catalogue-summary" },
      `${engine.label} · ${entry.quantization} · `, el("span", { class: "catalogue-size" }, sizeText(entry)), " · ", verdict,
      fit.reasons.length ? el("span", { class: "catalogue-reasons muted" }, `: ${fit.reasons.join("; ")}`) : null);
    const details = this.details(entry, fit, detailsId);
    toggle.addEventListener("click", () => {
      const expanded = toggle.getAttribute("aria-expanded") !== "true";
      toggle.setAttribute("aria-expanded", String(expanded));
      details.hidden = !expanded;
    });
    return el("li", { class: "catalogue-entry", dataset: { id: entry.id, verdict: fit.verdict, engine: entry.engine } }, toggle, summary, details);
  }

  details(entry, fit, id) {
    const hosts = [...new Set(entry.files.map((file) => hostOf(file.url)))].join(", ");
    const caps = Object.entries(entry.capabilities).filter(([, on]) => on).map(([name]) => ({ json: "JSON output", tools: "tool calling", images: "image input" })[name]);
    const licence = el("a", { href: entry.licence.url, target: "_blank", rel: "noopener noreferrer", class: "catalogue-licence" }, entry.licence.name);
    const add = el("button", { type: "button", class: "catalogue-add" }, `Download and add (${sizeText(entry)})`);
    const progress = el("progress", { max: 1, value: 0, hidden: true, "aria-label": `Download of ${entry.name}` });
    const state = el("p", { class: "catalogue-state", role: "status" });
    let accept = null;
    if (entry.licence.accept) {
      accept = el("input", { type: "checkbox", id: `${id}-accept`, class: "catalogue-accept" });
      add.setAttribute("aria-disabled", "true");
      accept.addEventListener("change", () => (accept.checked ? add.removeAttribute("aria-disabled") : add.setAttribute("aria-disabled", "true")));
    }
    add.addEventListener("click", () => this.add(entry, { add, progress, state, accept }));
    return el("div", { id, class: "catalogue-details", hidden: true },
      el("ul", { class: "catalogue-facts" },
        el("li", {}, `${entry.family} · ${parameterText(entry.parameters)} · ${entry.quantization} · context ${entry.contextSize} tokens`),
        el("li", {}, `Download: ${sizeText(entry)}${entry.estimate ? " (the host's size is confirmed before the download)" : ""}`),
        el("li", {}, `Memory: about ${formatBytes(entry.memory.totalMB * 1024 * 1024)} (weights and context)`),
        el("li", {}, `Can do: ${caps.length ? caps.join(", ") : "chat"}`),
        el("li", {}, `From: ${hosts}`, ...(entry.source ? [" (", el("a", { href: entry.source, target: "_blank", rel: "noopener noreferrer" }, "model page"), ")"] : [])),
        el("li", {}, "Licence: ", licence, entry.licence.accept ? " — you must accept it to use this model" : null)),
      fit.verdict === "no" ? el("p", { class: "muted" }, `This device: ${fit.reasons.join("; ")}.`) : null,
      accept ? el("p", {}, accept, el("label", { for: accept.id }, ` I have read and accept the ${entry.licence.name}`)) : null,
      add, progress, state);
  }

  async add(entry, { add, progress, state, accept }) {
    if (add.getAttribute("aria-disabled") === "true") {
      if (accept && !accept.checked) state.textContent = `Read the ${entry.licence.name} and tick the box to accept it first.`;
      return;
    }
    const runtime = this.runtime();
    if (!runtime) {
      state.textContent = "The runtime has not started yet.";
      return;
    }
    add.setAttribute("aria-disabled", "true");
    progress.hidden = false;
    progress.value = 0;
    const result = await addFromCatalogue(entry, this.catalogue, runtime, (label, fraction) => {
      state.textContent = label;
      if (fraction >= 0) progress.value = fraction;
    });
    progress.hidden = true;
    add.removeAttribute("aria-disabled");
    state.textContent = result.ok ? `${entry.name} is added and ready.` : result.text;
    state.dataset.result = result.ok ? "added" : "refused";
    document.dispatchEvent(new Event(STORAGE_CHANGED));
  }
}
