// One line at the top of the page for what went wrong outside any panel.
// Does not: log anything anywhere else.

export function notify(message) {
  const line = document.getElementById("notice");
  line.textContent = message;
  line.hidden = !message;
}

/** `promise`, its failure shown as the notice instead of lost. */
export function shown(promise) {
  return Promise.resolve(promise).catch((err) => notify(err.message || String(err)));
}
