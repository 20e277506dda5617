// The admin API from the browser. The admin token lives in sessionStorage (gone when the
// tab closes) and travels in the Authorization header of each fetch, never in a cookie:
// a page on another origin cannot make the browser send it, so there is nothing for
// cross-site request forgery to ride on, and no CSRF token is needed.

const TOKEN = "llm-gateway-admin-token";
const BASE = "/admin/v1";

export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export const session = {
  get token() {
    return sessionStorage.getItem(TOKEN);
  },
  set(token) {
    sessionStorage.setItem(TOKEN, token);
  },
  clear() {
    sessionStorage.removeItem(TOKEN);
  },
};

let onUnauthorized = () => {};
export function whenUnauthorized(handler) {
  onUnauthorized = handler;
}

export async function api(path, { method = "GET", body, token } = {}) {
  const headers = { Accept: "application/json" };
  const bearer = token || session.token;
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(BASE + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: "no-store" });
  } catch {
    throw new ApiError(0, "The gateway's admin listener did not answer. Is it running?", "network");
  }
  if (response.status === 204) return null;
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const error = data && data.error ? data.error : { message: `HTTP ${response.status}`, code: null };
    if (response.status === 401 && !token) onUnauthorized(error.message);
    throw new ApiError(response.status, error.message, error.code);
  }
  return data;
}

export function query(params) {
  const pairs = Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== "");
  return pairs.length ? "?" + new URLSearchParams(pairs).toString() : "";
}
