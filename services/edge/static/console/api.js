// The console's only way to the edge: every call carries the API key as a Bearer
// header. The key lives in sessionStorage, so it dies with the tab.

const KEY = "switchyard.console.key";

export class ApiError extends Error {
  // `error` is the edge's OpenAI-shaped error object {message, type, code, request_id}.
  constructor(status, error, retryAfter) {
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.error = error;
    this.retryAfter = retryAfter;
  }
}

export const apiKey = () => sessionStorage.getItem(KEY);
export const forgetKey = () => sessionStorage.removeItem(KEY);

async function send(path, { method = "GET", body, signal } = {}) {
  const headers = { Authorization: `Bearer ${apiKey() || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) throw await errorOf(response);
  return response;
}

async function errorOf(response) {
  let error = { message: `HTTP ${response.status} ${response.statusText}`, type: "http_error" };
  try {
    const parsed = await response.json();
    if (parsed && parsed.error) error = parsed.error;
  } catch {
    // not JSON (a proxy's page): keep the status line
  }
  return new ApiError(response.status, error, response.headers.get("Retry-After"));
}

export async function getJson(path, signal) {
  return (await send(path, { signal })).json();
}

export async function postJson(path, body) {
  return (await send(path, { method: "POST", body })).json();
}

// POST `body` and yield the server-sent events: parsed JSON objects, then "[DONE]".
// EventSource cannot send headers or a body, hence fetch and a stream reader.
export async function* streamEvents(path, body, signal) {
  const response = await send(path, { method: "POST", body, signal });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data: "))
        .map((l) => l.slice(6)).join("\n");
      if (!data) continue; // a keep-alive comment
      yield data === "[DONE]" ? data : JSON.parse(data);
    }
  }
}

// Show the login card until a key authenticates; `onReady(fleetStatus)` then runs.
// GET /v1/fleet doubles as "who am I": it answers with the key's tenant.
export function signIn(onReady) {
  const $ = (id) => document.getElementById(id);
  const showLogin = (message) => {
    $("app").hidden = true;
    $("login").hidden = false;
    $("whoami").hidden = $("logout").hidden = true;
    $("login-error").hidden = !message;
    $("login-error").textContent = message || "";
    $("api-key").focus();
  };
  const check = async () => {
    try {
      const status = await getJson("/v1/fleet");
      $("login").hidden = true;
      $("app").hidden = false;
      $("whoami").textContent = `tenant ${status.tenant}${status.operator ? " (operator)" : ""}`;
      $("whoami").hidden = $("logout").hidden = false;
      onReady(status);
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) forgetKey();
      showLogin(err.message);
    }
  };
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, $("api-key").value.trim());
    $("api-key").value = "";
    check();
  });
  $("logout").addEventListener("click", () => {
    forgetKey();
    location.reload();
  });
  if (apiKey()) check();
  else showLogin();
}

// A DOM element with text (never HTML: everything shown comes from the network).
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}
