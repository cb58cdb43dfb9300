/**
 * The engines' declarations, as the build wrote them from their specs
 * (dist/engines/engines.json; napllm.providers.engine_specs
 * `page_declarations`): one object per engine, in the registry's order.
 *
 * Rules
 * - Read once per page and kept; a missing or malformed file reads as no
 *   engine (`[]`), so the page's lists are empty rather than wrong.
 * - Only plain data: every field is checked where it is used
 *   (`engineCaches`, `offlineModuleOf`, `inModelCache`, `leftoverModules`).
 * - Nothing here names an engine: the page's shared code (web/js/) loops
 *   over these declarations.
 */

let declared = null;

/** Every engine's declaration (`[{kind, worker?, offline?, caches?, weights?, ...}]`). Never rejects. */
export function engineDeclarations() {
  if (!declared) {
    declared = fetch(new URL("engines.json", import.meta.url))
      .then((response) => (response.ok ? response.json() : []))
      .then((value) => (Array.isArray(value) ? value.filter((d) => d && typeof d.kind === "string") : []))
      .catch(() => []);
  }
  return declared;
}

/** The declaration of engine `kind`, or null. Never rejects. */
export async function declarationOf(kind) {
  return (await engineDeclarations()).find((d) => d.kind === kind) || null;
}

/**
 * The engines' own Cache Storage names: `Map(name -> {label, entry, trim})`,
 * `entry` "file" when each file is a model of its own, `trim` a folder name
 * a model's files sit in below the model's folder ("" when none).
 */
export async function engineCaches() {
  const found = new Map();
  for (const d of await engineDeclarations()) {
    const caches = d.caches && typeof d.caches === "object" ? d.caches : {};
    for (const [name, cache] of Object.entries(caches)) {
      if (!cache || typeof cache.label !== "string") continue;
      found.set(name, { label: cache.label, entry: cache.entry === "file" ? "file" : "folder", trim: typeof cache.trim === "string" ? cache.trim : "" });
    }
  }
  return found;
}

/** Whether a file at `url` is a model the service worker keeps in its model cache (its engine's `weights`). */
export async function inModelCache(url) {
  let path;
  try {
    path = new URL(String(url)).pathname.toLowerCase();
  } catch {
    return false;
  }
  for (const d of await engineDeclarations()) {
    for (const rule of Array.isArray(d.weights) ? d.weights : []) {
      if (!rule || rule.modelCache !== true) continue;
      if (typeof rule.suffix === "string" && path.endsWith(rule.suffix.toLowerCase())) return true;
      if (typeof rule.pattern === "string") {
        try {
          if (new RegExp(rule.pattern, "i").test(path)) return true;
        } catch {
          // a malformed pattern names nothing
        }
      }
    }
  }
  return false;
}

/** The offline module (a path under engines/) engine `kind` declares, or null. Never rejects. */
export async function offlineModuleOf(kind) {
  const d = await declarationOf(kind);
  const path = d && typeof d.offline === "string" ? d.offline : null;
  return path && /^engines\/[A-Za-z0-9_.-]+\.js$/.test(path) ? path : null;
}

/** The `leftovers` modules (paths under engines/) the engines declare, in order. Never rejects. */
export async function leftoverModules() {
  return (await engineDeclarations())
    .map((d) => (typeof d.leftovers === "string" ? d.leftovers : null))
    .filter((path) => path && /^engines\/[A-Za-z0-9_.-]+\.js$/.test(path));
}
