// Overview: today against yesterday, 30 days of spend by model, the keys that spend most
// this week, the requests refused this week by kind, and whether any upstream target is
// unwell.

import { api, query } from "../api.js";
import { dayRange, seriesByName, stackedBars } from "../chart.js";
import { REFUSALS_EXPLAINED, byKind, costLegend, rowSpend, spend } from "../cost.js";
import { DAY, badge, card, dayStart, empty, fmt, h, isoDay, pageHeader, table } from "../ui.js";

const METRICS = [
  { label: "Requests", value: (r) => r.requests, format: fmt.int },
  { label: "Errors", value: (r) => r.errors, format: fmt.int, worseWhenUp: true },
  { label: "Refused", value: (r) => r.refused, format: fmt.int, worseWhenUp: true },
  { label: "Tokens", value: (r) => r.total_tokens, format: fmt.compact },
  // Marked when part of it is the provider's reported cost (no price of yours applies).
  { label: "Spend", value: (r) => r.spend_usd, format: fmt.usd, show: (r) => spend(r.spend_usd, r.provider_reported_usd) },
];

export async function render() {
  const today = dayStart();
  // Two reports: today and yesterday are summed from the 30 days by model.
  const [byModel, byKey, refusals, routes] = await Promise.all([
    // Neither card shows latency: the reports leave out its percentiles (a sort per group).
    api("/usage" + query({ by: "day,model", since: today - 29 * DAY, latency: false })),
    api("/usage" + query({ by: "key", since: today - 6 * DAY, top: 5, latency: false })),
    api("/refusals" + query({ by: "day", since: today - 6 * DAY })),
    api("/routes").catch(() => null),
  ]);
  const page = h("div", { class: "page" },
    pageHeader("Overview", "Traffic and spend across every key, in UTC days."));
  if (!byModel.available) {
    page.append(empty("Usage reports are not available yet",
      "This gateway keeps usage records, but has no reporting on them yet."));
    if (routes) page.append(healthCard(routes));
    return page;
  }
  page.append(statCards(byModel.rows, refusals.rows, today));
  page.append(card("Spend per day by model, last 30 days", spendChart(byModel.rows, today), costLegend(byModel.rows)));
  const grid = h("div", { class: "grid-2" }, card("Top keys this week", topKeys(byKey.rows), costLegend(byKey.rows)),
    card("Refused this week, by kind", refusedKinds(refusals.rows)));
  if (routes) grid.append(healthCard(routes));
  page.append(grid);
  return page;
}

function dayTotals(rows, refused, day) {
  const totals = { requests: 0, errors: 0, refused: 0, total_tokens: 0, spend_usd: 0, provider_reported_usd: 0 };
  const onDay = (row) => String(row.day).slice(0, 10) === isoDay(day);
  for (const row of rows.filter(onDay)) {
    for (const name of Object.keys(totals)) totals[name] += Number(row[name] || 0);
  }
  for (const row of refused.filter(onDay)) totals.refused += row.requests;
  return totals;
}

function statCards(rows, refused, today) {
  const now = dayTotals(rows, refused, today);
  const before = dayTotals(rows, refused, today - DAY);
  return h("div", { class: "stats", role: "list" }, METRICS.map((m) => {
    const a = Number(m.value(now) || 0);
    const b = Number(m.value(before) || 0);
    const delta = b ? (a - b) / b : null;
    const up = delta !== null && delta > 0;
    // Only errors have a good direction; more traffic or spend is neither good nor bad.
    const tone = !m.worseWhenUp || !delta ? "flat" : up ? "bad" : "good";
    const change = delta === null ? "no traffic yesterday" : `${up ? "▲" : delta < 0 ? "▼" : "="} ${Math.abs(Math.round(delta * 100))}% vs yesterday`;
    return h("div", { class: "stat", role: "listitem" },
      h("p", { class: "stat-label" }, m.label, h("span", { class: "visually-hidden" }, " today")),
      h("p", { class: "stat-value" }, m.show ? m.show(now) : m.format(a)),
      h("p", { class: `stat-delta ${tone}` }, change, h("span", { class: "stat-prev" }, ` (${m.format(b)})`)));
  }));
}

function spendChart(rows, today) {
  if (!rows.length) return empty("No spend in the last 30 days", "Requests appear here once keys are used.");
  const categories = dayRange(today - 29 * DAY, 30);
  const series = seriesByName(rows, (r) => r.model, (r) => Number(r.spend_usd || 0));
  return stackedBars({ title: "Spend per day by model", categories, series, labelEvery: 5 });
}

function topKeys(rows) {
  const top = [...rows].sort((a, b) => Number(b.spend_usd || 0) - Number(a.spend_usd || 0)).slice(0, 5);
  if (!top.length) return empty("No key was used this week");
  return table([
    { label: "Key", render: (r) => h("span", {}, r.key_name || "–", h("span", { class: "muted mono" }, ` ${r.key_prefix || r.key_id || ""}`)) },
    { label: "Subject", render: (r) => r.subject || "–" },
    { label: "Requests", class: "num", render: (r) => fmt.int(r.requests) },
    { label: "Spend", class: "num", render: rowSpend },
  ], top, { caption: "Top keys this week" });
}

function refusedKinds(rows) {
  const kinds = byKind(rows);
  const legend = h("p", { class: "help" }, REFUSALS_EXPLAINED);
  if (!kinds.length) return [empty("No request was refused this week"), legend];
  return [table([
    { label: "Kind", render: (k) => h("span", { class: "mono" }, k.code) },
    { label: "Status", class: "num", render: (k) => String(k.status) },
    { label: "Requests", class: "num", render: (k) => fmt.int(k.requests) },
  ], kinds, { caption: "Requests refused this week, by kind" }), legend];
}

function healthCard(routes) {
  const targets = routes.models.flatMap((m) => m.targets.map((t) => ({ ...t, alias: m.name })));
  const unwell = targets.filter((t) => t.health !== "healthy");
  const body = !targets.length
    ? empty("No model aliases", `Requests go to ${routes.default_provider} as named.`)
    : unwell.length
      ? h("ul", { class: "plain-list" }, unwell.map((t) => h("li", {}, badge(t.health), ` ${t.alias} → ${t.provider}/${t.model}`)))
      : h("p", { class: "ok-line" }, badge("healthy"), ` All ${targets.length} targets are healthy.`);
  return card("Upstream health", body, h("p", {}, h("a", { href: "#/routes" }, "Providers and routes →")));
}
