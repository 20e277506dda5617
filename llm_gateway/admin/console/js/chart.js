// Charts as plain SVG: a stacked bar chart (spend per day by model) with a legend and, for
// screen readers, the same numbers as a table. No library, nothing fetched.

import { h, svg, fmt } from "./ui.js";

// Distinguishable in both themes and for the common colour-vision deficiencies (Okabe-Ito).
export const PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#8E7CC3", "#999999"];

// series: [{name, values: {category: number}}]; categories in order along the x axis.
export function stackedBars({ title, categories, series, format = fmt.usd, height = 240, labelEvery = 1 }) {
  const width = 720;
  const pad = { top: 12, right: 12, bottom: 28, left: 56 };
  const totals = categories.map((c) => series.reduce((sum, s) => sum + (s.values[c] || 0), 0));
  const max = niceMax(Math.max(0, ...totals));
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const step = plotW / Math.max(1, categories.length);
  const barW = Math.max(2, step * 0.7);
  const y = (v) => pad.top + plotH - (max ? (v / max) * plotH : 0);

  const grid = [0, 0.25, 0.5, 0.75, 1].map((f) => {
    const value = max * f;
    return svg("g", { class: "grid" },
      svg("line", { x1: pad.left, x2: width - pad.right, y1: y(value), y2: y(value) }),
      svg("text", { x: pad.left - 6, y: y(value) + 4, "text-anchor": "end" }, format(value)));
  });
  const bars = categories.map((c, i) => {
    let base = 0;
    const x = pad.left + i * step + (step - barW) / 2;
    const parts = series.map((s, j) => {
      const v = s.values[c] || 0;
      if (!v) return null;
      const rect = svg("rect", { x, y: y(base + v), width: barW, height: Math.max(0.5, y(base) - y(base + v)), fill: PALETTE[j % PALETTE.length] },
        svg("title", {}, `${c} · ${s.name}: ${format(v)}`));
      base += v;
      return rect;
    });
    const label = i % labelEvery === 0 ? svg("text", { x: x + barW / 2, y: height - 8, "text-anchor": "middle", class: "axis" }, c.slice(5)) : null;
    return svg("g", {}, parts, label);
  });
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": `${title}: ${fmt.int(categories.length)} bars` },
    grid, bars);
  const legend = h("ul", { class: "legend", "aria-label": "Legend" },
    series.map((s, j) => h("li", {}, swatch(PALETTE[j % PALETTE.length]), s.name)));
  const data = h("details", { class: "chart-data" }, h("summary", {}, "Show the numbers"),
    h("div", { class: "table-wrap" }, h("table", {},
      h("caption", { class: "visually-hidden" }, title),
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Day"), series.map((s) => h("th", { scope: "col", class: "num" }, s.name)), h("th", { scope: "col", class: "num" }, "Total"))),
      h("tbody", {}, categories.map((c, i) => h("tr", {}, h("th", { scope: "row" }, c),
        series.map((s) => h("td", { class: "num" }, format(s.values[c] || 0))), h("td", { class: "num" }, format(totals[i]))))))));
  // On a phone the chart scrolls sideways rather than shrinking its labels out of reach.
  return h("figure", { class: "chart-figure" }, h("div", { class: "chart-scroll" }, chart), series.length ? legend : null, data);
}

function swatch(color) {
  const el = h("span", { class: "swatch", "aria-hidden": "true" });
  el.style.background = color;
  return el;
}

function niceMax(value) {
  if (value <= 0) return 1;
  const exponent = Math.pow(10, Math.floor(Math.log10(value)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * exponent >= value) return m * exponent;
  return 10 * exponent;
}

// Days from `since` (Unix seconds, UTC midnight) for `count` days, as YYYY-MM-DD.
export function dayRange(since, count) {
  return Array.from({ length: count }, (_, i) => new Date((since + i * 86400) * 1000).toISOString().slice(0, 10));
}

// Rows of the usage report (by day and some name) into chart series, the largest first and
// the rest folded into "other" so a legend stays readable.
export function seriesByName(rows, nameOf, valueOf, limit = 6) {
  const byName = new Map();
  for (const row of rows) {
    const name = nameOf(row) || "(none)";
    const day = String(row.day).slice(0, 10);
    const values = byName.get(name) || {};
    values[day] = (values[day] || 0) + valueOf(row);
    byName.set(name, values);
  }
  const ranked = [...byName.entries()].map(([name, values]) => ({ name, values, total: Object.values(values).reduce((a, b) => a + b, 0) }))
    .sort((a, b) => b.total - a.total);
  if (ranked.length <= limit) return ranked;
  const other = { name: "other", values: {}, total: 0 };
  for (const s of ranked.slice(limit - 1)) {
    for (const [day, v] of Object.entries(s.values)) other.values[day] = (other.values[day] || 0) + v;
  }
  return [...ranked.slice(0, limit - 1), other];
}
