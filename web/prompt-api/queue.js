/**
 * A session's operations, one after another, and how they stop: the
 * session's `destroy()`, an operation's `signal`.
 *
 * Rules
 * - Operations run in the order they were asked for; each starts when the
 *   one before has settled, so a turn is committed before the next is sent.
 * - `destroy()` and an aborted `signal` reject an operation at once (with
 *   the destroy reason or the signal's own reason), set its `op.stopped`
 *   and call each of its `op.cancels`, so the generation it runs is
 *   cancelled and nothing of it is committed. After `destroy()` every
 *   waiting and later operation rejects with the same reason.
 * - Generations in flight are tracked (`track`) so that `destroy()` and a
 *   cancelled stream can cancel them (NAP-LLM `cancel`).
 */

import { abortReason } from "./errors.js";

export class OperationQueue {
  #tail = Promise.resolve();
  #destroyed = false;
  #reason = null;
  #running = new Set(); // `{cancel, streamed}` of the active generations
  #rejectors = new Set(); // stop functions of pending operations

  /** Whether `destroy` was called. */
  get destroyed() {
    return this.#destroyed;
  }

  /**
   * Run `task(op)` after the earlier operations. `destroy()` and `signal`
   * reject it at once, set `op.stopped` and call every function in
   * `op.cancels`.
   *
   * @param {(op: {stopped: boolean, cancels: Set<Function>}) => Promise<any>} task
   * @param {AbortSignal | null} signal
   * @returns {Promise<any>} what `task` resolves with.
   */
  run(task, signal) {
    const run = this.#tail.then(() => new Promise((resolve, reject) => {
      if (this.#destroyed) {
        reject(this.#reason);
        return;
      }
      if (signal && signal.aborted) {
        reject(abortReason(signal));
        return;
      }
      const op = { stopped: false, cancels: new Set() };
      const stop = (reason) => {
        op.stopped = true;
        for (const cancel of op.cancels) cancel();
        reject(reason);
      };
      const onAbort = () => stop(abortReason(signal));
      if (signal) signal.addEventListener("abort", onAbort, { once: true });
      this.#rejectors.add(stop);
      task(op).then(resolve, reject).finally(() => {
        this.#rejectors.delete(stop);
        if (signal) signal.removeEventListener("abort", onAbort);
      });
    }));
    this.#tail = run.catch(() => {});
    return run;
  }

  /**
   * Track a generation in flight.
   *
   * @param {{cancel: () => Promise<any>, streamed: ReadableStream | null}} generation
   * @returns {() => void} untracks it.
   */
  track(generation) {
    this.#running.add(generation);
    return () => this.#running.delete(generation);
  }

  /** Cancel the tracked generations `which` accepts (all by default). */
  cancelRunning(which = () => true) {
    for (const generation of this.#running) if (which(generation)) generation.cancel().catch(() => {});
  }

  /** Cancel what runs, reject what waits, and every later operation, with `reason`. */
  destroy(reason) {
    if (this.#destroyed) return;
    this.#destroyed = true;
    this.#reason = reason;
    this.cancelRunning();
    for (const reject of this.#rejectors) reject(reason);
    this.#rejectors.clear();
  }
}
