/**
 * The napplet gallery of the start view and the first-visit napplet.
 *
 * Rules
 * - Entries come from `napplets/index.json`, written by build.py from each
 *   napplet's own <title>, <meta name="description"> and icon link. Napplet
 *   pages are untrusted, so the page checks the entries again: text is
 *   inserted with textContent only and cut to the same bounds as the build,
 *   and an icon is used only when it is a small `data:image/...` URL or a
 *   plain relative path under `napplets/` (a file inside dist/).
 * - The Chat napplet opens by itself on the first visit to the start view
 *   (no `?napplet=` link); localStorage remembers that the first visit
 *   happened. Without localStorage nothing opens by itself.
 */

import { el, str } from "./dom.js";

/** Bounds of card text (characters) and icon data URLs, as in build.py. */
export const TITLE_MAX = 60;
export const DESCRIPTION_MAX = 160;
export const ICON_DATA_MAX = 16 * 1024;
/** The localStorage key recording that the first visit happened. */
export const FIRST_VISIT_KEY = "napllm.firstVisit";
/** The napplet that opens by itself on the first visit. */
export const FIRST_NAPPLET = "chat";

const ICON_DATA_RE = /^data:image\/(?:png|gif|jpeg|webp|svg\+xml)(?:;base64)?,[^\s"'<>\\]*$/i;
const ICON_PATH_RE = /^napplets\/[A-Za-z0-9_.-]+(?:\/[A-Za-z0-9_.-]+)*$/;
// Control and bidirectional-override characters never reach the page.
// eslint-disable-next-line no-control-regex
const CONTROL_RE = /[\u0000-\u001f\u007f-\u009f\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb\u{e0000}-\u{e007f}]/gu;

/** One line of plain text of at most `limit` characters. */
export function cardText(value, limit) {
  const clean = str(value).replace(CONTROL_RE, " ").split(/\s+/).filter(Boolean).join(" ");
  return clean.length > limit ? `${clean.slice(0, limit - 1).trimEnd()}…` : clean;
}

/** The icon URL of an entry resolved against `base`, or "" when it is not acceptable. */
export function iconUrl(value, base) {
  const icon = str(value);
  if (icon.length <= ICON_DATA_MAX && ICON_DATA_RE.test(icon)) return icon;
  if (!ICON_PATH_RE.test(icon) || icon.split("/").includes("..")) return "";
  const url = new URL(icon, base);
  return url.origin === new URL(base).origin ? url.href : "";
}

/**
 * The usable entries of a parsed index: `[{name, title, description, icon, url}]`
 * with `url` absolute (resolved against `base`, the shell's folder).
 */
export function galleryEntries(parsed, base) {
  if (!Array.isArray(parsed)) return [];
  const out = [];
  for (const entry of parsed) {
    if (!entry || typeof entry.name !== "string" || !entry.name || typeof entry.path !== "string") continue;
    const name = cardText(entry.name, TITLE_MAX);
    out.push({
      name: entry.name,
      title: cardText(entry.title, TITLE_MAX) || name,
      description: cardText(entry.description, DESCRIPTION_MAX),
      icon: iconUrl(entry.icon, base),
      url: new URL(entry.path, base).href,
    });
  }
  return out;
}

/** Render `entries` as cards into `list`; `open(entry)` runs on a card's Open button. */
export function renderGallery(list, entries, open) {
  const cards = entries.map((entry, index) => {
    const titleId = `napplet-card-${index}-title`;
    const icon = entry.icon
      ? el("img", { class: "card-icon", src: entry.icon, alt: "", width: "48", height: "48", decoding: "async" })
      : el("span", { class: "card-icon card-icon-letter", "aria-hidden": "true" }, entry.title.slice(0, 1).toUpperCase());
    const button = el(
      "button",
      { type: "button", class: "card-open primary" },
      "Open",
      el("span", { class: "visually-hidden" }, ` ${entry.title}`),
    );
    button.addEventListener("click", () => open(entry));
    return el(
      "li",
      { class: "napplet-card", dataset: { napplet: entry.name } },
      icon,
      el(
        "div",
        { class: "card-text" },
        el("h4", { class: "card-title", id: titleId }, entry.title),
        entry.description ? el("p", { class: "card-description" }, entry.description) : null,
      ),
      button,
    );
  });
  if (cards.length === 0) cards.push(el("li", { class: "empty" }, "No napplets found."));
  list.replaceChildren(...cards);
}

/**
 * True exactly once per browser profile: on the first visit, which this
 * records. False when localStorage is unavailable (nothing opens by itself).
 */
export function takeFirstVisit() {
  try {
    if (window.localStorage.getItem(FIRST_VISIT_KEY)) return false;
    window.localStorage.setItem(FIRST_VISIT_KEY, "done");
    return true;
  } catch {
    return false;
  }
}
