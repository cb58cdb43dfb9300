/**
 * What the consent dialog discloses about one request: the facts list of
 * the runtime's disclosure (NAP-LLM, Shell Behavior: authorization before
 * every submission).
 *
 * Rules
 * - Every value comes from the runtime's disclosure of the request and is
 *   inserted as text, never as markup; a missing or malformed value shows
 *   as zero, "none" or a neutral word, never as an error.
 * - The person sees what leaves the page: the route and model, how many
 *   messages, characters and images, the output format and limit, each
 *   tool definition with its parameters, each tool result by size (not its
 *   text), and whether the provider may charge.
 */

import { el, str } from "./dom.js";

const int = (value) => (Number.isInteger(value) && value >= 0 ? value : 0);

function plural(count, one, many) {
  return `${count} ${count === 1 ? one : many}`;
}

/**
 * The `<dl class="facts">` of a consent request.
 *
 * @param {object} data the consent request (`route`, `model`, `modelName`,
 *   `disclosed`, `charges`), as the runtime sent it.
 * @returns {HTMLDListElement}
 */
export function disclosureFacts(data) {
  const disclosed = data.disclosed && typeof data.disclosed === "object" ? data.disclosed : {};
  const facts = el("dl", { class: "facts" });
  const fact = (term, ...value) => facts.append(el("dt", {}, term), el("dd", {}, ...value));
  fact("Route", str(data.route));
  // The model by its name in words (napllm.kinds.model_display_name), its exact id as a detail.
  const modelId = str(data.model);
  const modelName = str(data.modelName) || modelId;
  fact(
    "Model",
    modelName,
    modelName !== modelId ? el("small", { class: "model-id" }, " (id ", el("code", {}, modelId), ")") : null,
  );
  const messages = int(disclosed.messages);
  const characters = int(disclosed.characters);
  fact("Messages", `${plural(messages, "message", "messages")}, ${plural(characters, "character", "characters")}`);
  fact("Images", String(int(disclosed.images)));
  fact("Output", disclosed.format === "json" ? "a JSON object" : "text");
  fact("Output limit", Number.isInteger(disclosed.maxTokens) ? `${disclosed.maxTokens} tokens` : "none set by the napplet");

  const tools = Array.isArray(disclosed.toolDefinitions) ? disclosed.toolDefinitions.filter((t) => t && typeof t === "object") : [];
  if (tools.length > 0) {
    const list = el("ul", { class: "tool-definitions" });
    for (const tool of tools) {
      const params = tool.parameters === undefined ? "(no parameters)" : JSON.stringify(tool.parameters, null, 2);
      list.append(
        el(
          "li",
          {},
          el(
            "details",
            {},
            el("summary", {}, el("code", {}, str(tool.name, "(unnamed)")), str(tool.description) ? ` — ${str(tool.description)}` : ""),
            el("pre", {}, params ?? "null"),
          ),
        ),
      );
    }
    fact("Tool definitions", list);
  } else {
    fact("Tool definitions", "none");
  }
  const results = Array.isArray(disclosed.toolResults) ? disclosed.toolResults.filter((t) => t && typeof t === "object") : [];
  if (results.length > 0) {
    const list = el("ul", { class: "tool-results" });
    for (const result of results) {
      const parts = [plural(int(result.characters), "character", "characters")];
      if (int(result.images) > 0) parts.push(plural(int(result.images), "image", "images"));
      list.append(
        el(
          "li",
          {},
          el("code", {}, str(result.toolName, "(unnamed)")),
          ` (call ${str(result.toolCallId)}): ${parts.join(", ")}`,
          result.isError === true ? el("span", { class: "badge warn" }, "reports an error") : null,
        ),
      );
    }
    fact("Tool results", list);
  } else {
    fact("Tool results", "none");
  }
  fact(
    "Charges",
    data.charges === true
      ? el("strong", { class: "warn-text" }, "This provider may charge you for this request.")
      : "No charges expected from this provider.",
  );
  return facts;
}
