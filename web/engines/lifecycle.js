/**
 * Lifecycles as data: a table from each state to the events it accepts and
 * the state each leads to. The page's frames and documents
 * (web/js/frame-binding.js) and the engine host's models (engine-host.js)
 * move only as their tables allow; an event a state does not list is
 * refused, never guessed. Own code rather than a state-machine library: a
 * lookup in a frozen object is all it needs.
 */

/**
 * The state `event` leads to from `state` in `table`, or null when the
 * table does not allow it.
 *
 * @param {Readonly<Record<string, Readonly<Record<string, string>>>>} table
 * @param {string} state
 * @param {string} event
 * @returns {string | null}
 */
export function transition(table, state, event) {
  const row = table[state];
  return row && Object.hasOwn(row, event) ? row[event] : null;
}

/**
 * Move `holder` (an object with a `state`) by `event` in `table`: its new
 * state, or null (and `holder` unchanged) when the table refuses it.
 */
export function advance(holder, table, event) {
  const to = transition(table, holder.state, event);
  if (to !== null) holder.state = to;
  return to;
}
