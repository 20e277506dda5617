// Subjects and budgets: who owns which keys, what each spent today and this month, and
// progress bars of spend against budget, each with its burn rate and when it runs out at
// that rate; set or remove a budget.

import { api } from "../api.js";
import { confirmDialog, empty, field, fmt, formError, h, meter, openDialog, pageHeader, pagedTable, table, toast } from "../ui.js";

const USD = ["daily_usd", "monthly_usd"];
const COUNTS = ["daily_tokens", "monthly_tokens", "tokens_per_minute", "max_output_tokens"];
const LABELS = {
  daily_usd: "Daily budget (USD)", monthly_usd: "Monthly budget (USD)", daily_tokens: "Daily tokens",
  monthly_tokens: "Monthly tokens", tokens_per_minute: "Tokens per minute", max_output_tokens: "Max output tokens per request",
};

export async function render() {
  // Subjects come with their budgets and spend; key budgets are asked for on their own.
  const [subjects, keyBudgets] = await Promise.all([api("/subjects?keys=false"), api("/budgets?scope=key")]);
  const page = h("div", { class: "page" });
  const keyBudget = h("button", { class: "button", type: "button", onclick: pickKey }, "Set a key's budget");
  page.append(pageHeader("Subjects & budgets", "Spend against budget, per subject (a team or user) and per key. Days and months are UTC.", keyBudget));
  if (!subjects.length) {
    page.append(empty("No subjects yet", "A subject appears with its first key, or its first JWT caller."));
  } else {
    page.append(h("section", { class: "section" }, h("h2", {}, "Subjects"), pagedTable([
      { label: "Subject", render: (s) => h("strong", {}, s.subject_id) },
      { label: "Active keys", class: "num", render: (s) => `${s.active_key_count} / ${s.key_count}` },
      { label: "Today", class: "num", render: (s) => fmt.usd(s.spend_today_usd) },
      { label: "This month", class: "num", render: (s) => fmt.usd(s.spend_month_usd) },
      { label: "Budget", class: "meters", render: (s) => meters(s.budget) },
      { label: "Actions", class: "actions", render: (s) => budgetButtons("subject", s.subject_id, s.subject_id, s.budget) },
    ], subjects, { caption: "Subjects" }).element));
  }
  page.append(h("section", { class: "section" }, h("h2", {}, "Key budgets"), keyBudgets.length
    ? table([
      { label: "Key", render: (b) => b.label },
      { label: "Today", class: "num", render: (b) => fmt.usd(b.spent_today_usd) },
      { label: "This month", class: "num", render: (b) => fmt.usd(b.spent_month_usd) },
      { label: "Budget", class: "meters", render: meters },
      { label: "Actions", class: "actions", render: (b) => budgetButtons("key", b.scope_id, b.label, b) },
    ], keyBudgets, { caption: "Key budgets" })
    : empty("No key has a budget of its own", "A key without one draws on its subject's budget.")));
  return page;
}

function meters(b) {
  if (!b) return h("span", { class: "muted" }, "no budget");
  const bars = [];
  if (b.daily_usd !== null) bars.push(meter("Today", Number(b.spent_today_usd), Number(b.daily_usd), fmt.usd), burnLine(b, "daily_usd"));
  if (b.monthly_usd !== null) bars.push(meter("This month", Number(b.spent_month_usd), Number(b.monthly_usd), fmt.usd), burnLine(b, "monthly_usd"));
  if (b.daily_tokens !== null) bars.push(meter("Tokens today", b.tokens_today, b.daily_tokens, fmt.compact), burnLine(b, "daily_tokens"));
  if (b.monthly_tokens !== null) bars.push(meter("Tokens this month", b.tokens_month, b.monthly_tokens, fmt.compact), burnLine(b, "monthly_tokens"));
  const limits = [];
  if (b.tokens_per_minute !== null) limits.push(`${fmt.int(b.tokens_per_minute)} tokens/min`);
  if (b.max_output_tokens !== null) limits.push(`max ${fmt.int(b.max_output_tokens)} output tokens (${b.over_cap})`);
  if (b.stop_streams_at_budget) limits.push("streams stop at budget");
  return h("div", { class: "meters-cell" }, bars.length ? bars : null, limits.length ? h("p", { class: "muted small" }, limits.join(" · ")) : null,
    !bars.length && !limits.length ? h("span", { class: "muted" }, "no limits set") : null);
}

// "$0.42/h · runs out 2026-12-03 18:40Z": the limit's spend per hour so far in its window,
// and when the rest is gone at that rate (or that it is not, before the window starts over).
function burnLine(b, name) {
  const rate = b.burn?.[name];
  if (!rate) return null;
  const usd = name.endsWith("_usd");
  const perHour = usd ? `${fmt.usd(rate.per_hour)}/h` : `${fmt.compact(rate.per_hour)} tokens/h`;
  const window = name.startsWith("daily") ? "today" : "this month";
  const ends = rate.exhausted ? "spent" : rate.runs_out_at ? `runs out ${fmt.date(rate.runs_out_at)}` : `does not run out ${window}`;
  return h("p", { class: "muted small burn", dataset: { limit: name } }, `${perHour} · ${ends}`);
}

function budgetButtons(scope, id, label, current) {
  return h("div", { class: "button-row" },
    h("button", { class: "button small", type: "button", "aria-label": `${current ? "Edit" : "Set"} the budget of ${label}`, onclick: () => budgetDialog(scope, id, label, current) }, current ? "Edit budget" : "Set budget"),
    current ? h("button", { class: "button small danger", type: "button", "aria-label": `Remove the budget of ${label}`, onclick: () => removeBudget(scope, id, label) }, "Remove") : null);
}

function reload() {
  window.dispatchEvent(new HashChangeEvent("hashchange"));
}

async function removeBudget(scope, id, label) {
  if (!(await confirmDialog("Remove this budget?", `${label} will have no limits of its own.`, "Remove budget"))) return;
  try {
    await api(`/budgets/${scope}/${encodeURIComponent(id)}`, { method: "DELETE" });
    toast(`Budget of ${label} removed.`);
    reload();
  } catch (error) {
    toast(error.message, "error");
  }
}

async function pickKey() {
  let keys;
  try {
    keys = await api("/keys"); // asked for when needed: a thousand keys are not free
  } catch (error) {
    return toast(error.message, "error");
  }
  const live = keys.filter((k) => k.state !== "revoked");
  if (!live.length) return toast("There is no key to give a budget.", "error");
  const select = h("select", {}, live.map((k) => h("option", { value: k.id }, `${k.name} (${k.prefix}…)`)));
  const next = h("button", { class: "button primary", type: "button" }, "Next");
  const dialog = openDialog("Set a key's budget", field("Key", select), { actions: [next] });
  next.addEventListener("click", () => {
    const key = live.find((k) => k.id === select.value);
    dialog.close();
    budgetDialog("key", key.id, `${key.name} (${key.prefix}…)`, null);
  });
}

function budgetDialog(scope, id, label, current) {
  const inputs = {};
  for (const name of USD) inputs[name] = h("input", { name, inputmode: "decimal", pattern: "\\d+(\\.\\d+)?", placeholder: "no limit", value: current?.[name] ?? "" });
  for (const name of COUNTS) inputs[name] = h("input", { name, type: "number", min: "1", placeholder: "no limit", value: current?.[name] ?? "" });
  const overCap = h("select", { name: "over_cap" }, h("option", { value: "clamp" }, "Lower it to the cap"), h("option", { value: "reject" }, "Refuse the request (400)"));
  overCap.value = current?.over_cap || "clamp";
  const stop = h("input", { type: "checkbox", name: "stop", checked: Boolean(current?.stop_streams_at_budget) });
  const form = h("form", { class: "form", id: "budget-form", novalidate: true },
    h("div", { class: "field-row" }, field(LABELS.daily_usd, inputs.daily_usd), field(LABELS.monthly_usd, inputs.monthly_usd)),
    h("div", { class: "field-row" }, field(LABELS.daily_tokens, inputs.daily_tokens), field(LABELS.monthly_tokens, inputs.monthly_tokens)),
    h("div", { class: "field-row" }, field(LABELS.tokens_per_minute, inputs.tokens_per_minute), field(LABELS.max_output_tokens, inputs.max_output_tokens)),
    field("A max_tokens above the cap", overCap),
    h("label", { class: "check" }, stop, " End a stream when its spend reaches the budget"));
  const submit = h("button", { class: "button primary", type: "submit", form: "budget-form" }, "Save budget");
  const dialog = openDialog(`Budget of ${label}`, form, { wide: true, actions: [h("button", { class: "button", type: "button", onclick: () => dialog.close() }, "Cancel"), submit] });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { over_cap: overCap.value, stop_streams_at_budget: stop.checked };
    for (const name of USD) body[name] = inputs[name].value.trim() || null;
    for (const name of COUNTS) body[name] = inputs[name].value ? Number(inputs[name].value) : null;
    submit.disabled = true;
    try {
      await api(`/budgets/${scope}/${encodeURIComponent(id)}`, { method: "PUT", body });
      dialog.close();
      toast(`Budget of ${label} saved.`);
      reload();
    } catch (error) {
      submit.disabled = false;
      formError(form, error);
    }
  });
}
