// What a report row cost as the console shows it, and the refusals beside the errors.
// Spend is the report's spend_usd: each request at your price where one applies, else at
// the cost its provider reported (provider_reported_usd is that part; never both for one
// request). Spend that is partly or wholly the provider's figure carries a visible mark,
// explained by a legend, so $0.00 never hides a cost the provider did report.

import { fmt, h } from "./ui.js";

export const PROVIDER_MARK = "≈ provider-reported";
const EXPLAINED = "No price of yours applies to (some of) these requests: this is the cost the provider reported. Set prices (llm-gateway prices set, or prices sync) to bill at your own.";

// Sums of a report's rows: requests, errors, tokens, spend and its provider-reported part.
export function totals(rows) {
  return rows.reduce((t, r) => ({
    requests: t.requests + Number(r.requests || 0),
    errors: t.errors + Number(r.errors || 0),
    tokens: t.tokens + Number(r.total_tokens || 0),
    spend: t.spend + Number(r.spend_usd || 0),
    provider: t.provider + Number(r.provider_reported_usd || 0),
  }), { requests: 0, errors: 0, tokens: 0, spend: 0, provider: 0 });
}

// A spend figure, marked when part of it is the provider's reported cost: in full, or in
// a table's narrow cell as "≈" (the words are there for a screen reader, and the legend).
export function spend(usd, providerUsd, { compact = false } = {}) {
  if (!(Number(providerUsd) > 0)) return fmt.usd(usd);
  const mark = compact
    ? h("span", { class: "cost-mark", title: EXPLAINED }, "≈", h("span", { class: "visually-hidden" }, PROVIDER_MARK.slice(1)))
    : h("span", { class: "cost-mark", title: EXPLAINED }, PROVIDER_MARK);
  return h("span", { class: "spend" }, fmt.usd(usd), " ", mark);
}

// A row's spend (spend_usd, provider_reported_usd), marked as above, for a table's cell.
export function rowSpend(row) {
  return spend(row.spend_usd, row.provider_reported_usd, { compact: true });
}

// Said once under what shows a mark.
export function costLegend(rows) {
  if (!rows.some((r) => Number(r.provider_reported_usd || 0) > 0)) return null;
  return h("p", { class: "help cost-legend" }, h("span", { class: "cost-mark" }, PROVIDER_MARK), `: ${EXPLAINED}`);
}

// Refusals (GET /refusals rows) summed by kind: [{ code, status, requests }], most first.
export function byKind(rows) {
  const kinds = new Map();
  for (const r of rows) {
    const kind = kinds.get(r.code) || { code: r.code, status: r.status, requests: 0 };
    kind.requests += Number(r.requests || 0);
    kinds.set(r.code, kind);
  }
  return [...kinds.values()].sort((a, b) => b.requests - a.requests || a.code.localeCompare(b.code));
}

export const REFUSALS_EXPLAINED = "Requests the gateway answered itself before admission (no call to a provider, no usage record): not among the errors, which are admitted requests that failed, upstream failures among them.";
