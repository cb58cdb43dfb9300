/**
 * Persistence of the connection list in IndexedDB (bridge contract,
 * `saveConnections` / `loadConnections`).
 *
 * Rules
 * - One database, one object store, one record holding the runtime's JSON
 *   text. The text contains credentials: it stays in the shell's origin and
 *   is never logged or shown.
 * - An empty or missing record reads as "[]".
 */

const DB_NAME = "napllm";
const STORE = "connections";
const RECORD_KEY = "list";

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

async function withStore(mode, action) {
  const db = await openDatabase();
  try {
    return await new Promise((resolve, reject) => {
      const transaction = db.transaction(STORE, mode);
      const request = action(transaction.objectStore(STORE));
      transaction.oncomplete = () => resolve(request.result);
      transaction.onerror = () => reject(new Error("IndexedDB transaction failed"));
      transaction.onabort = () => reject(new Error("IndexedDB transaction aborted"));
    });
  } finally {
    db.close();
  }
}

/** Store the connection list (JSON text). */
export async function saveConnections(json) {
  await withStore("readwrite", (store) => store.put(String(json), RECORD_KEY));
}

/** The stored connection list as JSON text, "[]" when none. */
export async function loadConnections() {
  const value = await withStore("readonly", (store) => store.get(RECORD_KEY));
  return typeof value === "string" && value.length > 0 ? value : "[]";
}
