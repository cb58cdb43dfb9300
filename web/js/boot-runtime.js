/**
 * Start the napllm runtime in a Pyodide that has the `napllm` package
 * loaded (the last step of the shell's boot, web/shell.js).
 *
 * Rules
 * - Runs `napllm.browser.app.start()`, which attaches the runtime to
 *   `window.napllmHost`; rejects with Pyodide's error if Python fails.
 * - Reads nothing from the page's URL.
 */

/** @param {object} py the loaded Pyodide instance. */
export async function startRuntime(py) {
  await py.runPythonAsync("from napllm.browser.app import start\nawait start()");
}
