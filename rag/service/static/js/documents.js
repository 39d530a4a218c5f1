// The documents panel: drag-and-drop (or chosen) uploads with progress,
// one after another; the index's documents with their chunk counts; delete.
// A file that cannot be indexed keeps its line with the server's reason.
// The uploads still in flight are known to the rest of the page (a question
// asked before the first is indexed says what it waits for).
// Does not: read files itself; the server ingests them.

import { ApiError, deleteJson, getJson, inCollection, upload } from "./api.js";
import { $, button, node, plural } from "./dom.js";
import { shown } from "./notice.js";
let known = new Map(); // doc id -> document, for the source viewer
const inFlight = new Set(); // the items of uploads not yet indexed nor refused
const changes = new EventTarget(); // "change" each time an upload in flight moves on

export function documentById(id) { return known.get(id); }

/** Whether the index held documents when the list was last read. */
export function hasDocuments() { return known.size > 0; }

/** This page's uploads in flight: [{name, state}], state as their line shows it. */
export function uploadsInFlight() {
  return [...inFlight].map((item) => ({ name: item.name, state: item.state.textContent }));
}

/** Call `listener` each time an upload in flight moves on; returns what stops it. */
export function onUploadsChange(listener) {
  changes.addEventListener("change", listener);
  return () => changes.removeEventListener("change", listener);
}

/** Resolves once this page has no upload in flight. */
export function uploadsSettled() {
  return new Promise((resolve) => {
    const stop = onUploadsChange(() => { if (!inFlight.size) { stop(); resolve(); } });
    if (!inFlight.size) { stop(); resolve(); }
  });
}

function setState(item, text) {
  item.state.textContent = text;
  changes.dispatchEvent(new Event("change"));
}

export async function refreshDocuments() {
  let docs = [];
  try {
    docs = (await getJson(inCollection("/v1/documents"))).documents;
  } catch (err) {
    // No index yet: the first upload makes one.
    if (!(err instanceof ApiError && err.status === 404)) throw err;
  }
  known = new Map(docs.map((d) => [d.id, d]));
  const list = $("document-list");
  list.replaceChildren(...docs.sort((a, b) => a.source.localeCompare(b.source)).map(documentItem));
  $("doc-empty").hidden = docs.length > 0;
  return docs;
}

function documentItem(doc) {
  const li = node("li");
  li.dataset.docId = doc.id;
  const name = node("span", "doc-name", doc.source);
  name.title = `${doc.root}/${doc.source}`;
  // Two presses: the first asks, the second deletes (no modal to dismiss).
  let armed = null;
  const remove = button("Delete", "quiet small", async () => {
    if (!armed) {
      remove.textContent = "Really delete?";
      armed = setTimeout(() => { armed = null; remove.textContent = "Delete"; }, 4000);
      return;
    }
    clearTimeout(armed);
    remove.disabled = true;
    try {
      await deleteJson(inCollection(`/v1/documents/${encodeURIComponent(doc.id)}`));
      await refreshDocuments();
    } catch (err) {
      remove.disabled = false;
      remove.textContent = "Delete";
      armed = null;
      showError(li, err.message);
    }
  }, `Delete ${doc.source}`);
  li.append(name, node("span", "doc-chunks", plural(doc.chunks, "chunk")), remove);
  return li;
}

function showError(li, message) {
  let line = li.querySelector(".error");
  if (!line) {
    line = node("p", "error");
    line.setAttribute("role", "alert");
    li.append(line);
  }
  line.textContent = message;
}

function uploadItem(file) {
  const bar = node("progress");
  bar.max = Math.max(file.size, 1);
  bar.value = 0;
  bar.setAttribute("aria-label", `Uploading ${file.name}`);
  const state = node("span", "upload-state", "waiting");
  const li = node("li");
  li.append(node("span", "doc-name", file.name), bar, state);
  return { li, bar, state, name: file.name };
}

async function uploadOne(file, item) {
  setState(item, "uploading");
  try {
    const result = await upload(file, (sent, total) => {
      item.bar.max = Math.max(total, 1);
      item.bar.value = sent;
      setState(item, sent >= total ? "indexing…" : `uploading ${Math.floor((100 * sent) / Math.max(total, 1))}%`);
    });
    const doc = result.documents[0];
    item.bar.value = item.bar.max;
    item.li.classList.add("done");
    item.state.textContent = doc ? `indexed: ${plural(doc.chunks, "chunk")}` : "indexed";
    setTimeout(() => item.li.remove(), 4000); // it is in the list below by now; failures stay
  } catch (err) {
    item.li.classList.add("failed");
    item.bar.remove();
    item.state.textContent = "not indexed";
    showError(item.li, err.message);
  }
}

/** Upload files one after another (the server ingests one at a time anyway);
 * a list that could not be read again meanwhile does not stop the files after. */
export async function uploadFiles(files) {
  const items = Array.from(files).map((f) => [f, uploadItem(f)]);
  $("uploads").prepend(...items.map(([, item]) => item.li));
  items.forEach(([, item]) => inFlight.add(item));
  changes.dispatchEvent(new Event("change"));
  for (const [file, item] of items) {
    await uploadOne(file, item);
    await refreshDocuments().catch(() => {}); // shown stale until the next refresh
    inFlight.delete(item); // once the list holds what it added
    changes.dispatchEvent(new Event("change"));
  }
  await refreshDocuments();
}

export function setUpDocuments() {
  const drop = $("drop"), input = $("file-input");
  $("choose").addEventListener("click", () => input.click());
  input.addEventListener("change", () => {
    if (input.files.length) shown(uploadFiles(input.files).finally(() => { input.value = ""; }));
  });
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer && e.dataTransfer.files.length) shown(uploadFiles(e.dataTransfer.files));
  });
  // A file dropped anywhere else would make the browser navigate away to it.
  window.addEventListener("dragover", (e) => e.preventDefault());
  window.addEventListener("drop", (e) => e.preventDefault());
}
