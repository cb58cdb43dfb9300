/**
 * The progress of a model download (web/engines/download.js): the events
 * its `onProgress` gets and the one line of text the page shows for them.
 *
 * Rules
 * - An event: `{url, received, total, bytesPerSecond, secondsLeft,
 *   resumedFrom, restarted, retrying, shared}` (bytes, bytes per second,
 *   seconds). `restarted`: null or why the download began again from zero
 *   (`RESTART_TEXT`); `retrying`: null or `{why, inSeconds, tries}` while
 *   it waits before its next try; `shared`: the bytes are another tab's
 *   download. At most every `PROGRESS_MS`, and on every retry.
 * - The texts are this module's own: no text of a host reaches them.
 */

const PROGRESS_MS = 100;

/** Why a download began again from zero, in the progress text's words. */
export const RESTART_TEXT = {
  "no-ranges": "the server cannot resume downloads",
  changed: "the file changed on the server",
  slice: "the server sent part of the file as the whole file",
  inconsistent: "the server's answer contradicted itself",
  cut: "the download broke off and the server cannot resume it",
};

/** Reports progress at most every PROGRESS_MS, with speed and time left. */
export class Meter {
  constructor(url, onProgress, channel) {
    this.url = url;
    this.onProgress = onProgress;
    this.channel = channel;
    this.last = 0;
    this.samples = [];
    this.resumedFrom = 0;
    this.restarted = null;
    this.retrying = null;
    this.received = 0;
    this.total = null;
  }

  /** `received` of `total` bytes (total null: unknown); `force`: report now. */
  report(received, total, force = false) {
    const now = Date.now();
    this.received = received;
    this.total = total;
    this.samples.push([now, received]);
    while (this.samples.length > 2 && now - this.samples[0][0] > 3000) this.samples.shift();
    if (!force && now - this.last < PROGRESS_MS) return;
    this.last = now;
    const [t0, b0] = this.samples[0];
    const bytesPerSecond = now > t0 && received >= b0 ? ((received - b0) * 1000) / (now - t0) : 0;
    const secondsLeft = total && bytesPerSecond > 0 ? Math.max(0, (total - received) / bytesPerSecond) : null;
    const event = {
      url: this.url,
      received,
      total,
      bytesPerSecond,
      secondsLeft,
      resumedFrom: this.resumedFrom,
      restarted: this.restarted,
      retrying: this.retrying,
      shared: false,
    };
    try {
      this.onProgress(event);
    } catch {
      /* a failing reporter never breaks a download */
    }
    if (this.channel) this.channel.postMessage({ type: "progress", ...event });
  }

  /** The download waits `ms` before try number `tries + 1` because of `why`. */
  retry(why, ms, tries) {
    this.retrying = { why: String(why), inSeconds: Math.ceil(ms / 1000), tries };
    this.samples = [];
    this.report(this.received, this.total, true);
    this.retrying = null;
  }
}

function bytesText(bytes) {
  const units = ["B", "kB", "MB", "GB"];
  let amount = Number(bytes) || 0;
  let unit = 0;
  while (amount >= 1000 && unit < units.length - 1) {
    amount /= 1000;
    unit += 1;
  }
  return unit === 0 ? `${amount} B` : `${amount.toFixed(amount < 10 ? 1 : 0)} ${units[unit]}`;
}

/**
 * One line for a progress event (`onProgress`): "12 MB of 40 MB, 2.1 MB/s,
 * 14 s left", with why it began again, where it resumed, or why and when
 * it tries again.
 */
export function describeProgress(event) {
  if (!event) return "";
  const parts = [event.total ? `${bytesText(event.received)} of ${bytesText(event.total)}` : bytesText(event.received)];
  if (event.bytesPerSecond > 0) parts.push(`${bytesText(event.bytesPerSecond)}/s`);
  if (Number.isFinite(event.secondsLeft) && event.secondsLeft !== null) parts.push(`${Math.ceil(event.secondsLeft)} s left`);
  let text = parts.join(", ");
  if (event.retrying && typeof event.retrying === "object") {
    const { why, inSeconds, tries } = event.retrying;
    text += ` (${why}: trying again in ${Number(inSeconds) || 0} s, try ${Number(tries) + 1})`;
  } else if (RESTART_TEXT[event.restarted]) {
    text += ` (${RESTART_TEXT[event.restarted]}: started again)`;
  } else if (event.resumedFrom > 0) {
    text += ` (resumed at ${bytesText(event.resumedFrom)})`;
  }
  if (event.shared) text += " (in another tab)";
  return text;
}
