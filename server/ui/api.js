// Calls to the gateway's own API with the keys typed into the page. Keys live in this tab's
// sessionStorage only: never localStorage, a cookie or a URL.

const STORE = { admin: "raygate.adminKey", api: "raygate.apiKey" };

export function getKey(kind) {
  return sessionStorage.getItem(STORE[kind]) || "";
}

export function setKey(kind, value) {
  if (value) sessionStorage.setItem(STORE[kind], value);
  else sessionStorage.removeItem(STORE[kind]);
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// The error body is OpenAI's ({"error": {"message"}}); anything else falls back to the status.
async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = `${response.status}: ${body.error.message}`;
  } catch (_) {
    /* not JSON: keep the status line */
  }
  return new ApiError(response.status, message);
}

// kind: "admin" for /admin, "api" for /v1. Returns the fetch Response for streams (raw: true).
export async function call(kind, path, { method = "GET", body, raw = false, signal } = {}) {
  const headers = {};
  const key = getKey(kind);
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    credentials: "omit",
  });
  if (!response.ok) throw await errorOf(response);
  return raw ? response : response.json();
}

// Server-sent events from a fetch body: yields each `data:` payload parsed as JSON until [DONE].
export async function* sse(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of frame.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

// A page's refresh run now and then every `ms` while the page is shown: one timer per page, so the
// `start`/`stop` that app.js calls on a tab change never leave a second one behind.
export function poller(refresh, ms) {
  let timer = null;
  const stop = () => {
    clearInterval(timer);
    timer = null;
  };
  const start = () => {
    stop();
    refresh();
    timer = setInterval(refresh, ms);
  };
  return { start, stop };
}
