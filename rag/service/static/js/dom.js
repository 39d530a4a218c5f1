// The few DOM helpers the panels share.
// Does not: hold state.

export const $ = (id) => document.getElementById(id);

/** A new element with a class and text (either may be left out). */
export function node(tag, className, text) {
  const n = document.createElement(tag);
  if (className) n.className = className;
  if (text !== undefined) n.textContent = text;
  return n;
}

/** A button that does `onClick`, named `label` for screen readers when given. */
export function button(text, className, onClick, label) {
  const b = node("button", className, text);
  b.type = "button";
  if (label) b.setAttribute("aria-label", label);
  b.addEventListener("click", onClick);
  return b;
}

/** "1 chunk", "2 chunks". */
export const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
