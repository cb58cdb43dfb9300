/**
 * The chat side of the engine-worker protocol (worker-bridge.js) for an
 * engine that generates one chat at a time and stops one through its own
 * interrupt (WebLLM: one generation lock, `interruptGenerate`). Used by
 * webllm-worker.js on its port, and by WebLLM's page adapter
 * (webllm-engine.js) for an engine that is not WebLLM's worker client.
 *
 * Rules (docs/design.md, "Known behaviours")
 * - In: `{op: "chat", id, body}` and `{op: "cancel", id}`. Out:
 *   `{op: "chunks", id, chunks: [JSON text, ...]}` and, once per chat,
 *   `{op: "end", id, chunks?: [JSON text, ...], error: null | {name, message}}`
 *   (the page names the error's kind; its text never reaches a napplet).
 * - Chats run one at a time, in the order they came. A cancel of the chat
 *   generating calls `interrupt()`; the chat is still read to its end, so
 *   the engine's lock is released before the next one starts
 *   (mlc-ai/web-llm #447). A cancel of a queued chat ends it, unrun, when
 *   its turn comes; a cancel of an unknown id does nothing.
 */

/** `{name, message}` of a thrown value (a library may throw plain strings). */
export function describeError(failure) {
  const name = String((failure && (failure.name || failure.constructor?.name)) || "");
  const message = typeof failure === "string" ? failure : String((failure && failure.message) || "");
  return { name, message };
}

/**
 * Serve chats on `port` (a MessagePort or a worker scope): `run(body, post,
 * merge)` generates one chat (posting `{op: "chunks", chunks}` messages
 * through `post`; `merge`: the chat's batcher.js `merge` field) and
 * resolves with the chunks still held back; `interrupt()`
 * stops the chat generating. `onOther(data, event)` gets every message
 * that is not a chat or a cancel.
 */
export function serveChats(port, { run, interrupt, onOther = () => {} }) {
  let chain = Promise.resolve();
  /** id -> {cancelled}: chats posted and not ended. */
  const chats = new Map();
  let active = null;

  async function runOne(id, body) {
    const state = chats.get(id);
    let rest = [];
    let error = null;
    try {
      if (state.cancelled) return;
      active = id;
      rest = await run(body, (message) => port.postMessage({ ...message, id }), state.merge);
    } catch (failure) {
      console.error("napllm engine: generation failed", failure);
      error = describeError(failure);
    } finally {
      active = null;
      chats.delete(id);
      port.postMessage({ op: "end", id, chunks: rest, error });
    }
  }

  port.onmessage = (event) => {
    const data = event && event.data;
    if (data && typeof data === "object" && data.op === "chat") {
      const id = String(data.id);
      chats.set(id, { cancelled: false, merge: data.merge !== false });
      chain = chain.then(() => runOne(id, data.body && typeof data.body === "object" ? data.body : {}));
    } else if (data && typeof data === "object" && data.op === "cancel") {
      const state = chats.get(String(data.id));
      if (!state) return;
      state.cancelled = true;
      if (active === String(data.id)) {
        try {
          interrupt();
        } catch {
          /* the chat ends on its own */
        }
      }
    } else {
      onOther(data, event);
    }
  };
}
