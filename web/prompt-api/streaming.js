/**
 * `promptStreaming`'s ReadableStream over a prompt's NAP-LLM deltas.
 *
 * Rules
 * - Each chunk is new text only (the Prompt API's current behaviour, not
 *   the whole text so far); only `text` block deltas reach the stream
 *   (thinking and tool calls never do), and an empty delta is no chunk.
 * - The stream closes when the prompt resolves and errors with the
 *   prompt's error; cancelling it cancels the generations that feed it
 *   and nothing more is enqueued.
 */

/**
 * A stream of the text a prompt generates.
 *
 * @param {(sink: {stream: ReadableStream, chunk: (text: string) => void}) => Promise<any>} run
 *   runs the prompt, passing each new text to `sink.chunk`.
 * @param {(stream: ReadableStream) => void} cancel cancels the generations
 *   that write to `stream`.
 * @returns {ReadableStream<string>}
 */
export function textStream(run, cancel) {
  let controller;
  let cancelled = false;
  const stream = new ReadableStream({
    start: (c) => {
      controller = c;
    },
    cancel: () => {
      cancelled = true;
      cancel(stream);
    },
  });
  const sink = {
    stream,
    chunk(text) {
      if (!cancelled && text) controller.enqueue(text);
    },
  };
  run(sink).then(
    () => {
      if (!cancelled) controller.close();
    },
    (err) => {
      if (!cancelled) controller.error(err);
    },
  );
  return stream;
}

/** The `onDelta` of a generation that feeds `sink` (undefined without one). */
export function textDeltas(sink) {
  if (!sink) return undefined;
  return (d) => {
    if (d.block === "text" && d.event === "delta") sink.chunk(d.text);
  };
}
