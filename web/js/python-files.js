/**
 * The files of Python napplets, on the shell's side (docs/design.md,
 * "Python napplets"; docs/security.md, "Python napplets"): the shell hands a
 * Python napplet's frame Pyodide and the pinned wheels over a private
 * channel, so the frame itself never fetches anything.
 *
 * Rules
 * - Only files named in the build's manifest (`MANIFEST_PATH`, written by
 *   tools/buildsys/pyodide.py) are handed over, plus the manifest's lock
 *   (our wheels only) under `PYTHON_LOCK`. Each file is fetched once from
 *   the shell's own origin (so the service worker's precache serves it
 *   offline), its sha256 checked against the manifest, and kept once in
 *   memory for every frame; a failed fetch or a wrong hash is not kept.
 * - A channel starts only with `{type: "napllm.pythonStart", secret}` and
 *   one port, posted by the frame's own window with the secret the shell
 *   wrote into that frame's loader, and after the prelude bound the
 *   frame's current document: one channel per document.
 * - On a channel: `{name}` is answered `{name, bytes}` (a copy) or
 *   `{name, error}`; each name is answered once. Every message counts, the
 *   dropped ones too: after `MAX_REQUESTS` the channel is closed. A name
 *   that is not a string of at most `MAX_NAME_CHARS` is dropped: never
 *   kept, never echoed. The port is no secret (napplet code can reach it,
 *   for instance through the loader's fetch shim or a getter on
 *   `MessageEvent.prototype`); these bounds are what keep it cheap.
 */

import { PYTHON_LOCK } from "./python-loader.js";
import { sha256Hex } from "./napplet-page.js";

/** The message a Python napplet's loader starts its channel with. */
export const PYTHON_START = "napllm.pythonStart";
/** The build's manifest of what a Python napplet may be handed, relative to the shell. */
export const MANIFEST_PATH = "pyodide/napplet-files.json";
/** Requests one channel may make before it is closed (the manifest has far fewer files). */
export const MAX_REQUESTS = 64;
/** Longest file name a channel answers, in UTF-16 code units (the manifest's are far shorter). */
export const MAX_NAME_CHARS = 128;

export class PythonFiles {
  /** @param {string} [shellUrl] the shell page's URL (files are relative to it). */
  constructor(shellUrl = location.href) {
    this.manifestUrl = new URL(MANIFEST_PATH, shellUrl);
    this.manifest = null;
    // file name -> Promise<ArrayBuffer> (verified).
    this.files = new Map();
  }

  /** The manifest `{files: {name: sha256}, lock}`, fetched once (again after a failure). */
  loadManifest() {
    if (!this.manifest) {
      this.manifest = fetch(this.manifestUrl).then(async (response) => {
        if (!response.ok) throw new Error(`HTTP ${response.status}`);
        const manifest = await response.json();
        if (!manifest || typeof manifest.files !== "object" || typeof manifest.lock !== "object") {
          throw new Error("malformed manifest");
        }
        return manifest;
      });
      this.manifest.catch(() => {
        this.manifest = null;
      });
    }
    return this.manifest;
  }

  /**
   * The verified bytes of `name`, shared by every frame (do not transfer them).
   *
   * @param {string} name a file name of the manifest, or `PYTHON_LOCK`.
   * @returns {Promise<ArrayBuffer>}
   * @throws {Error} when the name is not in the manifest, the fetch fails or the hash differs.
   */
  async bytes(name) {
    const manifest = await this.loadManifest();
    if (name === PYTHON_LOCK) return new TextEncoder().encode(JSON.stringify(manifest.lock)).buffer;
    if (!Object.hasOwn(manifest.files, name)) throw new Error("not a file the shell hands to napplets");
    let found = this.files.get(name);
    if (!found) {
      found = this.fetchVerified(name, String(manifest.files[name]));
      this.files.set(name, found);
      found.catch(() => this.files.delete(name));
    }
    return found;
  }

  async fetchVerified(name, sha256) {
    const response = await fetch(new URL(name, this.manifestUrl));
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const bytes = await response.arrayBuffer();
    if ((await sha256Hex(bytes)) !== sha256) throw new Error("its sha256 differs from the build's");
    return bytes;
  }

  /**
   * A message with one port from `frame`'s window: a Python loader's start.
   * Serves the port when the secret is the frame's and its current document
   * has no channel yet; drops it otherwise.
   *
   * @param {object} frame the FrameBinding (`pythonSecret`, `doc`).
   * @param {MessageEvent} event
   */
  start(frame, event) {
    const doc = frame.doc;
    if (!frame.pythonSecret || !doc || !doc.live || doc.pythonPort) return;
    const data = event.data;
    if (!data || typeof data !== "object" || data.type !== PYTHON_START || data.secret !== frame.pythonSecret) return;
    doc.pythonPort = event.ports[0];
    this.serve(doc.pythonPort);
  }

  /** Answer file requests on `port` (see the header). */
  serve(port) {
    const answered = new Set();
    let requests = 0;
    port.onmessage = async (event) => {
      requests += 1;
      if (requests > MAX_REQUESTS) {
        port.onmessage = null;
        port.close();
        return;
      }
      const data = event.data;
      const name = data && typeof data === "object" ? data.name : undefined;
      if (typeof name !== "string" || name.length > MAX_NAME_CHARS || answered.has(name)) return;
      answered.add(name);
      try {
        port.postMessage({ name, bytes: await this.bytes(name) });
      } catch (err) {
        port.postMessage({ name, error: String(err && err.message ? err.message : err).slice(0, 200) });
      }
    };
  }
}
