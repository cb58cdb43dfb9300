/**
 * The account (profile) switcher (docs/design.md, "Account").
 *
 * Rules
 * - Profiles are names kept in localStorage; "Default" always exists and
 *   cannot be removed. A name is 1 to 40 characters, unique.
 * - Switching calls `runtime.switchAccount(name)`; the runtime cancels the
 *   old account's pending work and invalidates its handles. The current
 *   profile is remembered and re-applied when the runtime attaches.
 * - When localStorage is unavailable the profiles live for the page only.
 */

import { byIds } from "./dom.js";
import { parseJsonOr } from "./json.js";

export const DEFAULT_PROFILE = "Default";
const PROFILES_KEY = "napllm.profiles";
const CURRENT_KEY = "napllm.currentProfile";
const MAX_NAME = 40;

function readStorage(key) {
  try {
    return localStorage.getItem(key);
  } catch {
    return null;
  }
}

function writeStorage(key, value) {
  try {
    localStorage.setItem(key, value);
  } catch {
    // Storage disabled: keep the in-memory state only.
  }
}

/** Check a new profile name; returns an error sentence or null. */
export function profileNameProblem(name, existing) {
  if (name.length === 0) return "Enter a name.";
  if (name.length > MAX_NAME) return `Use at most ${MAX_NAME} characters.`;
  if (existing.includes(name)) return "A profile with this name exists.";
  return null;
}

export class AccountSwitcher {
  /**
   * @param {HTMLElement} root the account section (ids in index.html).
   * @param {() => object|null} runtime the attached runtime API or null.
   */
  constructor(root, runtime) {
    this.root = root;
    this.runtime = runtime;
    Object.assign(this, byIds(root, {
      select: "account-select", addForm: "account-add-form", addInput: "account-new-name",
      addError: "account-add-error", addToggle: "account-add", removeButton: "account-remove",
    }));
    this.profiles = this.load();
    const stored = readStorage(CURRENT_KEY);
    this.current = stored && this.profiles.includes(stored) ? stored : DEFAULT_PROFILE;
    this.render();
    this.select.addEventListener("change", () => this.switchTo(this.select.value));
    this.addToggle.addEventListener("click", () => {
      this.addForm.hidden = !this.addForm.hidden;
      this.addToggle.setAttribute("aria-expanded", String(!this.addForm.hidden));
      if (!this.addForm.hidden) this.addInput.focus();
    });
    this.addForm.addEventListener("submit", (event) => {
      event.preventDefault();
      this.add(this.addInput.value.trim());
    });
    this.addForm.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault();
        this.hideAddForm();
      }
    });
    this.removeButton.addEventListener("click", () => this.removeCurrent());
  }

  load() {
    const names = parseJsonOr(readStorage(PROFILES_KEY) ?? "[]", [], Array.isArray).filter(
      (n) => typeof n === "string" && n.length > 0 && n.length <= MAX_NAME,
    );
    const unique = [DEFAULT_PROFILE, ...names.filter((n) => n !== DEFAULT_PROFILE)];
    return [...new Set(unique)];
  }

  save() {
    writeStorage(PROFILES_KEY, JSON.stringify(this.profiles));
    writeStorage(CURRENT_KEY, this.current);
  }

  render() {
    this.select.replaceChildren(...this.profiles.map((name) => new Option(name, name)));
    this.select.value = this.current;
    this.removeButton.disabled = this.current === DEFAULT_PROFILE;
  }

  hideAddForm() {
    this.addForm.reset();
    this.addError.textContent = "";
    this.addForm.hidden = true;
    this.addToggle.setAttribute("aria-expanded", "false");
    this.addToggle.focus();
  }

  add(name) {
    const problem = profileNameProblem(name, this.profiles);
    if (problem) {
      this.addError.textContent = problem;
      this.addInput.focus();
      return;
    }
    this.profiles.push(name);
    this.hideAddForm();
    this.switchTo(name);
  }

  removeCurrent() {
    const name = this.current;
    if (name === DEFAULT_PROFILE) return;
    this.switchTo(DEFAULT_PROFILE);
    this.profiles = this.profiles.filter((n) => n !== name);
    this.save();
    this.render();
    // "Remove profile" is now disabled (Default is current): the focus would
    // fall to <body>; the profile switcher takes it.
    this.select.focus();
  }

  /** Make `name` the current profile and tell the runtime. */
  switchTo(name) {
    if (!this.profiles.includes(name)) return;
    const changed = name !== this.current;
    this.current = name;
    this.save();
    this.render();
    if (changed) this.apply();
  }

  /** Tell the runtime the current profile (also called once it attaches). */
  apply() {
    const runtime = this.runtime();
    if (!runtime) return;
    try {
      const result = runtime.switchAccount(this.current);
      if (result && typeof result.then === "function") result.then(undefined, () => console.error("napllm: switchAccount failed"));
    } catch {
      console.error("napllm: switchAccount failed");
    }
  }
}
