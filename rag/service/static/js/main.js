// The page's wiring: the key dialog, each panel, and what loads first.
// Does not: hold state of its own; each module keeps its part.

import { onKeyNeeded, storedKey, storeKey } from "./api.js";
import { setUpAsk } from "./ask.js";
import { refreshCollections, setUpCollections } from "./collections.js";
import { refreshProfile } from "./costs.js";
import { refreshDocuments, setUpDocuments } from "./documents.js";
import { $ } from "./dom.js";
import { notify, shown } from "./notice.js";
import { refreshSessions, setUpSessions } from "./sessions.js";
import { setUpViewer } from "./viewer.js";

let keyWaiters = [];

function askForKey() {
  const dialog = $("key-dialog"), input = $("key-input");
  input.value = storedKey();
  if (!dialog.open) dialog.showModal();
  input.focus();
  return new Promise((resolve) => keyWaiters.push(resolve));
}

function setUpKey() {
  onKeyNeeded(askForKey);
  $("key-button").addEventListener("click", () => { askForKey().then(loadAll); });
  $("key-form").addEventListener("submit", () => storeKey($("key-input").value.trim()));
  // Closed by the form or by Escape: the calls waiting go on with what is stored.
  $("key-dialog").addEventListener("close", () => {
    const waiters = keyWaiters;
    keyWaiters = [];
    waiters.forEach((resolve) => resolve(storedKey()));
  });
  $("key-forget").addEventListener("click", () => {
    storeKey("");
    $("key-input").value = "";
  });
}

// One call first: without a key it is the only one refused (the server
// limits refused keys per address) and the key is asked for once.
async function loadAll() {
  notify("");
  await shown(refreshDocuments());
  shown(refreshCollections());
  shown(refreshSessions());
  shown(refreshProfile());
}

setUpKey();
setUpDocuments();
setUpViewer();
setUpAsk();
setUpSessions();
setUpCollections(loadAll);
$("profile-refresh").addEventListener("click", () => shown(refreshProfile()));
loadAll();
