/**
 * The Prompt API layer's errors and abort signals.
 *
 * Rules
 * - Errors are `DOMException`s with the Prompt API's names (`ERROR_NAMES`);
 *   input the layer refuses is a `TypeError` (as the Prompt API's IDL
 *   conversion would be).
 * - A NAP-LLM `LlmError` keeps its message and names its code in it
 *   (`toDomException`); anything else becomes `UnknownError`.
 * - An aborted signal rejects with the signal's own reason, whatever it is
 *   (`abortReason`); only a missing reason becomes an `AbortError`.
 */

/** NAP-LLM error code -> the `DOMException` name the Prompt API uses for that failure. */
export const ERROR_NAMES = Object.freeze({
  "user-cancelled": "NotAllowedError",
  cancelled: "AbortError",
  timeout: "TimeoutError",
  "quota-exceeded": "QuotaExceededError",
  unsupported: "NotSupportedError",
  "selection-expired": "InvalidStateError",
  "invalid-request": "DataError",
  "provider-error": "OperationError",
  "invalid-response": "OperationError",
});

/** A DOMException for an NAP-LLM `LlmError` (or anything thrown by the binding). */
export function toDomException(err) {
  if (err instanceof DOMException) return err;
  const code = err && typeof err.code === "string" ? err.code : "";
  const name = ERROR_NAMES[code] || "UnknownError";
  const message = err && typeof err.message === "string" ? err.message : "The request failed.";
  const exception = new DOMException(code ? `${message} (NAP-LLM: ${code})` : message, name);
  return exception;
}

/** The `AbortError` of an operation stopped by `destroy()` or its signal. */
export const abortedError = () => new DOMException("The operation was aborted.", "AbortError");

/** What an aborted `signal` rejects with: its own reason, else an `AbortError`. */
export const abortReason = (signal) => (signal.reason !== undefined ? signal.reason : abortedError());

/**
 * The `signal` option as an AbortSignal, or null when none was given.
 *
 * @throws {TypeError} a value that is not an AbortSignal.
 */
export function checkSignal(signal) {
  if (signal === undefined || signal === null) return null;
  if (typeof signal !== "object" || typeof signal.aborted !== "boolean" || typeof signal.addEventListener !== "function") {
    throw new TypeError("signal must be an AbortSignal.");
  }
  return signal;
}
