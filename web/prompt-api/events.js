/**
 * The Prompt API layer's events: `downloadprogress` on the monitor of
 * `create()`, and the `on<event>` handler properties the Prompt API's
 * objects carry (`ondownloadprogress`, `oncontextoverflow`).
 *
 * Rules
 * - A handler property holds a function or null (anything else reads back
 *   as null) and is one listener beside those added with
 *   `addEventListener`: setting it replaces only the listener it set
 *   before (`replaceHandler`).
 * - `downloadprogress` reports `loaded` from 0 to 1 with `total` 1: no
 *   byte figures of the shell's downloads reach the napplet.
 */

/**
 * Swap the listener behind an `on<type>` property of `target`.
 *
 * @param {EventTarget} target the object whose property was set.
 * @param {string} type the event type ("contextoverflow").
 * @param {Function | null} current the listener the property held.
 * @param {unknown} value the value assigned to the property.
 * @returns {Function | null} what the property holds now.
 */
export function replaceHandler(target, type, current, value) {
  if (current) target.removeEventListener(type, current);
  const next = typeof value === "function" ? value : null;
  if (next) target.addEventListener(type, next);
  return next;
}

/** The Prompt API's `downloadprogress` event: `loaded` from 0 to 1. */
export class DownloadProgressEvent extends Event {
  constructor(type, init) {
    super(type);
    this.loaded = init.loaded;
    this.total = 1;
    this.lengthComputable = true;
  }
}

/** What `monitor(m)` receives at `create()`. */
export class CreateMonitor extends EventTarget {
  #handler = null;
  get ondownloadprogress() {
    return this.#handler;
  }
  set ondownloadprogress(fn) {
    this.#handler = replaceHandler(this, "downloadprogress", this.#handler, fn);
  }
}
