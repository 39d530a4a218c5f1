// The thread of questions and answers: a turn shows its question, its answer
// as it streams in (plain text, appended piece by piece), then the finished
// answer with its citations [n] linked to the numbered sources below it.
// Does not: ask anything; ask.js and sessions.js fill it.

import { openSource } from "./viewer.js";

const $ = (id) => document.getElementById(id);

export function clearThread() { $("thread").replaceChildren(); }

function node(tag, className, text) {
  const n = document.createElement(tag);
  if (className) n.className = className;
  if (text !== undefined) n.textContent = text;
  return n;
}

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

/** Show `answer` (the /v1/ask object) whole: citations linked, sources listed. */
export function finishTurn(turn, answer, onWhy = null) {
  turn.el.dataset.state = "done";
  turn.el.removeAttribute("aria-busy");
  renderCited(turn.answer, answer.answer, answer.sources);
  turn.el.append(sourceList(answer.sources));
  if (onWhy) {
    const why = node("button", "quiet small why-button", "Why it was fast");
    why.type = "button";
    why.addEventListener("click", () => onWhy());
    turn.el.append(why);
  }
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
    const cite = node("button", "cite", `[${n}]`);
    cite.type = "button";
    cite.setAttribute("aria-label", `source ${n}: ${source.source}`);
    cite.addEventListener("click", () => openSource(source, n));
    container.append(cite);
    last = m.index + m[0].length;
  }
  container.append(text.slice(last));
}

function sourceList(sources) {
  const list = node("ol", "sources");
  list.setAttribute("aria-label", "Sources");
  sources.forEach((s, i) => {
    const li = node("li");
    const open = node("button", "source-link", s.source + (s.page ? `, page ${s.page}` : ""));
    open.type = "button";
    open.setAttribute("aria-label", `Open source ${i + 1}: ${s.source}${s.page ? `, page ${s.page}` : ""}`);
    open.addEventListener("click", () => openSource(s, i + 1));
    li.append(open, node("span", "score", ` score ${Number(s.score).toFixed(2)}`));
    list.append(li);
  });
  return list;
}
