// The source viewer: a dialog showing where a source came from. For text,
// the document's indexed text with the chunk's span highlighted and
// scrolled to; for a PDF, the file in the browser's own viewer at its page.
// Does not: find documents by name; sources carry their document id.

import { call, getJson, inCollection } from "./api.js";
import { $, node } from "./dom.js";

let pdfUrl = null; // the blob URL shown last, released when the next opens

function release() {
  if (pdfUrl) URL.revokeObjectURL(pdfUrl);
  pdfUrl = null;
}

export function setUpViewer() {
  const dialog = $("viewer");
  $("viewer-close").addEventListener("click", () => dialog.close());
  dialog.addEventListener("close", release);
  // A click on the backdrop (outside the dialog's box) closes it too.
  dialog.addEventListener("click", (e) => { if (e.target === dialog) dialog.close(); });
}

/** Open source `source` (of an answer's `sources`), numbered `n`; with `evidence` (one
 * of the answer's), at that sentence, highlighted within the passage. */
export async function openSource(source, n, evidence = null) {
  const dialog = $("viewer"), body = $("viewer-body"), note = $("viewer-note");
  release();
  $("viewer-title").textContent = `[${n}] ${source.source}${source.page ? `, page ${source.page}` : ""}`;
  note.textContent = "Loading…";
  body.replaceChildren();
  if (!dialog.open) dialog.showModal();
  if (!source.doc_id) {
    note.textContent = "This answer was stored before sources carried their document; ask again to open it.";
    return;
  }
  try {
    if (source.source.toLowerCase().endsWith(".pdf")) await showPdf(source, body, note);
    else await showText(source, body, note, evidence);
  } catch (err) {
    note.textContent = `Cannot open it: ${err.message}`;
  }
}

async function showText(source, body, note, evidence = null) {
  const doc = await getJson(inCollection(`/v1/documents/${encodeURIComponent(source.doc_id)}/text`));
  const text = doc.text, start = source.char_start ?? 0, end = source.char_end ?? 0;
  const pre = node("pre", "doc-text"), mark = node("mark", "");
  mark.id = "passage";
  // The evidence sentence, marked more strongly inside its passage's mark.
  const inside = evidence && evidence.start >= start && evidence.end <= end && evidence.start < evidence.end;
  if (inside) {
    const strong = node("mark", "evidence", text.slice(evidence.start, evidence.end));
    strong.id = "evidence";
    mark.append(text.slice(start, evidence.start), strong, text.slice(evidence.end, end));
  } else {
    mark.append(text.slice(start, end));
  }
  pre.append(text.slice(0, start), mark, text.slice(end));
  body.replaceChildren(pre);
  note.textContent = !doc.current
    ? "The file changed since it was indexed: the highlight may be off. Upload or ingest it again."
    : inside ? `The evidence is characters ${evidence.start}–${evidence.end}, inside the highlighted passage.`
    : `The highlighted passage is characters ${start}–${end} of ${text.length}.`;
  (inside ? pre.querySelector("#evidence") : mark).scrollIntoView({ block: "center" });
}

async function showPdf(source, body, note) {
  // Fetched with the key, then shown from a blob: URL, since the browser's
  // PDF viewer could not send the key itself.
  const blob = await (await call(inCollection(`/v1/documents/${encodeURIComponent(source.doc_id)}/file`))).blob();
  pdfUrl = URL.createObjectURL(blob);
  const page = source.page || 1;
  const frame = node("iframe", "pdf");
  frame.title = `${source.source}, page ${page}`;
  frame.src = `${pdfUrl}#page=${page}`;
  frame.dataset.type = blob.type;
  frame.dataset.bytes = String(blob.size);
  const link = node("a", "", `Open page ${page} in a new tab`);
  link.href = frame.src;
  link.target = "_blank";
  link.rel = "noopener";
  body.replaceChildren(frame);
  note.replaceChildren(`Page ${page} of the PDF, in the browser's own viewer. `, link);
}
