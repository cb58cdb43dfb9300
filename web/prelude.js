/**
 * The napplet prelude: the script the shell places in every napplet frame,
 * right after the CSP <meta> and before any napplet byte (NIP-5D web
 * projection; NAP-LLM, API Surface and Wire Protocol).
 *
 * Rules
 * - `installNappletPrelude` must be self-contained: the shell inlines its
 *   source text into the frame's srcdoc (`preludeSource`), so it may not use
 *   anything from this module's scope.
 * - `window.napplet` is defined non-writable and non-configurable and is
 *   frozen. It holds only the domains granted to this frame: `llm` when the
 *   llm domain is granted, nothing otherwise (presence = availability).
 * - Messages are accepted only from `window.parent` (`event.source`).
 *   Results match a pending request by `id` *and* result type; deltas match
 *   an active generation by `requestId`; unknown types are ignored; deltas
 *   after a generation's terminal result are ignored.
 * - No whole-request timeout: selection waits on a person and streams can
 *   run for minutes. The runtime bounds generation time (NAP-LLM,
 *   Cancellation and deadlines).
 * - Binding (issue: only a document started from the shell's srcdoc gets an
 *   endpoint): the shell writes a fresh unguessable `secret` into the
 *   prelude's source for every frame it builds. At install the prelude
 *   removes its own `<script>` element (so napplet code never sees the
 *   secret), creates a `MessageChannel` and posts
 *   `{"type": "napllm.documentStart", "secret"}` to `window.parent` with two
 *   ports transferred. Every envelope from the shell comes over the first
 *   port, and so does every envelope `window.napplet.llm` sends; the second
 *   carries the prelude's report of this document's `load` and its answers
 *   to the shell's pings. A document the frame navigates to has no prelude,
 *   no secret and no port, so it gets nothing; a napplet reloading itself
 *   runs the prelude again and gets a new endpoint.
 * - Raw envelopes (NIP-5D web projection): a napplet that does not use
 *   `window.napplet.llm` posts envelope objects to `window.parent`
 *   (`window.parent.postMessage(envelope, "*")`) and reads the shell's as
 *   `message` events whose `source` is `window.parent`. The shell holds
 *   each such message until this prelude answers a ping sent on the second
 *   port after it arrived (web/js/frames.js): the answer is what ties the
 *   message to this document rather than to another document of the frame.
 *   Posting envelope objects to the napplet's *own* window (`window.postMessage(envelope, "*")`)
 *   is kept as an alias: the prelude forwards those (source is this window,
 *   data is an object, not a result or delta type) over the port.
 * - The port never reaches napplet code: it lives in this closure, and every
 *   method the prelude uses on it, on events and on the window is captured
 *   (bound) at install, before any napplet script can replace a prototype.
 * - Every envelope from the shell is also dispatched on the window as a
 *   `message` event whose `source` is `window.parent` and whose `origin` is
 *   the shell's origin (written into this source by the shell, like the
 *   secret), `ports` empty and `data` the envelope: what a `postMessage`
 *   from the shell's window would carry, so a napplet that checks `origin`
 *   and `source` (as the web platform advises) accepts it. The event is
 *   the prelude's (`isTrusted` is false): the envelopes come over the
 *   document's port, never by `postMessage` to the frame's window, since
 *   that window is shared by every document the frame ever shows and a
 *   reply posted to it could reach a document the napplet navigated to.
 * - WebRTC is not governed by CSP in Chromium (no `webrtc` directive), so the
 *   prelude removes the WebRTC constructors from this window and from every
 *   frame the napplet creates (a nested frame's window is closed the same way
 *   when it loads); `document.open` is refused, since it would drop the
 *   prelude's listeners.
 * - Errors reject with `LlmError` carrying the Error record's `code` and
 *   `message` (NAP-LLM, Error Handling).
 */

/**
 * Install `window.napplet` in the current (frame) window.
 *
 * @param {string[]} domains granted domains; only "llm" is known here.
 * @param {string} secret the per-frame secret the shell wrote into this source.
 * @param {string} shellOrigin the shell page's origin (`location.origin`),
 *   given to the `message` events the envelopes are dispatched as.
 */
export function installNappletPrelude(domains, secret, shellOrigin) {
  "use strict";
  const win = window;
  const doc = win.document;
  const parentWindow = win.parent;
  // The secret is in this script's text: remove the element before any
  // napplet byte is parsed.
  const own = doc.currentScript;
  if (own && own.parentNode) own.parentNode.removeChild(own);

  // Captured at install so that napplet code replacing globals later cannot
  // redirect or observe the prelude's traffic (or reach its port).
  const postToParent = parentWindow.postMessage.bind(parentWindow);
  const addListener = win.addEventListener.bind(win);
  const dispatch = win.dispatchEvent.bind(win);
  const MessageEventCtor = win.MessageEvent;
  const getter = (proto, name) => Object.getOwnPropertyDescriptor(proto, name).get;
  const apply = Reflect.apply;
  const defineOwn = Object.defineProperty;
  const eventData = getter(win.MessageEvent.prototype, "data");
  const eventSource = getter(win.MessageEvent.prototype, "source");
  const eventTarget = getter(win.Event.prototype, "target");
  const frameWindow = getter(win.HTMLIFrameElement.prototype, "contentWindow");
  const addListenerTo = win.EventTarget.prototype.addEventListener;
  const listen = (target, type, handler, capture) => apply(addListenerTo, target, [type, handler, capture]);
  const channel = new win.MessageChannel();
  const port = channel.port1;
  // A second channel for the prelude's own reports (napplet code can post
  // anything on the first one through the relay below).
  const control = new win.MessageChannel();
  const postControl = win.MessagePort.prototype.postMessage.bind(control.port1);
  const postToPort = win.MessagePort.prototype.postMessage.bind(port);

  // WebRTC sends UDP that no CSP directive governs in Chromium: remove its
  // constructors here and in every same-origin window the napplet creates.
  const RTC_NAMES = [
    "RTCPeerConnection", "webkitRTCPeerConnection", "RTCIceTransport", "RTCDtlsTransport",
    "RTCSctpTransport", "RTCDataChannel", "RTCRtpSender", "RTCRtpReceiver", "RTCRtpTransceiver",
    "RTCEncodedAudioFrame", "RTCEncodedVideoFrame", "RTCRtpScriptTransform",
  ];
  // Markup that would create a declarative (possibly closed) shadow root;
  // checked with intrinsics captured now (napplet code may replace them).
  const toStr = String;
  const lower = String.prototype.toLowerCase;
  const indexOf = String.prototype.indexOf;
  const join = Array.prototype.join;
  const declarative = (text) => apply(indexOf, apply(lower, text, []), ["shadowrootmode"]) !== -1;
  const closeWindow = (target) => {
    try {
      for (let i = 0; i < RTC_NAMES.length; i += 1) {
        const name = RTC_NAMES[i];
        try {
          delete target[name];
        } catch {
          // Not configurable: shadow it instead.
        }
        if (name in target) {
          defineOwn(target, name, { value: undefined, writable: false, configurable: false });
        }
      }
      const refuse = () => {
        throw new target.DOMException("document.open is not available to napplets.", "NotSupportedError");
      };
      const docProto = target.Document.prototype;
      const write = docProto.write;
      const writeln = docProto.writeln;
      const readyState = getter(docProto, "readyState");
      // write() after parsing would open the document again (dropping listeners).
      const guarded = (original) => function (...parts) {
        // (parts are joined once: what is checked is what is written)
        if (apply(readyState, this, []) !== "loading") refuse();
        const text = apply(join, parts, [""]);
        if (declarative(text)) refuse();
        return apply(original, this, [text]);
      };
      defineOwn(docProto, "open", { value: refuse, writable: false, configurable: false });
      defineOwn(docProto, "write", { value: guarded(write), writable: false, configurable: false });
      defineOwn(docProto, "writeln", { value: guarded(writeln), writable: false, configurable: false });
      // A frame the napplet creates gets the same treatment as it loads
      // (about:blank loads synchronously when the frame is inserted).
      listen(target, "load", (event) => {
        const frame = apply(eventTarget, event, []);
        let child = null;
        try {
          child = apply(frameWindow, frame, []);
        } catch {
          child = null; // not a frame element
        }
        if (child) closeWindow(child);
      }, true);
    } catch {
      // Best effort on an exotic window.
    }
  };
  closeWindow(win);
  // A frame the napplet nests gets an opaque origin of its own (the sandbox
  // is inherited), so its globals cannot be closed from here, and srcdoc is
  // not governed by `frame-src`: nested frames are removed as soon as they
  // are inserted (before their document can start), in the document and in
  // every shadow root.
  // Every DOM method used here is captured now: napplet code may replace
  // prototypes (and array iteration) to keep a frame alive.
  const FRAME_TAGS = ["iframe", "frame", "object", "embed", "fencedframe", "portal"];
  const addedNodes = getter(win.MutationRecord.prototype, "addedNodes");
  const listLength = getter(win.NodeList.prototype, "length");
  const listItem = win.NodeList.prototype.item;
  const collectionLength = getter(win.HTMLCollection.prototype, "length");
  const collectionItem = win.HTMLCollection.prototype.item;
  const nodeTypeOf = getter(win.Node.prototype, "nodeType");
  const localNameOf = getter(win.Element.prototype, "localName");
  const byTag = win.Element.prototype.getElementsByTagName;
  const parentOf = getter(win.Node.prototype, "parentNode");
  const removeChild = win.Node.prototype.removeChild;
  const removeNode = (node) => {
    const parent = apply(parentOf, node, []);
    if (parent) apply(removeChild, parent, [node]);
  };
  const removeFrames = (records) => {
    for (let r = 0; r < records.length; r += 1) {
      const nodes = apply(addedNodes, records[r], []);
      const count = apply(listLength, nodes, []);
      for (let n = 0; n < count; n += 1) {
        const node = apply(listItem, nodes, [n]);
        if (!node || apply(nodeTypeOf, node, []) !== 1) continue;
        for (let t = 0; t < FRAME_TAGS.length; t += 1) {
          // (a live collection: removed from the end; no array a napplet
          // could hook with an index setter on Array.prototype)
          const inner = apply(byTag, node, [FRAME_TAGS[t]]);
          for (let i = apply(collectionLength, inner, []) - 1; i >= 0; i -= 1) {
            removeNode(apply(collectionItem, inner, [i]));
          }
          if (apply(localNameOf, node, []) === FRAME_TAGS[t]) removeNode(node);
        }
      }
    }
  };
  const watcher = new win.MutationObserver(removeFrames);
  const observe = watcher.observe.bind(watcher);
  observe(doc, { childList: true, subtree: true });
  // Declarative shadow roots (which may be closed) come only from markup:
  // the napplet's own bytes are checked by the shell; markup given to the
  // parsing methods that honour them is refused here.
  const refuseDeclarative = (proto, name, isStatic) => {
    const original = proto && proto[name];
    if (typeof original !== "function") return;
    defineOwn(proto, name, {
      value: function (html, ...rest) {
        const text = toStr(html);
        if (declarative(text)) {
          throw new win.DOMException("Declarative shadow roots are not available to napplets.", "NotSupportedError");
        }
        const args = [text];
        for (let i = 0; i < rest.length; i += 1) args[args.length] = rest[i];
        return apply(original, isStatic ? proto : this, args);
      },
      writable: false,
      configurable: false,
    });
  };
  refuseDeclarative(win.Element.prototype, "setHTMLUnsafe", false);
  refuseDeclarative(win.ShadowRoot && win.ShadowRoot.prototype, "setHTMLUnsafe", false);
  refuseDeclarative(win.Document, "parseHTMLUnsafe", true);
  const attachShadow = win.Element.prototype.attachShadow;
  defineOwn(win.Element.prototype, "attachShadow", {
    value: function (...args) {
      const root = apply(attachShadow, this, args);
      observe(root, { childList: true, subtree: true });
      return root;
    },
    writable: false,
    configurable: false,
  });
  const getRandomValues = win.crypto.getRandomValues.bind(win.crypto);
  const freeze = Object.freeze;
  const defineProperty = Object.defineProperty;
  const PromiseCtor = Promise;
  const MapCtor = Map;
  const report =
    typeof win.reportError === "function"
      ? win.reportError.bind(win)
      : (err) => setTimeout(() => { throw err; }, 0);

  const isRecordLike = (v) => typeof v === "object" && v !== null && !Array.isArray(v);
  const namespace = {};
  // Set below when the llm domain is granted: handles one envelope from the shell.
  let onEnvelope = null;

  if (domains.indexOf("llm") !== -1) {
    /** An NAP-LLM failure: `code` is the Error record's code (NAP-LLM, Error Handling). */
    class LlmError extends Error {
      constructor(code, message) {
        super(typeof message === "string" ? message : String(code));
        this.name = "LlmError";
        this.code = code;
      }
    }
    freeze(LlmError.prototype);
    freeze(LlmError);

    const hex = (bytes) => {
      let out = "";
      for (let i = 0; i < bytes.length; i += 1) out += bytes[i].toString(16).padStart(2, "0");
      return out;
    };
    /** A fresh request id: 128 random bits, never reused (NAP-LLM, Wire Protocol). */
    const freshId = (prefix) => prefix + "-" + hex(getRandomValues(new Uint8Array(16)));

    const isRecord = (v) => typeof v === "object" && v !== null && !Array.isArray(v);
    const errorFrom = (record) => {
      if (isRecord(record) && typeof record.code === "string") {
        return new LlmError(record.code, typeof record.message === "string" ? record.message : record.code);
      }
      return new LlmError("invalid-response", "The runtime sent a malformed error.");
    };

    // id -> { resultType, onResult(message) }: one entry per request awaiting its terminal result.
    const pending = new MapCtor();
    // requestId -> generation state, for routing llm.delta (active generations only).
    const generations = new MapCtor();

    const send = (message) => {
      try {
        postToPort(message);
        return null;
      } catch (err) {
        // A value structured clone cannot carry (a function, a DOM node...).
        return new LlmError("invalid-request", "The request cannot be sent: " + (err && err.name ? err.name : "DataCloneError") + ".");
      }
    };

    /** Send a request and resolve with `pick(result)` or reject with its Error record. */
    const request = (type, fields, pick) => new PromiseCtor((resolve, reject) => {
      const id = freshId(type.slice(4));
      pending.set(id, {
        resultType: type + ".result",
        onResult(message) {
          if ("error" in message) reject(errorFrom(message.error));
          else {
            const value = pick(message);
            if (value === undefined) reject(new LlmError("invalid-response", "The runtime sent a malformed result."));
            else resolve(value);
          }
        },
      });
      const failure = send(Object.assign({ type, id }, fields));
      if (failure) {
        pending.delete(id);
        reject(failure);
      }
    });

    const pickModel = (message) => (isRecord(message.model) ? message.model : undefined);
    const pickCancelled = (message) => (typeof message.cancelled === "boolean" ? message.cancelled : undefined);

    const cancel = (requestId) => request("llm.cancel", { requestId }, pickCancelled);

    /**
     * The generation handle: `{id, result, deltas, cancel(), then, catch, finally}`.
     * `deltas` is an async iterable over every Delta of this generation (buffered
     * from the start), ending after the terminal result (throwing its error).
     */
    const generate = (req, options) => {
      const onDelta = options && typeof options.onDelta === "function" ? options.onDelta : null;
      const id = freshId("generate");
      const buffered = [];
      const waiters = [];
      let finished = false;
      let failure = null;
      let settleResult;
      const result = new PromiseCtor((resolve, reject) => {
        settleResult = { resolve, reject };
      });
      // The handle's own bookkeeping must not report an unhandled rejection
      // when the napplet consumes deltas only; its own awaits still see it.
      result.catch(() => {});

      const wake = () => {
        while (waiters.length > 0) {
          const waiter = waiters.shift();
          if (buffered.length > 0) waiter.resolve({ value: buffered.shift(), done: false });
          else if (failure) waiter.reject(failure);
          else waiter.resolve({ value: undefined, done: true });
        }
      };
      const finish = (error) => {
        finished = true;
        failure = error;
        generations.delete(id);
        wake();
      };

      generations.set(id, {
        onDelta(delta) {
          if (finished) return;
          if (onDelta) {
            try {
              onDelta(delta);
            } catch (err) {
              report(err);
            }
          }
          buffered.push(delta);
          if (waiters.length > 0) wake();
        },
      });
      pending.set(id, {
        resultType: "llm.generate.result",
        onResult(message) {
          if ("error" in message) {
            const err = errorFrom(message.error);
            finish(err);
            settleResult.reject(err);
          } else if (isRecord(message.result)) {
            finish(null);
            settleResult.resolve(message.result);
          } else {
            const err = new LlmError("invalid-response", "The runtime sent a malformed result.");
            finish(err);
            settleResult.reject(err);
          }
        },
      });
      const sendFailure = send({ type: "llm.generate", id, request: req });
      if (sendFailure) {
        pending.delete(id);
        finish(sendFailure);
        settleResult.reject(sendFailure);
      }

      const deltas = freeze({
        [Symbol.asyncIterator]() {
          return freeze({
            next() {
              if (buffered.length > 0) return PromiseCtor.resolve({ value: buffered.shift(), done: false });
              if (finished) {
                return failure ? PromiseCtor.reject(failure) : PromiseCtor.resolve({ value: undefined, done: true });
              }
              return new PromiseCtor((resolve, reject) => waiters.push({ resolve, reject }));
            },
            return() {
              return PromiseCtor.resolve({ value: undefined, done: true });
            },
          });
        },
      });

      return freeze({
        id,
        result,
        deltas,
        cancel: () => cancel(id),
        then: (onFulfilled, onRejected) => result.then(onFulfilled, onRejected),
        catch: (onRejected) => result.catch(onRejected),
        finally: (onFinally) => result.finally(onFinally),
      });
    };

    onEnvelope = (message) => {
      if (!isRecord(message) || typeof message.type !== "string") return;
      if (message.type === "llm.delta") {
        if (typeof message.requestId !== "string") return;
        const generation = generations.get(message.requestId);
        if (generation) generation.onDelta(message);
        return;
      }
      if (typeof message.id !== "string") return;
      const entry = pending.get(message.id);
      if (!entry || entry.resultType !== message.type) return;
      pending.delete(message.id);
      entry.onResult(message);
    };

    namespace.llm = freeze({
      /** NAP-LLM `select`: resolves with a Model record; `requirements` omitted when undefined. */
      select(requirements) {
        return request("llm.select", requirements === undefined ? {} : { requirements }, pickModel);
      },
      /** NAP-LLM `describe`: revalidates a handle, resolves with a Model record. */
      describe(handle) {
        return request("llm.describe", { handle }, pickModel);
      },
      /** NAP-LLM `generate`: returns a thenable handle (see above). */
      generate(req, options) {
        return generate(req, options);
      },
      /** NAP-LLM `cancel`: resolves `true` when an active generation of this frame was cancelled. */
      cancel(requestId) {
        return cancel(requestId);
      },
      LlmError,
    });
  }

  defineProperty(win, "napplet", {
    value: freeze(namespace),
    writable: false,
    configurable: false,
    enumerable: true,
  });

  // Envelopes from the shell: to the binding first, then to the window as a
  // `message` event from the parent (for napplets that read raw envelopes).
  port.onmessage = (event) => {
    const message = apply(eventData, event, []);
    if (onEnvelope) {
      try {
        onEnvelope(message);
      } catch (err) {
        report(err);
      }
    }
    try {
      dispatch(new MessageEventCtor("message", { data: message, origin: shellOrigin, source: parentWindow }));
    } catch (err) {
      report(err);
    }
  };
  // Raw envelopes the napplet posts to its own window go to the shell (the
  // alias of the projection's `window.parent.postMessage`, which the shell
  // receives itself and confirms with the ping answered below).
  addListener("message", (event) => {
    if (apply(eventSource, event, []) !== win) return;
    const data = apply(eventData, event, []);
    if (typeof data !== "object" || data === null) return;
    // Envelopes travel napplet -> shell only: results and deltas stay here.
    const type = isRecordLike(data) ? data.type : undefined;
    if (typeof type === "string" && (type === "llm.delta" || type.endsWith(".result"))) return;
    try {
      postToPort(data);
    } catch (err) {
      report(err);
    }
  }, true);

  // Announce this document before any napplet script runs: the shell binds
  // it (and only it) to a new endpoint through the transferred port.
  // This document's load, reported so that the shell can tell its frame's
  // loads of started documents from loads of anything else.
  listen(win, "load", (event) => {
    if (apply(eventTarget, event, []) === doc) postControl({ loaded: true });
  }, true);
  // The shell asks whether this document is still the frame's: after a load
  // nobody reported, and before it acts on an envelope posted to the parent.
  control.port1.onmessage = (event) => {
    const data = apply(eventData, event, []);
    if (data && typeof data === "object" && typeof data.ping === "number") postControl({ pong: data.ping });
  };
  postToParent({ type: "napllm.documentStart", secret }, "*", [channel.port2, control.port2]);
}

/**
 * The prelude as inline script text for a frame granted `domains`.
 *
 * @param {string[]} domains e.g. ["llm"] or [].
 * @param {string} secret the frame's secret (hex digits only).
 * @param {string} shellOrigin the shell page's origin (`location.origin`).
 * @returns {string} JavaScript source (contains no "</script").
 */
export function preludeSource(domains, secret, shellOrigin) {
  const args = [JSON.stringify(domains), JSON.stringify(String(secret)), JSON.stringify(String(shellOrigin))];
  const text = "(" + installNappletPrelude.toString() + ")(" + args.join(", ") + ");";
  // Never possible with the source above, but a premature end tag would let
  // the napplet's bytes run before the prelude finished.
  return text.replace(/<\/(script)/gi, "<\\/$1");
}
