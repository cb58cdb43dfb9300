/**
 * Test build only: replaces dist/js/boot-runtime.js in dist-test/.
 *
 * With `test=1` in the page's query (URLSearchParams, not a substring) it
 * writes the test-hooks module (testhooks/napllm_testhooks.py) into
 * Pyodide's working folder and starts the runtime through it: fixture
 * connections, `window.napllmTest`, `engineDelayMs`. Without it the
 * runtime starts exactly as in the product.
 */

export async function startRuntime(py) {
  if (new URLSearchParams(location.search).get("test") !== "1") {
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
