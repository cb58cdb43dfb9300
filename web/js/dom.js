/**
 * Small DOM helpers shared by the shell's panels and dialogs.
 *
 * Rules
 * - Values are inserted as text or attributes, never as markup.
 * - `el` sets `class` and `dataset` specially, a non-string value of a
 *   known property as that property (e.g. `disabled: true`), and anything
 *   else as an attribute.
 */

/** Create `<tag>` with `props` and `children` (null/undefined children are skipped). */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key in node && typeof value !== "string") node[key] = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

/**
 * A panel's elements by the ids index.html gives them: `{name: id}` ->
 * `{name: the element below \`root\` with that id, or null}`. Each panel
 * names its controls in one table instead of a lookup per control.
 *
 * @param {ParentNode} root the panel (or form) the elements are in.
 * @param {Record<string, string>} ids the ids (without `#`), by the name the panel uses.
 * @returns {Record<string, Element|null>}
 */
export function byIds(root, ids) {
  return Object.fromEntries(Object.entries(ids).map(([name, id]) => [name, root.querySelector(`#${id}`)]));
}

/** `value` if it is a string, else `fallback`. */
export const str = (value, fallback = "") => (typeof value === "string" ? value : fallback);

/**
 * Re-render `container` with `render()` without losing the keyboard focus.
 *
 * A list that is rebuilt (connections, standing permissions, stored models)
 * would otherwise drop the focus to <body> when the focused button is
 * replaced. The focused element inside `container` is remembered by the
 * `data-focus-key` of its nearest list item and its own class; afterwards
 * the same control of the same item gets the focus, else the first button
 * of the item now at its position (the next one), else `fallback()`.
 * Nothing is moved when the focus was outside `container`.
 *
 * @param {HTMLElement} container the element whose children `render` replaces.
 * @param {() => void} render rebuilds the children synchronously.
 * @param {() => HTMLElement|null} [fallback] where the focus goes when no item is left.
 */
export function keepFocus(container, render, fallback = () => null) {
  const focused = document.activeElement;
  if (!(focused instanceof HTMLElement) || !container.contains(focused)) {
    render();
    return;
  }
  const item = focused.closest("[data-focus-key]");
  const key = item ? item.dataset.focusKey : null;
  const position = item ? [...container.querySelectorAll("[data-focus-key]")].indexOf(item) : -1;
  const cls = focused.className && typeof focused.className === "string" ? focused.className.split(" ")[0] : "";
  render();
  if (focused.isConnected && container.contains(focused)) return;
  const items = [...container.querySelectorAll("[data-focus-key]")];
  const same = items.find((node) => node.dataset.focusKey === key);
  const usable = (node) => node instanceof HTMLElement && !node.disabled && !node.hidden;
  let target = same && cls ? same.querySelector(`.${CSS.escape(cls)}`) : null;
  if (!usable(target)) {
    const next = same ?? items[Math.min(Math.max(position, 0), items.length - 1)];
    target = next ? next.querySelector("button, a[href], input, select, textarea") : null;
  }
  if (!usable(target)) target = fallback();
  if (target) target.focus();
}

/**
 * `node` made focusable by script only (`tabindex="-1"`), for moving the
 * focus to a heading when the control that had it is gone; null stays null.
 */
export function focusableHeading(node) {
  if (node instanceof HTMLElement && !node.hasAttribute("tabindex")) node.tabIndex = -1;
  return node instanceof HTMLElement ? node : null;
}

/**
 * Run `action()` (async) with `button` marked busy (`aria-disabled="true"`);
 * a click while it is busy does nothing and resolves to undefined.
 *
 * Not the `disabled` property: disabling the focused button drops the
 * keyboard focus to <body>, so a keyboard user would have to find their
 * place again after every Save, Delete or Revoke.
 */
export async function whileBusy(button, action) {
  if (button.getAttribute("aria-disabled") === "true") return undefined;
  button.setAttribute("aria-disabled", "true");
  try {
    return await action();
  } finally {
    button.removeAttribute("aria-disabled");
  }
}
