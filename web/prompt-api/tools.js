/**
 * The tools of a session: the `tools` option of `create()` as NAP-LLM tool
 * definitions, and the napplet's `execute` functions run for a model's
 * tool calls (NAP-LLM, Tool; toolCall; toolResult).
 *
 * Rules
 * - Tool names follow NAP-LLM (1-64 letters, digits, `_`, `-`), unique in
 *   a session; every tool has an `execute` function (open-loop tool use is
 *   `NotSupportedError`) and an object `inputSchema` compiled under the
 *   schema bounds (schema.js).
 * - A model's call is run only with arguments valid against its tool's
 *   schema; an unknown tool or invalid arguments answer the model with an
 *   `isError` toolResult, never reach `execute`.
 * - A tool that throws ends the prompt with its own error (the napplet's
 *   code failed); a result is sent as text (a string as it is, anything
 *   else as JSON).
 */

import { abortedError } from "./errors.js";
import { compileSchema } from "./schema.js";

/** The names of the tool functions a model may call (NAP-LLM, Tool). */
const TOOL_NAME = /^[A-Za-z0-9_-]{1,64}$/;

/** Turns a tool list of `create()` into NAP-LLM tools plus the functions to run. */
export function toolsOf(tools) {
  if (tools === undefined) return { request: [], byName: new Map() };
  if (!Array.isArray(tools)) throw new TypeError("tools must be an array.");
  const request = [];
  const byName = new Map();
  for (const tool of tools) {
    if (typeof tool !== "object" || tool === null) throw new TypeError("A tool must be an object.");
    if (typeof tool.name !== "string" || !TOOL_NAME.test(tool.name)) {
      throw new TypeError("A tool name must be 1-64 letters, digits, '_' or '-'.");
    }
    if (byName.has(tool.name)) throw new TypeError(`Two tools are named ${tool.name}.`);
    if (typeof tool.execute !== "function") {
      throw new DOMException(
        `Tool ${tool.name} has no execute function; open-loop tool use is not offered by this layer.`,
        "NotSupportedError",
      );
    }
    const schema = tool.inputSchema === undefined ? { type: "object", properties: {} } : tool.inputSchema;
    const compiled = compileSchema(schema, `The inputSchema of tool ${tool.name}`);
    if (compiled.schema.type !== "object") throw new TypeError(`The inputSchema of tool ${tool.name} must have type "object".`);
    const entry = { name: tool.name, parameters: compiled.schema };
    if (typeof tool.description === "string") entry.description = tool.description;
    request.push(entry);
    byName.set(tool.name, { execute: tool.execute, compiled });
  }
  return { request, byName };
}

/**
 * Run each call's `execute` (concurrently).
 *
 * @param {{byName: Map<string, {execute: Function, compiled: object}>}} tools from `toolsOf`.
 * @param {object[]} calls the answer's NAP-LLM toolCall parts.
 * @param {{stopped: boolean}} op the operation the calls belong to (queue.js).
 * @returns {Promise<object[]>} NAP-LLM toolResult messages, one per call, in order.
 * @throws whatever a tool's `execute` throws; `AbortError` when the
 *   operation stopped while a tool ran.
 */
export async function runTools(tools, calls, op) {
  return Promise.all(calls.map(async (call) => {
    const tool = tools.byName.get(call.name);
    const base = { role: "toolResult", toolCallId: call.toolCallId, toolName: call.name };
    if (!tool) {
      return { ...base, isError: true, content: [{ type: "text", text: `There is no tool named ${call.name}.` }] };
    }
    let check;
    try {
      check = tool.compiled.validator.validate(call.arguments);
    } catch {
      check = { valid: false, errors: [] };
    }
    if (!check.valid) {
      return { ...base, isError: true, content: [{ type: "text", text: "The arguments do not match the tool's inputSchema." }] };
    }
    // A tool that throws ends the prompt with its own error (the napplet's code failed).
    const value = await tool.execute(call.arguments);
    if (op.stopped) throw abortedError();
    const text = typeof value === "string" ? value : JSON.stringify(value === undefined ? null : value);
    return { ...base, content: [{ type: "text", text: typeof text === "string" ? text : "null" }] };
  }));
}
