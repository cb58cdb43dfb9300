/**
 * Persistence of the user's connections in IndexedDB (bridge contract,
 * `saveConnections` / `loadConnections`) and the notification of other tabs.
 *
 * Rules
 * - One record per connection: database `napllm`, object store
 *   `connections`, key `connection/<id>`, value `{text, created}` where
 *   `text` is the connection's JSON text exactly as it was saved and
 *   `created` orders the list (milliseconds since the epoch of the first
 *   save). A save never rewrites the list: it reads, then puts or deletes
 *   only the records it names, inside one readwrite transaction, so two
 *   tabs saving different connections never erase each other's.
 * - A record is never rewritten by this module on its own: entries the
 *   runtime cannot read (written by a newer build, say) stay byte for byte
 *   until a build that reads them saves them, or the user removes site data.
 * - Earlier builds kept the whole list in one record (`list`). It is split
 *   into per-connection records at the next load, in the same transaction
 *   as the read; a record that already exists wins over the list's copy.
 * - After every committed save the other tabs of this origin are told on
 *   the BroadcastChannel `napllm-connections` (`{"type": "changed"}`); they
 *   re-read the store (`onConnectionsChanged`).
 * - The database version stays 1, so tabs of an earlier build still open
 *   are not blocked by an upgrade.
 * - The texts contain credentials: they stay in the shell's origin and are
 *   never logged or shown.
 */

const DB_NAME = "napllm";
const STORE = "connections";
const LEGACY_KEY = "list";
const PREFIX = "connection/";
const CHANNEL = "napllm-connections";
const RANGE = () => IDBKeyRange.bound(PREFIX, `${PREFIX}\uffff`);

function openDatabase() {
  return new Promise((resolve, reject) => {
    const request = indexedDB.open(DB_NAME, 1);
    request.onupgradeneeded = () => {
      if (!request.result.objectStoreNames.contains(STORE)) request.result.createObjectStore(STORE);
    };
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(new Error("IndexedDB is not available"));
    request.onblocked = () => reject(new Error("IndexedDB is blocked by another tab"));
  });
}

/** Run `action(store, transaction)` in one transaction; resolves with its return value on commit. */
async function withStore(mode, action) {
  const db = await openDatabase();
  try {
    return await new Promise((resolve, reject) => {
      const transaction = db.transaction(STORE, mode);
      let result;
      transaction.oncomplete = () => resolve(result);
      transaction.onerror = () => reject(new Error("IndexedDB transaction failed"));
      transaction.onabort = () => reject(new Error("IndexedDB transaction aborted"));
      try {
        result = action(transaction.objectStore(STORE), transaction);
      } catch (error) {
        transaction.abort();
        reject(error);
      }
    });
  } finally {
    db.close();
  }
}

/**
 * The changes a save names: `{put: [object], remove: [id]}`.
 * `json` is an array of connection objects (each put by its `id`) or
 * `{"put": [object], "delete": [id]}`. Objects without a string `id` are
 * ignored.
 */
function parseChanges(json) {
  let value;
  try {
    value = JSON.parse(String(json));
  } catch {
    throw new Error("saveConnections needs JSON text");
  }
  const put = Array.isArray(value) ? value : Array.isArray(value?.put) ? value.put : [];
  const remove = !Array.isArray(value) && Array.isArray(value?.delete) ? value.delete : [];
  return {
    put: put.filter((item) => item && typeof item === "object" && typeof item.id === "string" && item.id),
    remove: remove.filter((id) => typeof id === "string" && id),
  };
}

// One channel object per page sends and listens: a page never hears its own saves.
let channel = null;
function sharedChannel() {
  if (typeof BroadcastChannel !== "function") return null;
  channel ??= new BroadcastChannel(CHANNEL);
  return channel;
}

function broadcast() {
  sharedChannel()?.postMessage({ type: "changed" });
}

/**
 * Save the connections `json` names (see `parseChanges`): each put is a
 * read-modify-write of that connection's record only (its `created` is
 * kept), each delete removes that record only; all in one transaction.
 * Other tabs are then told. Rejects when IndexedDB fails (nothing is saved).
 */
export async function saveConnections(json) {
  const { put, remove } = parseChanges(json);
  if (put.length === 0 && remove.length === 0) return;
  const now = Date.now();
  await withStore("readwrite", (store) => {
    put.forEach((item, index) => {
      const key = PREFIX + item.id;
      const text = JSON.stringify(item);
      const read = store.get(key);
      read.onsuccess = () => {
        const existing = read.result;
        const created = existing && Number.isFinite(existing.created) ? existing.created : now + index / 1000;
        store.put({ text, created }, key);
      };
    });
    for (const id of remove) store.delete(PREFIX + id);
  });
  broadcast();
}

/**
 * The stored connections as JSON text: an array of strings, oldest first,
 * "[]" when none. Each string is one record's text exactly as it was
 * stored (a record without text appears as a string the runtime counts as
 * unreadable); the runtime reads each on its own, within its per-record
 * limits, so one bad record never hides the others. Moves a legacy `list`
 * record into per-connection records first.
 */
export async function loadConnections() {
  const records = await withStore("readwrite", (store) => {
    const found = [];
    const legacy = store.get(LEGACY_KEY);
    legacy.onsuccess = () => {
      const list = typeof legacy.result === "string" ? legacy.result : null;
      let items = [];
      try {
        items = list ? JSON.parse(list) : [];
      } catch {
        items = [list];
      }
      const base = Date.now();
      const cursorAll = () => {
        const cursor = store.openCursor(RANGE());
        cursor.onsuccess = () => {
          const at = cursor.result;
          if (!at) return;
          found.push(at.value);
          at.continue();
        };
      };
      if (!Array.isArray(items) || items.length === 0) {
        if (list !== null) store.delete(LEGACY_KEY);
        cursorAll();
        return;
      }
      let pending = items.length;
      items.forEach((item, index) => {
        const id = item && typeof item === "object" && typeof item.id === "string" && item.id
          ? item.id
          : `legacy-${base}-${index}`;
        const key = PREFIX + id;
        const read = store.get(key);
        read.onsuccess = () => {
          if (read.result === undefined) store.put({ text: JSON.stringify(item), created: base - items.length + index }, key);
          pending -= 1;
          if (pending === 0) {
            store.delete(LEGACY_KEY);
            cursorAll();
          }
        };
      });
    };
    return found;
  });
  const created = (record) => Number(record?.created) || 0;
  // Each record's text as it is stored, one string each: the runtime reads
  // every record on its own (one bad record never hides the others).
  const texts = records
    .sort((a, b) => created(a) - created(b))
    .map((record) => {
      const text = typeof record === "string" ? record : record?.text;
      return typeof text === "string" ? text : "unreadable record";
    });
  return JSON.stringify(texts);
}

/**
 * Call `callback()` whenever another tab of this origin saved connections.
 * Returns a function that stops listening. Without BroadcastChannel it
 * does nothing (each tab then sees the others' changes at its next start).
 */
export function onConnectionsChanged(callback) {
  const shared = sharedChannel();
  if (!shared) return () => {};
  const listener = (event) => {
    if (event.data && event.data.type === "changed") callback();
  };
  shared.addEventListener("message", listener);
  return () => shared.removeEventListener("message", listener);
}
