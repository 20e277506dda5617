// Audit log: every change made through the admin API or the CLI, newest first, with the
// changed fields before and after (secrets masked by the server).

import { api, query } from "../api.js";
import { empty, field, fmt, h, pageHeader, table } from "../ui.js";

const PAGE = 100;

export async function render() {
  const events = await api("/audit" + query({ limit: PAGE }));
  const page = h("div", { class: "page" }, pageHeader("Audit log", "Who changed what, and when. Secrets are masked."));
  if (!events.length) {
    page.append(empty("No changes yet", "Every change made here or with the CLI is listed."));
    return page;
  }
  const search = h("input", { type: "search", placeholder: "Actor, action or target", autocomplete: "off" });
  const holder = h("div");
  const shown = [...events];
  const more = h("button", { class: "button", type: "button" }, "Older events");
  const draw = () => {
    const words = search.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    const rows = shown.filter((e) => words.every((w) => `${e.actor} ${e.action} ${e.target}`.toLowerCase().includes(w)));
    holder.replaceChildren(rows.length ? eventTable(rows) : empty("No event matches"));
  };
  more.addEventListener("click", async () => {
    more.disabled = true;
    const older = await api("/audit" + query({ limit: PAGE, before: shown[shown.length - 1].at }));
    shown.push(...older);
    more.hidden = older.length < PAGE;
    more.disabled = false;
    draw();
  });
  more.hidden = events.length < PAGE;
  search.addEventListener("input", draw);
  draw();
  page.append(h("div", { class: "toolbar" }, field("Filter", search)), holder, h("div", { class: "center" }, more));
  return page;
}

function eventTable(rows) {
  return table([
    { label: "When", render: (e) => h("time", { datetime: new Date(e.at * 1000).toISOString(), title: fmt.date(e.at) }, fmt.ago(e.at)) },
    { label: "Actor", render: (e) => h("strong", {}, e.actor) },
    { label: "Action", render: (e) => h("span", { class: "mono small" }, e.action) },
    { label: "Target", render: (e) => h("span", { class: "mono small" }, e.target) },
    { label: "Change", render: change },
  ], rows, { caption: "Audit events" });
}

function show(value, name = "") {
  if (value === null || value === undefined) return "–";
  if (name.endsWith("_at") && typeof value === "number") return fmt.date(value);
  return typeof value === "object" ? JSON.stringify(value) : String(value);
}

function fields(values, before) {
  return h("dl", { class: "diff" }, Object.keys(values).map((name) => [
    h("dt", {}, name),
    h("dd", {}, before ? [h("del", {}, show(before[name], name)), " → "] : null, h("ins", {}, show(values[name], name))),
  ]));
}

// A change in a line or two: what was created or removed (its fields folded away), or the
// fields that changed, before → after.
function change(e) {
  if (!e.before && !e.after) return h("span", { class: "muted" }, "–");
  if (!e.before || !e.after) {
    const values = e.after || e.before;
    return h("details", { class: "fold" }, h("summary", {}, e.after ? "created" : "removed", h("span", { class: "muted" }, ` · ${Object.keys(values).length} fields`)), fields(values));
  }
  return fields(e.after, e.before);
}
