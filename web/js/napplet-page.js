/**
 * A napplet's page as the shell loads it (NIP-5D web projection; NAP-LLM,
 * Shell Behavior; docs/design.md, "Napplet identity"): the frame's srcdoc,
 * its Content Security Policy, the Prompt API opt-in, the name a napplet is
 * shown under, the identity hash and the URLs napplets come from. Pure
 * functions of their arguments (no DOM is touched on import), used by the
 * napplet area (frames.js).
 *
 * Rules
 * - The srcdoc is: `<!doctype html>` (standards mode), the CSP `<meta>`
 *   first, then the prelude `<script>` (and the Prompt API layer's, see
 *   below), then the napplet's text (UTF-8).
 * - A napplet whose page has `<meta name="napplet-prompt-api">` (read with
 *   DOMParser, `promptApiMode`) gets one more inline script right after the
 *   prelude: the Prompt API layer (web/prompt-api/, bundled by build.py
 *   into js/prompt-api-source.js), which removes its own element and defines
 *   `LanguageModel` over `window.napplet.llm`. Without the element the srcdoc
 *   is exactly as before.
 * - A napplet whose page has `<meta name="napplet-python" content="pkg ...">`
 *   (`pythonMode`) gets the Python loader (web/js/python-loader.js) right
 *   after the prelude, with its own secret, and the policy
 *   `NAPPLET_PYTHON_CSP`: the napplet policy with `blob:` added to
 *   `script-src` (the loader imports Pyodide's modules from blob: URLs it
 *   made itself; docs/security.md, "Python napplets"). Nothing else changes.
 * - A napplet's identity is its name plus the hex sha256 of exactly the
 *   bytes loaded (`sha256Hex`); names are sanitised (`sanitiseName`).
 */

import { preludeSource } from "../prelude.js";
import { PROMPT_API_SOURCE } from "./prompt-api-source.js";
import { pythonLoaderSource } from "./python-loader.js";

/** The napplet frame's Content Security Policy (NIP-5D CSP baseline). */
export const NAPPLET_CSP = [
  "default-src 'none'",
  "script-src 'unsafe-inline' 'wasm-unsafe-eval'",
  "style-src 'unsafe-inline'",
  "img-src data: blob:",
  "font-src data:",
  "connect-src 'none'",
  "worker-src 'none'",
  "child-src 'none'",
  "frame-src 'none'",
  "media-src 'none'",
  "object-src 'none'",
  "manifest-src 'none'",
  "base-uri 'none'",
  "form-action 'none'",
].join("; ");

/** The policy of a Python napplet's frame: `NAPPLET_CSP` with `blob:` scripts. */
export const NAPPLET_PYTHON_CSP = NAPPLET_CSP.replace(
  "script-src 'unsafe-inline' 'wasm-unsafe-eval'",
  "script-src 'unsafe-inline' 'wasm-unsafe-eval' blob:",
);

/** The `<meta name>` by which a napplet asks for Python (docs/napplets.md). */
export const PYTHON_META = "napplet-python";
/** Most package names a `napplet-python` meta may name, and the longest name kept. */
export const MAX_PYTHON_PACKAGES = 32;
const MAX_PACKAGE_NAME = 100;

/**
 * Whether a napplet's page opts in to Python: the package names of its
 * first `<meta name="napplet-python">` (its `content` split on whitespace
 * and commas; [] when empty), or null without such an element. Read with
 * DOMParser like `promptApiMode`. At most `MAX_PYTHON_PACKAGES` names are
 * kept, each cut to 100 characters; the loader refuses, by name, any the
 * shell did not pin.
 *
 * @param {string} text the napplet's HTML.
 * @returns {string[] | null}
 */
export function pythonMode(text) {
  const doc = new DOMParser().parseFromString(text, "text/html");
  const meta = doc.querySelector(`meta[name="${PYTHON_META}" i]`);
  if (!meta) return null;
  const names = (meta.getAttribute("content") || "").split(/[\s,]+/).filter((n) => n.length > 0);
  return names.slice(0, MAX_PYTHON_PACKAGES).map((n) => n.slice(0, MAX_PACKAGE_NAME));
}

/** Longest napplet name shown, in code points. */
export const MAX_NAME_LENGTH = 40;

/** The `<meta name>` by which a napplet asks for the Prompt API layer (docs/napplets.md). */
export const PROMPT_API_META = "napplet-prompt-api";

/**
 * Whether a napplet's page opts in to the Prompt API layer, and how: the
 * `content` of its first `<meta name="napplet-prompt-api">` ("" when it has
 * none), or null when there is no such element. Read with the page's own
 * HTML parser (DOMParser: no script runs, nothing loads), so a comment or a
 * string that merely contains the text does not count.
 *
 * @param {string} text the napplet's HTML.
 * @returns {string | null}
 */
export function promptApiMode(text) {
  const doc = new DOMParser().parseFromString(text, "text/html");
  const meta = doc.querySelector(`meta[name="${PROMPT_API_META}" i]`);
  return meta ? (meta.getAttribute("content") || "").trim() : null;
}

/**
 * The Prompt API layer (web/prompt-api/, bundled by build.py) as inline
 * script text: it removes its own element, then installs `LanguageModel`
 * per `mode`.
 *
 * @param {string} mode the opt-in's content (see `promptApiMode`).
 * @returns {string}
 */
export function promptApiScript(mode) {
  // Only the known token reaches the script text: the napplet's `content`
  // could otherwise end the inline script early ("</script>").
  const known = mode === "NappletLanguageModel" ? mode : "";
  return (
    "(() => { const own = document.currentScript; if (own) own.remove();\n" +
    PROMPT_API_SOURCE +
    "\nnapllmPromptApi.installPromptApi(window, " + JSON.stringify(known) + "); })();"
  );
}

/**
 * The srcdoc for a napplet document.
 *
 * @param {string} text the napplet's HTML, decoded as UTF-8.
 * @param {boolean} llm whether the llm domain is granted.
 * @param {string} secret the frame's secret (`newSecret()`).
 * @param {string | null} [promptApi] the napplet's Prompt API opt-in
 *   (`promptApiMode`); null or omitted: no layer.
 * @param {{secret: string, packages: string[]} | null} [python] the Python
 *   loader's secret (`newSecret()`) and the napplet's packages
 *   (`pythonMode`); null or omitted: no loader.
 * @param {string} [shellOrigin] the origin the prelude gives the shell's
 *   envelopes (web/prelude.js); this page's origin unless given.
 * @returns {string}
 */
export function buildSrcdoc(text, llm, secret, promptApi = null, python = null, shellOrigin = globalThis.location?.origin ?? "null") {
  return (
    "<!doctype html>" +
    `<meta http-equiv="Content-Security-Policy" content="${python ? NAPPLET_PYTHON_CSP : NAPPLET_CSP}">` +
    `<script>${preludeSource(llm ? ["llm"] : [], secret, shellOrigin)}</script>` +
    (python ? `<script>${pythonLoaderSource(python.secret, python.packages)}</script>` : "") +
    (promptApi === null ? "" : `<script>${promptApiScript(promptApi)}</script>`) +
    text
  );
}

/** 128 random bits as 32 hex digits: a frame's secret. */
export function newSecret() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// Bidi controls, other format characters, controls, separators and
// private-use code points never appear in a shown name.
const HIDDEN_CHARS = /[\p{Cc}\p{Cf}\p{Co}\p{Cs}\p{Zl}\p{Zp}\u034f\u115f\u1160\u3164\uffa0]/gu;
// Words that would make a napplet look like part of the shell.
const TRUST_WORDS = /\b(?:built[\s_-]*in|builtin|official|verified|trusted|system|napllm|shell)\b/giu;

/**
 * The name a napplet is shown under: NFKC-normalised, without invisible or
 * direction-changing characters, brackets, "#" or words claiming the shell's
 * trust ("built-in", "official"...), whitespace collapsed, at most
 * `MAX_NAME_LENGTH` code points; "napplet" when nothing is left.
 *
 * @param {unknown} raw
 * @returns {string}
 */
export function sanitiseName(raw) {
  let name = typeof raw === "string" ? raw : "";
  name = name.slice(0, 4 * MAX_NAME_LENGTH).normalize("NFKC");
  name = name.replace(HIDDEN_CHARS, "").replace(/[()[\]{}<>#·|"“”]/gu, " ");
  for (let i = 0; i < 3; i += 1) name = name.replace(TRUST_WORDS, " ");
  name = name.replace(/\s+/gu, " ").trim();
  const points = Array.from(name);
  if (points.length > MAX_NAME_LENGTH) name = points.slice(0, MAX_NAME_LENGTH - 1).join("").trimEnd() + "…";
  return name || "napplet";
}

/** Hex sha256 of `bytes` (an ArrayBuffer). */
export async function sha256Hex(bytes) {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * The napplet name for a URL opened directly: its last path segment
 * (the folder name when the file is an index page).
 */
export function nameFromUrl(url) {
  const segments = new URL(url).pathname.split("/").filter((s) => s.length > 0).map((s) => {
    try {
      return decodeURIComponent(s);
    } catch {
      return s;
    }
  });
  if (segments.length === 0) return sanitiseName(new URL(url).host);
  const last = segments[segments.length - 1];
  if (/^index\.html?$/i.test(last) && segments.length > 1) return sanitiseName(segments[segments.length - 2]);
  return sanitiseName(last);
}

/** The origin a napplet URL is shown with ("http://127.0.0.1:8000"). */
export function originOf(url) {
  try {
    return new URL(url).origin;
  } catch {
    return "";
  }
}

/** Whether `url` (absolute) uses http or https. */
export function isHttpUrl(url) {
  try {
    const { protocol } = new URL(url);
    return protocol === "http:" || protocol === "https:";
  } catch {
    return false;
  }
}


/**
 * The Content-Security-Policy this page runs under: its response header (read
 * back from the page's own URL) and any `<meta>` policy, joined by " , ";
 * "" when none is found.
 *
 * @returns {Promise<string>}
 */
export async function pageCsp() {
  const found = [];
  try {
    const response = await fetch(location.href, { method: "HEAD", cache: "no-store" });
    const header = response.headers.get("content-security-policy");
    if (header) found.push(header);
  } catch {
    // Offline: the meta policy (if any) is still reported.
  }
  for (const meta of document.querySelectorAll("meta[http-equiv]")) {
    if (meta.httpEquiv.toLowerCase() === "content-security-policy" && meta.content) found.push(meta.content);
  }
  return found.join(" , ").slice(0, 600);
}
