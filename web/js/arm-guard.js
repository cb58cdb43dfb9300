/**
 * Deliberate activation of a dialog's granting controls: a napplet can open
 * a dialog under the person's pointer, so a click already on its way must
 * not grant anything.
 *
 * Rules
 * - The granting controls (Allow, the "remember" box, the chooser's
 *   candidates) are disabled for `ARM_DELAY_MS` after the dialog appears
 *   (class `arming` on the dialog and the controls, a visible fill; the
 *   dialog's `data-armed` is "true" once armed).
 * - Afterwards a click counts only if it is trusted, single (`detail < 2`),
 *   and, for a pointer click, its pointer-down started on that control after
 *   it was enabled (`ArmGuard.deliberate`); keyboard activation
 *   (`detail` 0) counts.
 * - Controls that only take access away (Deny, Cancel, Close, Refuse) are
 *   never guarded: they act at once.
 */

/** Milliseconds Allow, "remember" and the candidates stay disabled after a dialog appears. */
export const ARM_DELAY_MS = 500;

/**
 * Guards a dialog's granting controls (see the module docstring).
 * `deliberate(event, control)` says whether a click on `control` counts.
 */
export class ArmGuard {
  /**
   * @param {HTMLDialogElement} dialog the dialog the controls are in.
   * @param {HTMLElement[]} controls its granting controls (disabled until armed).
   */
  constructor(dialog, controls) {
    this.controls = controls;
    this.armed = false;
    this.pressed = null;
    for (const control of controls) {
      control.disabled = true;
      control.classList.add("arming");
    }
    dialog.classList.add("arming");
    dialog.style.setProperty("--arm-delay", `${ARM_DELAY_MS}ms`);
    // Capture phase: before the control's own listeners.
    dialog.addEventListener(
      "pointerdown",
      (event) => {
        this.pressed = this.armed ? this.controlOf(event.target) : null;
      },
      true,
    );
    this.timer = setTimeout(() => {
      this.armed = true;
      dialog.classList.remove("arming");
      dialog.dataset.armed = "true";
      for (const control of controls) {
        control.disabled = false;
        control.classList.remove("arming");
      }
    }, ARM_DELAY_MS);
  }

  controlOf(target) {
    let node = target instanceof Element ? target : null;
    if (node && node.closest("label") && node.closest("label").control) node = node.closest("label").control;
    return this.controls.find((control) => control === node || control.contains(node)) ?? null;
  }

  /** A click on `control` counts only if armed, single, and pressed on it after arming. */
  deliberate(event, control) {
    if (!this.armed || !event.isTrusted) return false;
    if (event.detail >= 2) return false;
    // detail 0: keyboard activation (Space/Enter on the focused control).
    if (event.detail === 1 && this.pressed !== control) return false;
    return true;
  }

  /** Stop the arming timer (the dialog is gone or its controls were replaced). */
  stop() {
    clearTimeout(this.timer);
  }
}
