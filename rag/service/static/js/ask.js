// The question form: the answer streams into the thread as it is generated;
// when it is whole, its citations are linked and its costs drawn. The time
// to first token as the page sees it runs from the submit to the frame that
// first shows streamed text (performance.now()). A question asked while the
// page's first uploads are still being indexed says so and follows their
// progress until the answer starts (the server waits for them).
// Does not: draw costs (costs.js) or keep sessions (sessions.js).

import { ApiError, ask } from "./api.js";
import { refreshProfile, showCosts } from "./costs.js";
import { hasDocuments, onUploadsChange, uploadsInFlight, uploadsSettled } from "./documents.js";
import { $, node } from "./dom.js";
import { shown } from "./notice.js";
import { refreshSessions, sessionForAsk } from "./sessions.js";
import { clearThread, failTurn, finishTurn, newTurn, showEvidence } from "./thread.js";


/** Resolves to ms from `t0` to the frame showing the first text; the time
 *  it was put in the page if no frame comes (a hidden tab draws none). */
function firstFrame(t0) {
  const inserted = performance.now() - t0;
  return new Promise((resolve) => {
    requestAnimationFrame(() => resolve(performance.now() - t0));
    setTimeout(() => resolve(inserted), 500);
  });
}

/** A line in `turn` saying which of this page's uploads the question waits
 *  for, with their progress, kept up to date; returns what removes it. */
function showWaiting(turn) {
  const line = node("p", "muted small waiting");
  line.setAttribute("role", "status");
  const update = () => {
    const uploads = uploadsInFlight();
    line.textContent = uploads.length
      ? `Waiting for ${uploads.map((u) => `${u.name} (${u.state})`).join(", ")} to be indexed…`
      : "Indexed; answering…";
  };
  update();
  const stop = onUploadsChange(update);
  turn.answer.before(line);
  return () => { stop(); line.remove(); };
}

// The server found no document yet, or gave up waiting for one, while this page still uploads some.
const beforeTheFirstDocument = (err) => err instanceof ApiError
  && (err.type === "no_documents" || err.type === "indexing") && uploadsInFlight().length > 0;

async function submit(event) {
  event.preventDefault();
  const started = performance.now();
  const question = $("question").value.trim();
  if (!question) return;
  const target = parseFloat($("target").value), maxTokens = parseInt($("max-tokens").value, 10);
  const session = sessionForAsk();
  if (!session) clearThread();
  const turn = newTurn(question);
  const button = $("ask-button");
  button.disabled = true;
  let painted = null;
  let stopWaiting = !hasDocuments() && uploadsInFlight().length ? showWaiting(turn) : null;
  const begun = () => { if (stopWaiting) { stopWaiting(); stopWaiting = null; } };
  try {
    const body = { question, session: session || undefined,
                   target_ttft_s: Number.isFinite(target) && target > 0 ? target : undefined,
                   max_tokens: Number.isInteger(maxTokens) && maxTokens > 0 ? maxTokens : undefined };
    const send = () => ask(body, (piece) => {
      begun();
      turn.text.appendData(piece);
      turn.pieces += 1;
      if (!painted) painted = firstFrame(started);
    }, undefined, (evidence) => { begun(); showEvidence(turn, evidence); });
    let answer;
    try {
      answer = await send();
    } catch (err) {
      if (!beforeTheFirstDocument(err)) throw err;
      if (!stopWaiting) stopWaiting = showWaiting(turn);
      await uploadsSettled(); // then once more: the server has the index by now, or says why not
      answer = await send();
    }
    begun();
    const pageTtftMs = painted ? await painted : null;
    turn.el.dataset.pieces = String(turn.pieces);
    if (pageTtftMs !== null) turn.el.dataset.pageTtftMs = pageTtftMs.toFixed(1);
    turn.el.dataset.apiTtftMs = (answer.timings.ttft_s * 1000).toFixed(1);
    finishTurn(turn, answer, () => showCosts(answer, pageTtftMs));
    showCosts(answer, pageTtftMs);
    $("question").value = "";
    // What the answer changed: the cost model learned from it, a session grew.
    Promise.all([shown(refreshProfile()), session ? shown(refreshSessions()) : null])
      .then(() => { turn.el.dataset.settled = "true"; });
  } catch (err) {
    begun();
    failTurn(turn, err.message);
  } finally {
    button.disabled = false;
    $("question").focus();
  }
}

export function setUpAsk() {
  const form = $("ask-form");
  form.addEventListener("submit", submit);
  $("question").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      if (!$("ask-button").disabled) form.requestSubmit();
    }
  });
}
