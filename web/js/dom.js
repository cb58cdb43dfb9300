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

/** `value` if it is a string, else `fallback`. */
export const str = (value, fallback = "") => (typeof value === "string" ? value : fallback);
