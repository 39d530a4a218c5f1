// Conversations: the stored sessions (continue one: its turns are shown and
// the next question goes on from them; reset one: it is forgotten), and
// which session the ask form uses.
// Does not: ask questions (ask.js does, with sessionForAsk()).

import { ApiError, deleteJson, getJson, inCollection } from "./api.js";
import { $, button, node, plural } from "./dom.js";
import { shown } from "./notice.js";
import { clearThread, storedTurn } from "./thread.js";

function newId() {
  const bytes = crypto.getRandomValues(new Uint8Array(6));
  return "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function ensureOption(id) {
  const select = $("session-select");
  if (![...select.options].some((o) => o.value === id)) {
    const option = node("option", "", `continue ${id}`);
    option.value = id;
    select.append(option);
  }
}

/** The session the next question belongs to (null: none), a new id when asked for one. */
export function sessionForAsk() {
  const select = $("session-select");
  if (select.value !== "new") return select.value || null;
  const id = newId();
  ensureOption(id);
  select.value = id;
  clearThread();
  return id;
}

export async function refreshSessions() {
  const { sessions } = await getJson(inCollection("/v1/sessions"));
  $("sessions-empty").hidden = sessions.length > 0;
  $("session-list").replaceChildren(...sessions.map(sessionItem));
  for (const s of sessions) ensureOption(s.session);
  const select = $("session-select");
  for (const option of [...select.options]) {
    if (option.value && option.value !== "new" && option.value !== select.value &&
        !sessions.some((s) => s.session === option.value)) option.remove();
  }
}

function sessionItem(s) {
  const li = node("li");
  li.dataset.session = s.session;
  const when = new Date(s.updated * 1000).toLocaleString();
  li.append(node("span", "session-name", s.session), node("span", "muted small", ` ${plural(s.turns, "turn")}, ${when}`),
            button("Continue", "small", () => shown(continueSession(s.session)), `Continue ${s.session}`),
            button("Reset", "quiet small", () => shown(resetSession(s.session, li)), `Reset ${s.session}`));
  return li;
}

/** Show the turns of `id` and make the next question continue it. */
export async function continueSession(id) {
  ensureOption(id);
  $("session-select").value = id;
  clearThread();
  try {
    const conversation = await getJson(inCollection(`/v1/sessions/${encodeURIComponent(id)}`));
    if (conversation.folded) {
      $("thread").append(node("p", "muted small",
                              `${plural(conversation.folded, "earlier turn")}, summarised: ${conversation.summary}`));
    }
    conversation.turns.forEach(storedTurn);
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 404)) throw err;
  }
  $("question").focus();
}

async function resetSession(id, li) {
  try {
    await deleteJson(inCollection(`/v1/sessions/${encodeURIComponent(id)}`));
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 404)) throw err;
  }
  if ($("session-select").value === id) {
    $("session-select").value = "";
    clearThread();
  }
  li.remove();
  await refreshSessions();
}

export function setUpSessions() {
  $("session-select").addEventListener("change", (e) => {
    const value = e.target.value;
    if (value && value !== "new") shown(continueSession(value));
    else clearThread();
  });
}
