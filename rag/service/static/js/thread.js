// The thread of questions and answers: a turn shows its question, its answer
// as it streams in (plain text, appended piece by piece), then the finished
// answer with its citations [n] linked to the numbered sources below it.
// Does not: ask anything; ask.js and sessions.js fill it.

import { $, button, node } from "./dom.js";
import { openSource } from "./viewer.js";

export function clearThread() { $("thread").replaceChildren(); }

/** A new turn for `question`, at the end of the thread; its answer streams into `.text`. */
export function newTurn(question, number = null) {
  const el = node("article", "turn");
  el.dataset.state = "streaming";
  el.setAttribute("aria-busy", "true");
  const q = node("p", "question", question);
  if (number) q.prepend(node("span", "turn-number", `${number}.`), " ");
  const answer = node("div", "answer-text");
  const text = document.createTextNode("");
  answer.append(text);
  el.append(q, answer);
  $("thread").append(el);
  return { el, answer, text, pieces: 0 };
}

/** Show the evidence (sentences of the prompt's passages that answer, found without the
 * model) above the answer, as soon as it is known; with `sources`, each opens its source
 * at the sentence. */
export function showEvidence(turn, evidence, sources = null) {
  turn.evidence?.remove();
  if (!evidence || !evidence.length) return;
  const box = node("blockquote", "evidence");
  box.setAttribute("aria-label", "Evidence");
  for (const e of evidence) {
    const line = node("p", "evidence-line");
    const label = `[${e.passage}] ${e.source}${e.about ? ` — ${e.about.split(/\s+/).join(" ")}` : ""}`;
    const source = sources ? sources[e.passage - 1] : null;
    line.append(source ? button(label, "evidence-link", () => openSource(source, e.passage, e),
                                `Open source ${e.passage} at this sentence`)
                       : node("span", "evidence-where", label),
                node("q", "", e.text.split(/\s+/).join(" ")));
    box.append(line);
  }
  turn.answer.before(box);
  turn.evidence = box;
}

/** Show `answer` (the /v1/ask object) whole: citations linked, sources listed. */
export function finishTurn(turn, answer, onWhy = null) {
  turn.el.dataset.state = "done";
  turn.el.removeAttribute("aria-busy");
  showEvidence(turn, answer.evidence, answer.sources);
  renderCited(turn.answer, answer.answer, answer.sources);
  turn.el.append(sourceList(answer.sources));
  if (onWhy) turn.el.append(button("Why it was fast", "quiet small why-button", () => onWhy()));
}

export function failTurn(turn, message) {
  turn.el.dataset.state = "failed";
  turn.el.removeAttribute("aria-busy");
  const line = node("p", "error", message);
  line.setAttribute("role", "alert");
  turn.el.append(line);
}

/** A stored turn of a conversation (GET /v1/sessions/{id}). */
export function storedTurn(t) {
  const turn = newTurn(t.question, t.number);
  finishTurn(turn, { answer: t.answer, sources: t.sources });
  return turn;
}

function renderCited(container, text, sources) {
  container.replaceChildren();
  if (!text) {
    container.append(node("span", "muted", "(the model gave no text)"));
    return;
  }
  let last = 0;
  for (const m of text.matchAll(/\[(\d+)\]/g)) {
    const n = Number(m[1]), source = sources[n - 1];
    if (!source) continue;
    container.append(text.slice(last, m.index));
    container.append(button(`[${n}]`, "cite", () => openSource(source, n), `source ${n}: ${source.source}`));
    last = m.index + m[0].length;
  }
  container.append(text.slice(last));
}

function sourceList(sources) {
  const list = node("ol", "sources");
  list.setAttribute("aria-label", "Sources");
  sources.forEach((s, i) => {
    const li = node("li");
    const where = s.source + (s.page ? `, page ${s.page}` : "");
    li.append(button(where, "source-link", () => openSource(s, i + 1), `Open source ${i + 1}: ${where}`),
              node("span", "score", ` score ${Number(s.score).toFixed(2)}`));
    list.append(li);
  });
  return list;
}
