// The service's API as the page uses it: the key (kept in this tab's
// session storage and sent with every call), JSON errors as exceptions,
// uploads with progress, and /v1/ask as server-sent events. A call the
// server refuses for now (429) is sent again after its Retry-After, a few
// times at most.
// Does not: touch the page; callers decide what to show.

const KEY = "rag-budget-api-key";
export const MOST_TRIES = 5; // a call refused 429 is sent at most this many times in all
const LONGEST_WAIT_S = 30; // a Retry-After longer than this is waited this long

export class ApiError extends Error {
  constructor(status, message, type, retryAfter = null) {
    super(message);
    this.status = status;
    this.type = type;
    this.retryAfter = retryAfter; // the server's Retry-After header, if it sent one
  }
}

/** Seconds to wait for a Retry-After header (seconds or an HTTP date): 1 to LONGEST_WAIT_S. */
export function retryDelay(header) {
  let seconds = Number(header);
  if (header == null || header === "" || !Number.isFinite(seconds)) {
    const when = Date.parse(header || "");
    seconds = Number.isFinite(when) ? (when - Date.now()) / 1000 : 1;
  }
  return Math.min(Math.max(seconds, 1), LONGEST_WAIT_S);
}

// Resolves after `seconds`, or rejects at once if `signal` aborts meanwhile.
function pause(seconds, signal) {
  return new Promise((resolve, reject) => {
    if (signal && signal.aborted) { reject(signal.reason); return; }
    const timer = setTimeout(resolve, seconds * 1000);
    if (signal) signal.addEventListener("abort", () => { clearTimeout(timer); reject(signal.reason); }, { once: true });
  });
}

let askForKey = async () => { throw new ApiError(401, "an API key is needed", "unauthorized"); };
let pendingKey = null;

/** Set how the page asks the user for a key: an async function returning it. */
export function onKeyNeeded(ask) { askForKey = ask; }

export function storedKey() { return sessionStorage.getItem(KEY) || ""; }
export function storeKey(key) {
  if (key) sessionStorage.setItem(KEY, key); else sessionStorage.removeItem(KEY);
}

function headers(extra = {}) {
  const key = storedKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

// One key prompt at a time, however many calls were refused meanwhile.
async function newKey() {
  if (!pendingKey) pendingKey = askForKey().finally(() => { pendingKey = null; });
  storeKey(await pendingKey);
}

async function failure(response) {
  let message = `${response.status} ${response.statusText}`, type = "http_error";
  try {
    const body = await response.json();
    if (body && body.error) ({ message, type } = body.error);
  } catch (_) { /* not JSON: keep the status line */ }
  return new ApiError(response.status, message, type, response.headers.get("Retry-After"));
}

/** fetch() with the key; on 401 asks for a key once and tries again; on 429
 * waits the Retry-After and tries again, MOST_TRIES times in all. */
export async function call(path, options = {}) {
  for (let attempt = 0, refused = 0; ; attempt++) {
    const response = await fetch(path, { ...options, headers: headers(options.headers) });
    if (response.status === 401 && attempt === 0) { await newKey(); continue; }
    if (response.status === 429 && ++refused < MOST_TRIES) {
      const wait = retryDelay(response.headers.get("Retry-After"));
      await response.body?.cancel();
      await pause(wait, options.signal);
      continue;
    }
    if (!response.ok) throw await failure(response);
    return response;
  }
}

let collection = "default";  // the collection the page shows: uploads go to it, questions draw on it

/** The collection the page shows. */
export function currentCollection() { return collection; }
/** Show `name` from now on (the caller reloads what the page lists). */
export function setCollection(name) { collection = name; }
/** `path` within the collection shown (its ?collection=; the default collection is the server's own default). */
export function inCollection(path) {
  if (collection === "default") return path;
  return `${path}${path.includes("?") ? "&" : "?"}collection=${encodeURIComponent(collection)}`;
}

export async function getJson(path) { return (await call(path)).json(); }
export async function deleteJson(path) { return (await call(path, { method: "DELETE" })).json(); }

/** POST one file to /v1/documents; progress(sent, total) while it uploads. */
export function upload(file, progress) {
  const send = () => new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", inCollection("/v1/documents"));
    for (const [k, v] of Object.entries(headers())) xhr.setRequestHeader(k, v);
    xhr.upload.onprogress = (e) => progress(e.loaded, e.lengthComputable ? e.total : file.size);
    xhr.onerror = () => reject(new ApiError(0, "the upload failed: no answer from the server", "network"));
    xhr.onload = () => {
      let body = null;
      try { body = JSON.parse(xhr.responseText); } catch (_) { /* below */ }
      if (xhr.status >= 200 && xhr.status < 300) resolve(body);
      else reject(new ApiError(xhr.status, body && body.error ? body.error.message : `${xhr.status}`,
                               body && body.error ? body.error.type : "http_error",
                               xhr.getResponseHeader("Retry-After")));
    };
    const form = new FormData();
    form.append("file", file, file.name);
    xhr.send(form);
  });
  const attempt = async (asked, refused) => {
    try {
      return await send();
    } catch (err) {
      if (err.status === 401 && !asked) { await newKey(); return attempt(true, refused); }
      if (err.status === 429 && refused + 1 < MOST_TRIES) {
        await pause(retryDelay(err.retryAfter));
        return attempt(asked, refused + 1);
      }
      throw err;
    }
  };
  return attempt(false, 0);
}

/** Ask a question with streaming: onEvidence(list) once the prompt is planned (before
 * the first token), onDelta(text) for each piece; resolves to the final answer. */
export async function ask(body, onDelta, signal, onEvidence = null) {
  const response = await call("/v1/ask", {
    method: "POST", signal, headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ...body, collection, stream: true }),
  });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
      if (!data) continue;
      const message = JSON.parse(data);
      if ("delta" in message) onDelta(message.delta);
      else if ("evidence" in message) { if (onEvidence) onEvidence(message.evidence); }
      else if ("answer" in message) return message.answer;
      else if ("error" in message) throw new ApiError(200, message.error.message, message.error.type);
    }
  }
  throw new ApiError(200, "the answer stream ended before its answer", "incomplete");
}
