/**
 * Test build only: replaces dist/js/boot-runtime.js in dist-test/.
 *
 * When `testMode` says so, it writes the test-hooks module
 * (testhooks/napllm_testhooks.py) into Pyodide's working folder and starts
 * the runtime through it: fixture connections, `window.napllmTest`,
 * `engineDelayMs`. Otherwise the runtime starts exactly as in the product.
 */

/**
 * The one rule for test mode: the query's first `test` parameter is `1`
 * (parsed with URLSearchParams, never matched as a substring). The Python
 * hooks do not decide it again.
 * @param {string} search a URL's query, e.g. `location.search`.
 */
export function testMode(search) {
  return new URLSearchParams(search).get("test") === "1";
}

export async function startRuntime(py) {
  if (!testMode(location.search)) {
    await py.runPythonAsync("from napllm.browser.app import start\nawait start()");
    return;
  }
  const response = await fetch(new URL("../testhooks/napllm_testhooks.py", import.meta.url));
  if (!response.ok) throw new Error("the test hooks module is missing from the test build");
  py.FS.writeFile("/home/pyodide/napllm_testhooks.py", await response.text());
  await py.runPythonAsync(
    "import sys\nsys.path.insert(0, '/home/pyodide')\nimport napllm_testhooks\nawait napllm_testhooks.start()",
  );
}
