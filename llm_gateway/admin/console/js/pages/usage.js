// Usage: the billing report, filtered by key, subject, model and time range; a chart of
// spend per day and a table grouped as chosen, downloadable as CSV.
// Filtering uses the report itself: the filtered dimensions are added to its grouping and
// the rows kept are those of the chosen values, so every figure (latency percentiles too)
// is the server's own for exactly that selection. A search box finds one request by the
// x-request-id or x-trace-id its client got. Beside the errors (admitted requests that
// failed), the requests the gateway refused before admission, by kind, for the same range,
// key and subject (a refusal has no model).

import { api, query } from "../api.js";
import { dayRange, seriesByName, stackedBars } from "../chart.js";
import { REFUSALS_EXPLAINED, byKind, costLegend, rowSpend, spend, totals as sums } from "../cost.js";
import { DAY, card, dayStart, downloadCsv, empty, field, fmt, formError, h, isoDay, openDialog, pageHeader, table } from "../ui.js";

const RANGES = [["1", "Today"], ["7", "Last 7 days"], ["30", "Last 30 days"], ["90", "Last 90 days"]];
const GROUPS = [["model", "Model"], ["key", "Key"], ["subject", "Subject"], ["protocol", "Protocol"], ["provider", "Provider"], ["day", "Day"], ["end_user", "End user"]];
const FILTERS = { key: "key_id", subject: "subject", model: "model" };
const state = { range: "7", key: "", subject: "", model: "", group: "model" };

// One page's report requests, by URL: the same report is asked for once.
let requests = new Map();
function report(params) {
  const url = "/usage" + query(params);
  if (!requests.has(url)) requests.set(url, api(url));
  return requests.get(url);
}

function rangeStart() {
  return dayStart() - (Number(state.range) - 1) * DAY;
}

export async function render() {
  requests = new Map();
  // The model filter's choices: the models of the range (the default table's own report).
  const [keys, models] = await Promise.all([api("/keys"), report({ by: "model", since: rangeStart() })]);
  const page = h("div", { class: "page" }, pageHeader("Usage", "Requests, tokens and spend from the usage records, in UTC days."));
  if (!models.available) {
    page.append(empty("Usage reports are not available yet", "This gateway keeps usage records, but has no reporting on them yet."));
    return page;
  }
  const results = h("div", { class: "results" });
  page.append(finder(), filters(keys, models.rows, () => refresh(results)), results);
  await refresh(results);
  return page;
}

function select(name, options, value) {
  const el = h("select", { name }, options.map(([v, label]) => h("option", { value: v }, label)));
  el.value = value;
  return el;
}

function finder() {
  const input = h("input", { name: "request", type: "search", required: "", maxlength: "200", placeholder: "req_… or a trace id" });
  const form = h("form", { class: "toolbar", role: "search", "aria-label": "Find a request" },
    field("Request or trace id", input), h("button", { class: "button", type: "submit" }, "Find"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    form.querySelector(".form-error")?.remove();
    try {
      const found = await api(`/usage/${encodeURIComponent(input.value.trim())}`);
      openDialog(`Request ${found.id}`, found.records.map(requestDetails), { wide: true });
    } catch (error) {
      formError(form, error.status === 404 ? { message: "No request has this id." } : error);
    }
  });
  return form;
}

// One record as `llm-gateway usage show` shows it.
function requestDetails(r) {
  const tags = Object.entries(r.tags).map(([k, v]) => `${k}=${v}`).join(", ");
  const pairs = [
    ["Request", r.request_id], ["Trace", r.trace_id || "—"], ["Started", new Date(r.started_at * 1000).toISOString()],
    ["Key", r.key_prefix ? `${r.key_prefix}…` : r.key_id || "—"], ["Subject", r.subject_id],
    ["End user", r.end_user || "—"], ["Tags", tags || "—"],
    ["Asked", `${r.protocol || r.endpoint} · ${r.model || "—"}${r.stream ? " · stream" : ""}`],
    ["Target", `${r.target.provider || "—"} / ${r.target.upstream_model || "—"}`], ["Attempts", String(r.attempts)],
    ["Status", r.error ? `${r.status} ${r.error.code}: ${r.error.message || ""}` : String(r.status)],
    ["Duration", fmt.ms(r.timings.duration_ms)], ["To headers", fmt.ms(r.timings.ttfb_ms)],
    ["Tokens", `${fmt.int(r.tokens.prompt)} in (cache read ${fmt.int(r.tokens.cache_read)}, write ${fmt.int(r.tokens.cache_write)}) · ${fmt.int(r.tokens.completion)} out (reasoning ${fmt.int(r.tokens.reasoning)})${r.tokens.estimated ? " · estimated" : ""}`],
    ["Cost", r.cost.source === "price" ? fmt.usd(r.cost.cost_usd) : r.cost.source === "provider" ? spend(r.cost.provider_cost_usd, r.cost.provider_cost_usd) : "no price"],
    ["Provider's cost", r.cost.provider_cost_usd === null ? "—" : fmt.usd(r.cost.provider_cost_usd)],
  ];
  return h("dl", { class: "details" }, pairs.flatMap(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]));
}

function filters(keys, modelRows, apply) {
  const subjects = [...new Set(keys.map((k) => k.subject_id))].sort();
  const models = [...new Set(modelRows.map((r) => r.model).filter(Boolean))].sort();
  const inputs = {
    range: select("range", RANGES, state.range),
    key: select("key", [["", "All keys"], ...keys.map((k) => [k.id, `${k.name} (${k.prefix}…)`])], state.key),
    subject: select("subject", [["", "All subjects"], ...subjects.map((s) => [s, s])], state.subject),
    model: select("model", [["", "All models"], ...models.map((m) => [m, m])], state.model),
    group: select("group", GROUPS, state.group),
  };
  const form = h("form", { class: "toolbar filters", "aria-label": "Usage filters" },
    field("Range", inputs.range), field("Key", inputs.key), field("Subject", inputs.subject), field("Model", inputs.model), field("Group by", inputs.group));
  form.addEventListener("change", () => {
    for (const [name, input] of Object.entries(inputs)) state[name] = input.value;
    apply();
  });
  form.addEventListener("submit", (event) => event.preventDefault());
  return form;
}

function selection(extra) {
  const dims = [...extra];
  for (const name of Object.keys(FILTERS)) if (state[name] && !dims.includes(name)) dims.push(name);
  const keep = (row) => Object.entries(FILTERS).every(([name, column]) => !state[name] || row[column] === state[name]);
  return { by: dims.join(","), keep };
}

async function refresh(results) {
  const days = Number(state.range);
  const since = rangeStart();
  const chartSel = selection(state.group === "day" ? ["day"] : ["day", state.group]);
  const tableSel = selection([state.group]);
  const [chartRows, tableRows, refused] = await Promise.all([
    // The chart shows spend only: without latency percentiles, unless it is the table's report.
    report({ by: chartSel.by, since, ...(chartSel.by === tableSel.by ? {} : { latency: false }) })
      .then((r) => r.rows.filter(chartSel.keep)),
    report({ by: tableSel.by, since }).then((r) => r.rows.filter(tableSel.keep)),
    refusals(since),
  ]);
  const refusedCard = card("Refused by the gateway, by kind", refusedTable(refused));
  if (!tableRows.length) {
    results.replaceChildren(empty("No usage for this selection", "Widen the range or clear a filter."), refusedCard);
    return;
  }
  const totals = sums(tableRows);
  const refusedCount = refused.reduce((n, k) => n + k.requests, 0);
  const nameOf = (r) => (state.group === "day" ? "spend" : label(r, state.group));
  const series = seriesByName(chartRows, nameOf, (r) => Number(r.spend_usd || 0));
  const chart = stackedBars({ title: "Spend per day", categories: dayRange(since, days), series, labelEvery: days > 14 ? 5 : 1 });
  const download = h("button", { class: "button", type: "button", onclick: () => csv(tableRows) }, "Download CSV");
  results.replaceChildren(
    h("div", { class: "stats compact", role: "list" },
      stat("Requests", fmt.int(totals.requests)), stat("Errors", `${fmt.int(totals.errors)} (${fmt.pct(totals.errors, totals.requests)})`),
      stat("Refused", fmt.int(refusedCount)), stat("Tokens", fmt.compact(totals.tokens)), stat("Spend", spend(totals.spend, totals.provider))),
    card(`Spend per day${state.group === "day" ? "" : ` by ${state.group}`}`, chart, costLegend(chartRows)),
    card(`By ${state.group}`, h("div", { class: "card-actions" }, download), usageTable(tableRows), costLegend(tableRows)),
    refusedCard);
}

// The refusals of the range, by kind, for the chosen key or subject (every refusal when
// neither is chosen; a refusal names no model, so the model filter does not apply).
async function refusals(since) {
  const by = state.key ? "key" : state.subject ? "subject" : "";
  const answer = await api("/refusals" + query({ by, since }));
  const keep = (r) => (!state.key || r.key_id === state.key) && (!state.subject || r.subject === state.subject);
  return byKind(answer.rows.filter(keep));
}

function refusedTable(kinds) {
  const legend = h("p", { class: "help" }, REFUSALS_EXPLAINED);
  if (!kinds.length) return [empty("No request was refused in this selection"), legend];
  return [table([
    { label: "Kind", render: (k) => h("span", { class: "mono" }, k.code) },
    { label: "Status", class: "num", render: (k) => String(k.status) },
    { label: "Requests", class: "num", render: (k) => fmt.int(k.requests) },
  ], kinds, { caption: "Requests refused, by kind" }), legend];
}

function stat(title, value) {
  return h("div", { class: "stat", role: "listitem" }, h("p", { class: "stat-label" }, title), h("p", { class: "stat-value" }, value));
}

function label(row, group) {
  if (group === "key") return row.key_name ? `${row.key_name} (${row.key_prefix}…)` : row.key_id;
  if (group === "day") return String(row.day).slice(0, 10);
  return row[group] || "(none)";
}

function usageTable(rows) {
  const sorted = [...rows].sort((a, b) => (state.group === "day" ? String(b.day).localeCompare(String(a.day)) : Number(b.spend_usd || 0) - Number(a.spend_usd || 0)));
  return table([
    { label: GROUPS.find(([g]) => g === state.group)[1], render: (r) => label(r, state.group) },
    { label: "Requests", class: "num", render: (r) => fmt.int(r.requests) },
    { label: "Errors", class: "num", render: (r) => fmt.int(r.errors) },
    { label: "Prompt tokens", class: "num", render: (r) => fmt.int(r.prompt_tokens) },
    { label: "Completion tokens", class: "num", render: (r) => fmt.int(r.completion_tokens) },
    // Parts of the two above: prompt tokens count cache reads and writes, completion tokens reasoning.
    { label: "Cache read", class: "num", render: (r) => fmt.int(r.cache_read_tokens) },
    { label: "Cache write", class: "num", render: (r) => fmt.int(r.cache_write_tokens) },
    { label: "Reasoning", class: "num", render: (r) => fmt.int(r.reasoning_tokens) },
    { label: "Spend", class: "num", render: rowSpend },
    { label: "p50", class: "num", render: (r) => fmt.ms(r.latency_p50_ms) },
    { label: "p95", class: "num", render: (r) => fmt.ms(r.latency_p95_ms) },
  ], sorted, { caption: `Usage by ${state.group}` });
}

const METRICS = ["requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens",
  "cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens", "reasoning_tokens", "cost_usd",
  "provider_cost_usd", "spend_usd", "provider_reported_usd", "cost_source", "latency_p50_ms", "latency_p95_ms"];

// The report's columns, as `llm-gateway usage report --format csv` has them: the grouping
// fields first, then the totals.
function csv(rows) {
  const names = [...new Set(rows.flatMap((r) => Object.keys(r)))];
  const columns = [...names.filter((n) => !METRICS.includes(n)), ...METRICS.filter((n) => names.includes(n))];
  downloadCsv(`usage-by-${state.group}-${isoDay(Date.now() / 1000)}.csv`, columns, rows);
}
