/**
 * The connections column as a panel on narrow screens.
 *
 * Rules
 * - On wide screens the column is always shown and the toggle is not
 *   displayed (web/shell.css). On narrow screens (the media query in
 *   web/shell.css) the column is shown only while `data-side="open"` is set
 *   on the layout, which the toggle switches; `aria-expanded` follows it.
 */

/** Wires `button` to open and close the side panel of `layout`. */
export class PanelToggle {
  /**
   * @param {HTMLButtonElement} button the toggle (aria-controls names the panel).
   * @param {HTMLElement} layout the element carrying `data-side` ("open" | "closed").
   */
  constructor(button, layout) {
    this.button = button;
    this.layout = layout;
    button.addEventListener("click", () => this.set(!this.isOpen()));
    this.set(false);
  }

  /** True while the panel is open (on narrow screens; wide screens always show it). */
  isOpen() {
    return this.layout.dataset.side === "open";
  }

  /** Open (`true`) or close the panel. */
  set(open) {
    this.layout.dataset.side = open ? "open" : "closed";
    this.button.setAttribute("aria-expanded", String(open));
  }
}
