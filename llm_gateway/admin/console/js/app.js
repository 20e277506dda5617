// The console's shell: sign-in, navigation (hash routes, so the static files need no
// server-side routing), and one page at a time in <main>. Each page says when it has
// rendered its data (performance mark "llmg:ready", body[data-ready]); the browser test
// measures load time against it.

import { api, session, whenUnauthorized } from "./api.js";
import { failure, loading } from "./ui.js";
import * as overview from "./pages/overview.js";
import * as keys from "./pages/keys.js";
import * as budgets from "./pages/budgets.js";
import * as routes from "./pages/routes.js";
import * as usage from "./pages/usage.js";
import * as audit from "./pages/audit.js";

const PAGES = { overview, keys, budgets, routes, usage, audit };
const $ = (id) => document.getElementById(id);
let leaving = [];
let rendering = 0;

function showSignin(message) {
  session.clear();
  $("shell").hidden = true;
  $("signin").hidden = false;
  const error = $("signin-error");
  error.hidden = !message;
  error.textContent = message || "";
  $("signin-token").focus();
  markReady("signin");
}

async function signIn(event) {
  event.preventDefault();
  const token = $("signin-token").value.trim();
  if (!token) return showSignin("Enter an admin token.");
  try {
    const me = await api("/me", { token });
    session.set(token);
    $("signin-token").value = "";
    startShell(me);
  } catch (error) {
    showSignin(error.status === 401 ? "That token is not a valid admin token." : error.message);
  }
}

function startShell(me) {
  $("signin").hidden = true;
  $("shell").hidden = false;
  if (me) $("whoami").textContent = me.name;
  if (!location.hash) location.replace("#/overview");
  route();
}

function markReady(page) {
  document.body.dataset.ready = page;
  performance.mark("llmg:ready", { detail: page });
}

async function route() {
  if (!session.token) return;
  const name = (location.hash.replace(/^#\/?/, "").split("?")[0] || "overview");
  const page = PAGES[name] || overview;
  for (const stop of leaving) stop();
  leaving = [];
  delete document.body.dataset.ready;
  for (const link of document.querySelectorAll("#nav a")) {
    if (link.dataset.page === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  closeMenu();
  const main = $("main");
  const ticket = ++rendering;
  main.replaceChildren(loading());
  const ctx = { onLeave: (stop) => leaving.push(stop), current: () => ticket === rendering };
  try {
    const content = await page.render(ctx);
    if (ticket !== rendering) return;
    main.replaceChildren(content);
    document.title = `${main.querySelector("h1")?.textContent || "Admin"} · llm-gateway`;
    markReady(name);
  } catch (error) {
    if (ticket !== rendering || error.status === 401) return;
    main.replaceChildren(failure(error, route));
    markReady(name);
  }
}

function closeMenu() {
  $("nav").classList.remove("open");
  $("menu-toggle").setAttribute("aria-expanded", "false");
}

function boot() {
  whenUnauthorized((message) => showSignin(`Signed out: ${message}`));
  $("signin-form").addEventListener("submit", signIn);
  $("signout").addEventListener("click", () => showSignin());
  $("menu-toggle").addEventListener("click", () => {
    const open = $("nav").classList.toggle("open");
    $("menu-toggle").setAttribute("aria-expanded", String(open));
  });
  window.addEventListener("hashchange", () => {
    route();
    $("main").focus({ preventScroll: true });
  });
  if (!session.token) return showSignin();
  // The page's data and who we are, fetched together: a stale token answers 401 to both,
  // and either one shows the sign-in form.
  startShell(null);
  api("/me").then((me) => ($("whoami").textContent = me.name)).catch(() => {});
}

boot();
