/**
 * "Look for running servers" in the connections form: the runtime probes
 * the usual local ports (napllm.discovery) only when the button is pressed;
 * this view lists what answered and hands a picked model to the form.
 *
 * Rules
 * - Each server found lists its models; picking one fills the form
 *   (`onUse(server, model)`). A server that refuses this page shows the
 *   runtime's fix for that server; addresses a cross-origin isolated page
 *   could not read are listed, collapsed, with what to change if one runs.
 * - A typed secret goes only to servers of the chosen kind, and only to the
 *   base URL's address when one is filled in (the runtime's `secret_goes_to`).
 * - An answer that arrives after the form closed or asked again is dropped
 *   (`reset` and every new look bump a serial).
 * - Every value is inserted as text, never as markup.
 */

import { el, str } from "./dom.js";

/** Words for a discovery finding's status (napllm.discovery.Finding). */
const FOUND_STATUS = {
  found: "Running.",
  "needs-key": "Running, and it asks for a key.",
  cors: "Running, but it does not accept requests from this page.",
  blocked: "The browser did not let this page reach it.",
  "not-a-model-server": "Something else answers on this port.",
};

export class DiscoveryView {
  /**
   * @param {HTMLElement} form the connections form (ids in index.html).
   * @param {() => object|null} runtime the attached runtime API or null.
   * @param {(server: object, model: string) => void} onUse fills the form from a found model.
   */
  constructor(form, runtime, onUse) {
    this.runtime = runtime;
    this.onUse = onUse;
    this.serial = 0;
    this.section = form.querySelector("#connection-discovery");
    this.button = form.querySelector("#connection-discover");
    this.results = form.querySelector("#connection-discovery-results");
  }

  /** Show or hide the section (a kind that can be discovered, or not). */
  offer(on) {
    this.section.hidden = !on;
    this.button.disabled = !on;
  }

  /** Forget the shown results; a look in flight is dropped when it answers. */
  reset() {
    this.serial += 1;
    this.results.replaceChildren();
  }

  /**
   * Probe for servers of `kind` (`secret` and `baseUrl` as typed) and show
   * what answered.
   */
  async look(kind, secret, baseUrl) {
    const runtime = this.runtime();
    if (!runtime || typeof runtime.discoverServers !== "function") return;
    const serial = (this.serial += 1);
    this.button.disabled = true;
    this.results.replaceChildren(el("p", { class: "muted" }, "Looking for model servers on this computer…"));
    let servers = [];
    try {
      const answer = JSON.parse(String(await runtime.discoverServers(location.origin, kind, secret, baseUrl)));
      servers = Array.isArray(answer?.servers) ? answer.servers.filter((s) => s && typeof s === "object") : [];
    } catch (error) {
      console.error("napllm: discoverServers failed", error?.name ?? "");
      servers = [];
    } finally {
      if (serial === this.serial) this.button.disabled = false;
    }
    if (serial !== this.serial) return; // the form was closed or asked again meanwhile
    this.render(servers);
  }

  /** Show the servers found (`Finding.to_json()` records). */
  render(servers) {
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
        use.addEventListener("click", () => this.onUse(server, model));
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
    this.results.replaceChildren(
      el("p", { class: "discovery-summary" }, summary),
      nodes.length > 0 ? el("ul", { class: "found-servers" }, ...nodes) : null,
      unsure,
      absent.length > 0 ? el("p", { class: "muted" }, `Nothing answered at: ${absent.join(", ")}.`) : null,
    );
  }
}
