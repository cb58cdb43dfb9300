/**
 * Prompt API prompts as NAP-LLM messages: strings, `{role, content}`
 * arrays, text and image content (NAP-LLM, Message; Content Parts).
 *
 * Rules
 * - The napplet's input is converted, never trusted: a malformed prompt is
 *   a `TypeError`; what NAP-LLM connections cannot take (audio, assistant
 *   prefixes, tool content in prompts, images in assistant messages) is a
 *   `NotSupportedError`.
 * - A system message may only be the first message of a session.
 * - A prompt holds at most `MAX_HISTORY_MESSAGES` messages; an image is
 *   sent as the PNG, JPEG or WebP bytes it is (by signature, not by the
 *   Blob's claimed type), or drawn and sent as PNG.
 * - `messageChars` is the one measure of a message's size that the
 *   session's bounds use.
 */

import { MAX_HISTORY_MESSAGES } from "./limits.js";

/** UTF-16 code units a NAP-LLM message holds (text, image data, tool arguments). */
export function messageChars(message) {
  let n = 0;
  for (const part of message.content) {
    if (part.type === "text" || part.type === "thinking") n += part.text.length;
    else if (part.type === "image") n += part.data.length;
    else if (part.type === "toolCall") n += part.name.length + JSON.stringify(part.arguments).length;
  }
  return n;
}

/** base64 of bytes (standard, padded). */
function base64(bytes) {
  let binary = "";
  const CHUNK = 0x8000;
  for (let i = 0; i < bytes.length; i += CHUNK) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + CHUNK));
  }
  return btoa(binary);
}

/** The image MIME type of raw bytes by signature (NAP-LLM accepts png, jpeg, webp). */
function sniffImage(bytes) {
  if (bytes.length >= 8 && bytes[0] === 0x89 && bytes[1] === 0x50 && bytes[2] === 0x4e && bytes[3] === 0x47) return "image/png";
  if (bytes.length >= 3 && bytes[0] === 0xff && bytes[1] === 0xd8 && bytes[2] === 0xff) return "image/jpeg";
  if (bytes.length >= 12 && String.fromCharCode(...bytes.subarray(0, 4)) === "RIFF" && String.fromCharCode(...bytes.subarray(8, 12)) === "WEBP") {
    return "image/webp";
  }
  return null;
}

/**
 * An NAP-LLM image part from a Prompt API image value: a Blob or bytes in
 * PNG, JPEG or WebP are sent as they are; anything `createImageBitmap` takes
 * (a canvas, an <img>, ImageData, ImageBitmap...) is drawn and sent as PNG.
 *
 * @throws {DOMException} `EncodingError` for bytes in another format.
 */
async function imagePart(value) {
  let bytes = null;
  if (value instanceof Blob) bytes = new Uint8Array(await value.arrayBuffer());
  else if (value instanceof ArrayBuffer) bytes = new Uint8Array(value.slice(0));
  else if (ArrayBuffer.isView(value)) bytes = new Uint8Array(value.buffer.slice(value.byteOffset, value.byteOffset + value.byteLength));
  if (bytes) {
    const mimeType = sniffImage(bytes);
    if (!mimeType) throw new DOMException("The image is not PNG, JPEG or WebP.", "EncodingError");
    return { type: "image", mimeType, data: base64(bytes) };
  }
  let bitmap;
  try {
    bitmap = await createImageBitmap(value);
  } catch {
    throw new TypeError("An image value must be a Blob, bytes, or an image source createImageBitmap accepts.");
  }
  const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
  canvas.getContext("2d").drawImage(bitmap, 0, 0);
  bitmap.close();
  const blob = await canvas.convertToBlob({ type: "image/png" });
  return { type: "image", mimeType: "image/png", data: base64(new Uint8Array(await blob.arrayBuffer())) };
}

/** One Prompt API content item -> an NAP-LLM part. */
async function partOf(item, role) {
  if (typeof item !== "object" || item === null) throw new TypeError("A content item must be an object {type, value}.");
  const value = "value" in item ? item.value : item.content;
  switch (item.type) {
    case "text":
      if (typeof value !== "string") throw new TypeError("A text content value must be a string.");
      return { type: "text", text: value };
    case "image":
      if (role === "assistant") throw new DOMException("Assistant messages cannot hold images.", "NotSupportedError");
      return imagePart(value);
    case "audio":
      throw new DOMException("Audio input is not offered by NAP-LLM connections.", "NotSupportedError");
    case "tool-call":
    case "tool-response":
      throw new DOMException(
        "Tool calls in prompts (open-loop tool use) are not offered by this layer: give each tool an execute function.",
        "NotSupportedError",
      );
    default:
      throw new TypeError(`Unknown content type ${JSON.stringify(String(item.type))}.`);
  }
}

/**
 * A Prompt API prompt (a string, or an array of `{role, content, prefix?}`)
 * as NAP-LLM messages.
 *
 * @param {unknown} input
 * @param {boolean} systemAllowed whether a system message may come first.
 * @returns {Promise<object[]>} NAP-LLM messages.
 * @throws {TypeError} malformed input, or a system message anywhere but first.
 * @throws {DOMException} `NotSupportedError` for audio, prefixes and tool content.
 */
export async function messagesOf(input, systemAllowed) {
  if (typeof input === "string") return [{ role: "user", content: [{ type: "text", text: input }] }];
  if (!Array.isArray(input)) throw new TypeError("A prompt must be a string or an array of messages.");
  if (input.length > MAX_HISTORY_MESSAGES) {
    throw new DOMException(`A prompt may hold at most ${MAX_HISTORY_MESSAGES} messages.`, "QuotaExceededError");
  }
  const out = [];
  for (let i = 0; i < input.length; i += 1) {
    const message = input[i];
    if (typeof message !== "object" || message === null) throw new TypeError("A message must be an object {role, content}.");
    const role = message.role === undefined ? "user" : message.role;
    if (role !== "system" && role !== "user" && role !== "assistant") throw new TypeError(`Unknown role ${JSON.stringify(String(role))}.`);
    if (role === "system" && !(systemAllowed && i === 0)) {
      throw new TypeError("A system message may only be the first message of a session.");
    }
    if (message.prefix === true) {
      throw new DOMException("Assistant prefixes are not offered by NAP-LLM connections.", "NotSupportedError");
    }
    let content;
    if (typeof message.content === "string") content = [{ type: "text", text: message.content }];
    else if (Array.isArray(message.content) && message.content.length > 0) {
      content = [];
      for (const item of message.content) content.push(await partOf(item, role));
    } else throw new TypeError("A message's content must be a string or a non-empty array.");
    out.push({ role, content });
  }
  if (out.length === 0) throw new TypeError("A prompt must hold at least one message.");
  return out;
}
