/**
 * How the engines report model downloads and loads to the host page.
 *
 * Rules
 * - Progress goes to `napllmHost.engineProgress(connectionId, label,
 *   fraction)` (fraction 0..1, -1 when the load failed); a failing page hook
 *   never breaks a load.
 * - A page without that hook gets one `napllmHost.notice` per load instead
 *   (`loadingNotice`).
 */

function host() {
  return globalThis.napllmHost;
}

/** Report a load's progress for `connectionId`. */
export function progress(connectionId, label, fraction) {
  const page = host();
  if (page && typeof page.engineProgress === "function") {
    try {
      page.engineProgress(String(connectionId), String(label), Number(fraction));
    } catch {
      /* the page's UI must not break a load */
    }
  }
}

/** Say that a load starts, on a page that cannot show progress. */
export function loadingNotice(text, connectionId) {
  const page = host();
  if (page && typeof page.engineProgress !== "function" && typeof page.notice === "function") {
    page.notice(JSON.stringify({ level: "info", text, connectionId: String(connectionId) }));
  }
}
