// The question form: the answer streams into the thread as it is generated;
// when it is whole, its citations are linked and its costs drawn. The time
// to first token as the page sees it runs from the submit to the frame that
// first shows streamed text (performance.now()).
// Does not: draw costs (costs.js) or keep sessions (sessions.js).

import { ask } from "./api.js";
import { refreshProfile, showCosts } from "./costs.js";
import { $ } from "./dom.js";
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
  try {
    const body = { question, session: session || undefined,
                   target_ttft_s: Number.isFinite(target) && target > 0 ? target : undefined,
                   max_tokens: Number.isInteger(maxTokens) && maxTokens > 0 ? maxTokens : undefined };
    const answer = await ask(body, (piece) => {
      turn.text.appendData(piece);
      turn.pieces += 1;
      if (!painted) painted = firstFrame(started);
    }, undefined, (evidence) => showEvidence(turn, evidence));
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
