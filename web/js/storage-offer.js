/**
 * After a model is deleted in the Storage panel: the offer to remove the
 * connections that read it (they would download it again at their next
 * use). The panel (pwa.js) sends `MODEL_DELETED`; this offer, made by the
 * connections panel (which holds the runtime), shows one line per deleted
 * model in the Storage section with "Remove" and "Keep" buttons.
 *
 * Rules
 * - Nothing is removed without the user's click; "Keep" only closes the offer.
 * - Names are inserted as text (dom.js `el`), never markup.
 */

import { el, str } from "./dom.js";

/** The event (detail `{name, connections: [summary]}`) of a model deleted in the Storage panel. */
export const MODEL_DELETED = "napllm-model-deleted";

export class StorageRemovalOffer {
  /** @param {() => object|null} runtime the attached runtime API or null. */
  constructor(runtime) {
    this.runtime = runtime;
    document.addEventListener(MODEL_DELETED, (event) => this.offer(event.detail));
  }

  /** Show the offer for `detail` (`MODEL_DELETED`'s) under the Storage heading. */
  offer(detail) {
    const section = document.querySelector("#storage");
    const connections = Array.isArray(detail?.connections) ? detail.connections.filter((c) => typeof c?.id === "string") : [];
    if (!section || connections.length === 0) return;
    const names = connections.map((c) => `“${str(c.name, c.id)}”`).join(", ");
    const remove = el("button", { type: "button", class: "storage-offer-remove" }, connections.length === 1 ? "Remove the connection" : "Remove the connections");
    const keep = el("button", { type: "button", class: "secondary storage-offer-keep" }, "Keep");
    const box = el("p", { class: "notice storage-offer", role: "status" },
      `${str(detail.name, "The model")} was deleted. ${names} used it and would download it again. `,
      remove, " ", keep);
    section.querySelector("#storage-heading").after(box);
    keep.addEventListener("click", () => box.remove());
    remove.addEventListener("click", async () => {
      const runtime = this.runtime();
      if (!runtime) return;
      remove.setAttribute("aria-disabled", "true");
      for (const connection of connections) {
        try {
          await runtime.removeConnection(connection.id);
        } catch (error) {
          console.error("napllm: removeConnection failed", error?.name ?? "");
        }
      }
      box.replaceChildren(connections.length === 1 ? "The connection was removed." : "The connections were removed.");
    });
  }
}
