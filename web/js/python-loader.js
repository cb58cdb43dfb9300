/**
 * The Python loader: the inline script the shell places right after the
 * prelude in the frame of a napplet that opts in with
 * `<meta name="napplet-python" content="pkg ...">` (docs/napplets.md,
 * "Napplets in Python: loading"; docs/design.md, "Python napplets";
 * docs/security.md, "Python napplets").
 *
 * Rules
 * - `installPythonLoader` is self-contained: the shell inlines its source
 *   text into the srcdoc (`pythonLoaderSource`), like the prelude's. It
 *   removes its own `<script>` element first, so napplet code never sees
 *   the loader's `secret`.
 * - No network. The loader opens a private channel to the shell: it posts
 *   `{type: "napllm.pythonStart", secret}` to `window.parent` with one
 *   transferred `MessagePort` (napplet code can still reach it, through
 *   the fetch shim below or a `MessageEvent` getter: the shell bounds the channel,
 *   it does not rely on the port being hidden) and asks on
 *   it for files by name, `{name}`; the shell answers `{name, bytes}` or
 *   `{name, error}` and hands each file at most once (web/js/python-files.js).
 *   Pyodide's own `fetch`es of its files go to a virtual base URL
 *   (`PYTHON_BASE`, a `.invalid` host, RFC 6761) that a fetch shim answers
 *   from that channel (only a plain file name of at most 128 characters is
 *   asked for; anything else is a 404 at once); every other URL goes to
 *   the frame's real `fetch`, which the frame's `connect-src 'none'` blocks.
 * - Pyodide's two ES modules (pyodide.mjs, pyodide.asm.mjs) are imported
 *   from `blob:` URLs the loader makes from those bytes (the frame's
 *   `script-src` allows `blob:` for Python napplets only); the asm module is
 *   handed to `loadPyodide` as `createPyodideModule`, so Pyodide never
 *   imports by URL.
 * - The modules, the lock, the wasm and the standard library are asked for
 *   at once, before the shell's handshake ends (the port queues them), so
 *   they cross the port while the modules load; each is handed to one
 *   reader and not kept.
 * - Pyodide boots with the lock the shell serves (our wheels only) and the
 *   packages the meta names, then loads what each script imports
 *   (`loadPackagesFromImports` over the script texts: `napllm`,
 *   `pydantic`, `micropip` only when imported); a meta name the lock does
 *   not pin stops the napplet with an error naming it. When micropip is
 *   loaded, `micropip.install` accepts only pinned names (anything else
 *   raises `ValueError` naming it) and its index is the virtual base, so it
 *   never asks the internet.
 * - Each frame compiles Pyodide's wasm itself: a `WebAssembly.Module` the
 *   shell compiled once cannot be posted here (this opaque-origin frame is
 *   another agent cluster: Chromium delivers a `messageerror`), and V8's
 *   compiled-code cache needs an HTTP cache entry, which no file here has.
 * - Each `<script type="py">` runs in document order with `runPythonAsync`
 *   (top-level `await` allowed, one shared global namespace, the text
 *   dedented). An exception's traceback is shown in a
 *   `<pre class="napplet-python-error" role="alert">` after its script and
 *   logged; the next scripts still run (as with JavaScript scripts).
 * - Progress is the `data-napplet-python` attribute of `<html>`: `loading`,
 *   `booting` (Pyodide's modules are in), `running` (Pyodide and the
 *   packages are loaded), then `ready` (every script ran) or `error`; each
 *   step is also a performance mark `napplet-python:<step>`.
 */

/** The virtual base URL of the files the shell hands a Python napplet (never requested). */
export const PYTHON_BASE = "https://pyodide.napllm.invalid/";
/** The name under which the shell serves the napplets' lock file. */
export const PYTHON_LOCK = "pyodide-lock.json";

/**
 * Boot Pyodide in the current (frame) window from files the shell hands
 * over, then run the page's `<script type="py">` blocks.
 *
 * @param {string} secret the frame's Python secret (hex), checked by the shell.
 * @param {string[]} packages the meta's package names, as written.
 * @param {string} base `PYTHON_BASE`.
 * @param {string} lockName `PYTHON_LOCK`.
 */
export function installPythonLoader(secret, packages, base, lockName) {
  "use strict";
  const win = window;
  const doc = win.document;
  const own = doc.currentScript;
  if (own && own.parentNode) own.parentNode.removeChild(own);

  // Captured before napplet code runs (it may replace globals later).
  const realFetch = win.fetch.bind(win);
  const ResponseCtor = win.Response;
  const BlobCtor = win.Blob;
  const createUrl = win.URL.createObjectURL.bind(win.URL);
  const revokeUrl = win.URL.revokeObjectURL.bind(win.URL);
  const channel = new win.MessageChannel();
  const port = channel.port1;
  const post = win.MessagePort.prototype.postMessage.bind(port);

  // name -> promise of its bytes (ArrayBuffer), from the request until its
  // one reader takes it; `taken` names those handed on already. The bytes
  // are not kept here after that (the frame's memory).
  const pending = new Map();
  const taken = new Set();
  const waiting = new Map();
  port.onmessage = (event) => {
    const data = event.data;
    if (!data || typeof data !== "object" || typeof data.name !== "string") return;
    const waiter = waiting.get(data.name);
    if (!waiter) return;
    waiting.delete(data.name);
    if (data.bytes instanceof ArrayBuffer) waiter.resolve(data.bytes);
    else waiter.reject(new Error(`The shell did not hand over ${data.name}: ${String(data.error)}`));
  };
  // Ask the shell for `name` now (at most once); its reader takes it later.
  const prefetch = (name) => {
    if (taken.has(name) || pending.has(name)) return;
    const bytes = new Promise((resolve, reject) => {
      waiting.set(name, { resolve, reject });
      post({ name });
    });
    bytes.catch(() => {});
    pending.set(name, bytes);
  };
  const FILE_NAME = /^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$/;
  const file = (name) => {
    if (taken.has(name)) return Promise.reject(new Error(`${name} was handed over already`));
    prefetch(name);
    const bytes = pending.get(name);
    pending.delete(name);
    taken.add(name);
    return bytes;
  };
  // The big files Pyodide fetches once its modules run are asked for now, so
  // the shell hands them over while the modules load (requests on the port
  // are answered concurrently; the port is open before the shell's
  // handshake ends, and its messages wait in the port until then).
  for (const name of ["pyodide.mjs", "pyodide.asm.mjs", lockName, "pyodide.asm.wasm", "python_stdlib.zip"]) {
    prefetch(name);
  }
  const TYPES = { wasm: "application/wasm", mjs: "text/javascript", json: "application/json" };
  const typeOf = (name) => TYPES[name.slice(name.lastIndexOf(".") + 1)] || "application/octet-stream";
  // Pyodide's fetches of its files (the wasm, the standard library, the
  // wheels, micropip's index) are answered here; everything else is the
  // real fetch, under the frame's CSP.
  win.fetch = function fetch(input, init) {
    let url = "";
    try {
      url = input && typeof input === "object" && typeof input.url === "string" ? input.url : String(input);
    } catch {
      url = "";
    }
    if (!url.startsWith(base)) return realFetch(input, init);
    const name = url.slice(base.length).split(/[?#]/)[0];
    // Only names shaped like the manifest's reach the shell (python-files.js
    // bounds its side too): anything else is a 404 here.
    if (!FILE_NAME.test(name)) return Promise.resolve(new ResponseCtor(null, { status: 404, statusText: "Not Found" }));
    return file(name).then(
      (bytes) => new ResponseCtor(bytes, { status: 200, headers: { "Content-Type": typeOf(name) } }),
      () => new ResponseCtor(null, { status: 404, statusText: "Not Found" }),
    );
  };

  const status = (value) => {
    if (doc.documentElement) doc.documentElement.setAttribute("data-napplet-python", value);
    try {
      win.performance.mark(`napplet-python:${value}`);
    } catch {
      // Marks are for developers only.
    }
  };
  const showError = (text, after) => {
    const pre = doc.createElement("pre");
    pre.className = "napplet-python-error";
    pre.setAttribute("role", "alert");
    pre.textContent = text;
    if (after && after.parentNode && doc.body && doc.body.contains(after)) after.after(pre);
    else (doc.body || doc.documentElement).appendChild(pre);
  };
  let blockedBlob = false;
  win.addEventListener("securitypolicyviolation", (event) => {
    if (String(event.blockedURI).startsWith("blob")) blockedBlob = true;
  });
  const importFile = async (name) => {
    const url = createUrl(new BlobCtor([await file(name)], { type: "text/javascript" }));
    try {
      return await import(url);
    } finally {
      revokeUrl(url);
    }
  };
  const canonical = (name) => String(name).toLowerCase().replace(/[-_.]+/g, "-");
  const dedent = (text) => {
    const lines = text.replace(/\r\n?/g, "\n").split("\n");
    let indent = null;
    for (const line of lines) {
      if (!line.trim()) continue;
      const lead = /^[ \t]*/.exec(line)[0];
      if (indent === null || !lead.startsWith(indent)) {
        let i = 0;
        while (indent !== null && i < indent.length && lead[i] === indent[i]) i += 1;
        indent = indent === null ? lead : indent.slice(0, i);
      }
    }
    return indent ? lines.map((line) => line.slice(indent.length)).join("\n") : lines.join("\n");
  };
  const domReady = () => new Promise((resolve) => {
    if (doc.readyState !== "loading") resolve();
    else doc.addEventListener("DOMContentLoaded", () => resolve(), { once: true });
  });
  // micropip resolves only from the shell's lock: anything else is refused by name.
  const PIN_PY = `
def _napllm_pin(pinned, index):
    import re
    import micropip
    original = micropip.install
    pinned = frozenset(pinned)
    def name_of(requirement):
        match = re.fullmatch(r"\\s*([A-Za-z0-9][A-Za-z0-9._-]*)\\s*(\\[[^\\]]*\\])?\\s*([<>=!~;].*)?", str(requirement))
        return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else None
    async def install(requirements, *args, **kwargs):
        """micropip.install for a napplet: only the packages this shell pinned."""
        for requirement in [requirements] if isinstance(requirements, str) else list(requirements):
            if name_of(requirement) not in pinned:
                raise ValueError(
                    f"package {str(requirement)!r} is not pinned by this shell; a napplet can install "
                    f"only: {', '.join(sorted(pinned))}")
        kwargs.pop("index_urls", None)
        return await original(requirements, *args, **kwargs)
    micropip.install = install
    micropip.set_index_urls([index])
`;

  const main = async () => {
    status("loading");
    let pyodide;
    let sources = [];
    try {
      const [loader, asm, lockBytes] = await Promise.all([
        importFile("pyodide.mjs"),
        importFile("pyodide.asm.mjs"),
        file(lockName),
      ]);
      status("booting");
      const lockText = new TextDecoder().decode(lockBytes);
      const pinned = Object.keys(JSON.parse(lockText).packages);
      const unknown = packages.filter((name) => !pinned.includes(canonical(name)));
      if (unknown.length > 0) {
        throw new Error(
          `napplet-python: ${unknown.map((n) => JSON.stringify(n)).join(", ")} ` +
          `${unknown.length === 1 ? "is" : "are"} not pinned by this shell; a napplet can load only: ${pinned.join(", ")}.`,
        );
      }
      pyodide = await loader.loadPyodide({
        indexURL: base,
        packageBaseUrl: base,
        lockFileContents: lockText,
        createPyodideModule: asm.default,
        packages: packages.map(canonical),
      });
      // Only what the scripts import (the lock's `imports` names, e.g.
      // `napllm`, `pydantic`, `micropip`) is loaded, with its dependencies:
      // a script that imports nothing pinned loads no wheel at all.
      await domReady();
      sources = Array.from(doc.querySelectorAll('script[type="py"]'), (script) => [script, dedent(script.textContent || "")]);
      for (const [, text] of sources) {
        try {
          await pyodide.loadPackagesFromImports(text);
        } catch {
          // A script that does not parse fails, with its traceback, when it runs.
        }
      }
      if (pyodide.loadedPackages.micropip) {
        pyodide.runPython(PIN_PY);
        pyodide.globals.get("_napllm_pin")(pyodide.toPy(pinned), base + "simple/");
        pyodide.runPython("del _napllm_pin");
      }
    } catch (err) {
      const why = blockedBlob
        ? "this page's Content-Security-Policy blocks blob: scripts (script-src), which Python napplets need"
        : String(err && err.message ? err.message : err);
      console.error("napllm: Python could not start", err);
      await domReady();
      showError(`Python could not start: ${why}`, null);
      status("error");
      return;
    }
    status("running");
    let failed = false;
    for (let i = 0; i < sources.length; i += 1) {
      const [script, text] = sources[i];
      try {
        await pyodide.runPythonAsync(text, { filename: `<script type="py"> #${i + 1}` });
      } catch (err) {
        failed = true;
        console.error(err);
        showError(String(err && err.message ? err.message : err), script);
      }
    }
    status(failed ? "error" : "ready");
  };

  win.parent.postMessage({ type: "napllm.pythonStart", secret }, "*", [channel.port2]);
  main();
}

/**
 * The loader as inline script text.
 *
 * @param {string} secret the frame's Python secret (hex digits only).
 * @param {string[]} packages the napplet's package names (`pythonMode`).
 * @returns {string} JavaScript source (contains no "</script" and no "<!--").
 */
export function pythonLoaderSource(secret, packages) {
  const args = [String(secret), packages.map(String), PYTHON_BASE, PYTHON_LOCK];
  // `<` is escaped in the JSON so no napplet text can end the script early.
  const json = JSON.stringify(args).replace(/</g, "\\u003c");
  const text = "(" + installPythonLoader.toString() + ").apply(null, " + json + ");";
  return text.replace(/<\/(script)/gi, "<\\/$1").replace(/<!--/g, "<\\!--");
}
