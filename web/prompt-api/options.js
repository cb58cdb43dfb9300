/**
 * The options of `LanguageModel.create()` and `availability()` that ask
 * something of the connection (`expectedInputs`, `expectedOutputs`,
 * `tools`) or set sampling (`samplingMode`, `temperature`).
 *
 * Rules
 * - Requirements become the NAP-LLM `select` requirements the chooser
 *   filters by (`images`, `tools`); what NAP-LLM has no way to offer (audio
 *   input, non-text output) is `NotSupportedError`, an unknown type a
 *   `TypeError`.
 * - `samplingMode` names a temperature (`SAMPLING_TEMPERATURE`; "balanced"
 *   leaves the connection's default); a napplet gives it or `temperature`,
 *   not both.
 */

/** A `samplingMode` -> the temperature sent (undefined: the connection's default). */
export const SAMPLING_TEMPERATURE = Object.freeze({
  "most-predictable": 0,
  predictable: 0.2,
  "slightly-predictable": 0.4,
  balanced: undefined,
  "slightly-creative": 0.9,
  creative: 1.1,
  "most-creative": 1.3,
});

/**
 * The NAP-LLM `select` requirements of `create()`/`availability()` options.
 *
 * @param {object} options the options dictionary (not null).
 * @returns {{images?: true, tools?: true}}
 * @throws {TypeError} inputs or outputs not arrays, an unknown input type.
 * @throws {DOMException} `NotSupportedError` for audio input or non-text output.
 */
export function requirementsOf(options) {
  const requirements = {};
  const inputs = options.expectedInputs === undefined ? [] : options.expectedInputs;
  const outputs = options.expectedOutputs === undefined ? [] : options.expectedOutputs;
  if (!Array.isArray(inputs) || !Array.isArray(outputs)) throw new TypeError("expectedInputs and expectedOutputs must be arrays.");
  for (const expected of inputs) {
    const type = expected && expected.type;
    if (type === "image") requirements.images = true;
    else if (type === "audio") throw new DOMException("Audio input is not offered by NAP-LLM connections.", "NotSupportedError");
    else if (type !== "text" && type !== "tool-response" && type !== "tool-call") throw new TypeError("Unknown expected input type.");
  }
  for (const expected of outputs) {
    const type = expected && expected.type;
    if (type !== "text" && type !== "tool-call") throw new DOMException("Only text output is offered.", "NotSupportedError");
  }
  if (Array.isArray(options.tools) && options.tools.length > 0) requirements.tools = true;
  return requirements;
}

/**
 * The sampling a session sends.
 *
 * @param {object} options the options of `create()`.
 * @returns {{temperature: number | undefined, samplingMode: string | null}}
 * @throws {TypeError} an unknown `samplingMode`, or both it and `temperature`.
 * @throws {RangeError} a `temperature` that is not a number >= 0.
 */
export function samplingOf(options) {
  let temperature;
  let samplingMode = null;
  if (options.samplingMode !== undefined) {
    if (!(options.samplingMode in SAMPLING_TEMPERATURE)) throw new TypeError("Unknown samplingMode.");
    samplingMode = options.samplingMode;
    temperature = SAMPLING_TEMPERATURE[samplingMode];
    if (options.temperature !== undefined) throw new TypeError("Give samplingMode or temperature, not both.");
  } else if (options.temperature !== undefined) {
    if (typeof options.temperature !== "number" || !(options.temperature >= 0)) throw new RangeError("temperature must be a number >= 0.");
    temperature = options.temperature;
  }
  return { temperature, samplingMode };
}
