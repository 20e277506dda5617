// Small DOM helpers shared by every page: element building, formatting, dialogs, toasts,
// and the loading / empty / error states, so every page looks and behaves the same.
// Nothing here writes HTML strings: text always goes in as text (no injection from data).

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (value === true) el.setAttribute(name, "");
    else el.setAttribute(name, value);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

const SVG_NS = "http://www.w3.org/2000/svg";
export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) el.setAttribute(name, value);
  }
  append(el, children);
  return el;
}

// ---- formatting ----------------------------------------------------------------------

const integer = new Intl.NumberFormat("en-US");
const compact = new Intl.NumberFormat("en-US", { notation: "compact", maximumFractionDigits: 1 });

export const fmt = {
  int: (n) => integer.format(Number(n || 0)),
  compact: (n) => compact.format(Number(n || 0)),
  // Money arrives as an exact decimal string; it is rounded only here, for the eye.
  usd(value) {
    const n = Number(value || 0);
    if (n === 0) return "$0.00";
    if (Math.abs(n) < 0.01) return "$" + n.toPrecision(2);
    return "$" + n.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  },
  ms: (n) => (n === null || n === undefined ? "–" : `${Math.round(Number(n))} ms`),
  date(seconds) {
    if (!seconds) return "–";
    return new Date(seconds * 1000).toISOString().slice(0, 16).replace("T", " ") + "Z";
  },
  ago(seconds) {
    if (!seconds) return "never";
    const delta = Date.now() / 1000 - seconds;
    if (delta < 60) return "just now";
    if (delta < 3600) return `${Math.floor(delta / 60)} min ago`;
    if (delta < 86400) return `${Math.floor(delta / 3600)} h ago`;
    return `${Math.floor(delta / 86400)} d ago`;
  },
  pct: (part, whole) => (whole ? Math.round((100 * part) / whole) + "%" : "–"),
};

export const DAY = 86400;
export function dayStart(seconds = Date.now() / 1000) {
  return Math.floor(seconds / DAY) * DAY;
}
export function isoDay(seconds) {
  return new Date(seconds * 1000).toISOString().slice(0, 10);
}

// ---- states --------------------------------------------------------------------------

export function loading(label = "Loading…") {
  return h("div", { class: "state", role: "status" }, h("span", { class: "spinner", "aria-hidden": "true" }), label);
}

export function empty(title, text, action) {
  return h("div", { class: "state empty" }, h("p", { class: "state-title" }, title), text ? h("p", {}, text) : null, action || null);
}

export function failure(error, retry) {
  return h(
    "div",
    { class: "state error", role: "alert" },
    h("p", { class: "state-title" }, "Something went wrong"),
    h("p", {}, error && error.message ? error.message : String(error)),
    retry ? h("button", { class: "button", type: "button", onclick: retry }, "Try again") : null,
  );
}

export function badge(text, tone = text) {
  return h("span", { class: `badge badge-${tone}` }, text);
}

// ---- toasts (announced to screen readers through the live region) ------------------------

export function toast(message, tone = "ok") {
  const region = document.getElementById("toasts");
  const item = h("div", { class: `toast toast-${tone}` }, message);
  region.append(item);
  setTimeout(() => item.remove(), 5000);
}

// ---- dialogs: the native <dialog> (focus kept inside, Esc closes) -------------------------

export function openDialog(title, body, { actions = [], wide = false } = {}) {
  const titleId = `dialog-${Math.random().toString(36).slice(2)}`;
  const dialog = h(
    "dialog",
    { class: wide ? "dialog wide" : "dialog", "aria-labelledby": titleId },
    h("div", { class: "dialog-head" },
      h("h2", { id: titleId }, title),
      h("button", { class: "icon-button", type: "button", "aria-label": "Close", onclick: () => dialog.close() }, "×")),
    h("div", { class: "dialog-body" }, body),
    actions.length ? h("div", { class: "dialog-actions" }, actions) : null,
  );
  dialog.addEventListener("close", () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  return dialog;
}

export function confirmDialog(title, text, confirmLabel, tone = "danger") {
  return new Promise((resolve) => {
    let answered = false;
    const finish = (value) => {
      answered = true;
      resolve(value);
      dialog.close();
    };
    const dialog = openDialog(title, h("p", {}, text), {
      actions: [
        h("button", { class: "button", type: "button", onclick: () => finish(false) }, "Cancel"),
        h("button", { class: `button ${tone}`, type: "button", onclick: () => finish(true) }, confirmLabel),
      ],
    });
    dialog.addEventListener("close", () => answered || resolve(false));
  });
}

// A secret shown once (a new key or token): selectable, with a copy button.
export function secretDialog(title, secret, note) {
  const field = h("input", { class: "secret", type: "text", readonly: true, value: secret, "aria-label": title, "data-secret": "" });
  const copy = h("button", { class: "button primary", type: "button" }, "Copy");
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(secret);
    } catch {
      field.select();
      document.execCommand("copy");
    }
    copy.textContent = "Copied";
    toast("Copied to the clipboard");
  });
  const dialog = openDialog(title, [
    h("p", { class: "warning" }, note),
    h("div", { class: "secret-row" }, field, copy),
  ], { actions: [h("button", { class: "button", type: "button", onclick: () => dialog.close() }, "Done")] });
  field.focus();
  field.select();
  return dialog;
}

// A form field with its label (and help text tied to it for screen readers).
export function field(label, input, help) {
  const id = input.id || `f-${Math.random().toString(36).slice(2)}`;
  input.id = id;
  const helpId = help ? `${id}-help` : null;
  if (helpId) input.setAttribute("aria-describedby", helpId);
  return h("div", { class: "field" }, h("label", { for: id }, label), input, help ? h("p", { class: "help", id: helpId }, help) : null);
}

export function formError(form, error) {
  let box = form.querySelector(".form-error");
  if (!box) {
    box = h("p", { class: "form-error", role: "alert" });
    form.prepend(box);
  }
  box.textContent = error.message || String(error);
}

// A progress bar: spent against a limit (role progressbar, width set through the CSSOM so the
// content security policy needs no inline styles).
export function meter(label, used, limit, format = (v) => v) {
  const share = limit > 0 ? Math.min(1, used / limit) : 0;
  const tone = share >= 1 ? "over" : share >= 0.8 ? "near" : "ok";
  const fill = h("div", { class: `meter-fill meter-${tone}` });
  fill.style.width = `${(share * 100).toFixed(1)}%`;
  return h(
    "div",
    { class: "meter-row" },
    h("div", { class: "meter-label" }, h("span", {}, label), h("span", {}, `${format(used)} of ${format(limit)}`)),
    h("div", {
      class: "meter", role: "progressbar", "aria-label": `${label}: ${format(used)} of ${format(limit)}`,
      "aria-valuemin": "0", "aria-valuemax": "100", "aria-valuenow": String(Math.round(share * 100)),
    }, fill),
  );
}

export function table(columns, rows, { caption, rowKey } = {}) {
  const head = h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.class }, c.label))));
  const body = h("tbody");
  const fragment = document.createDocumentFragment();
  for (const row of rows) {
    const tr = h("tr", rowKey ? { dataset: { key: rowKey(row) } } : {}, columns.map((c) => h("td", { class: c.class, "data-label": c.label }, c.render(row))));
    fragment.append(tr);
  }
  body.append(fragment);
  return h("div", { class: "table-wrap" }, h("table", {}, caption ? h("caption", { class: "visually-hidden" }, caption) : null, head, body));
}

// A long table drawn a page at a time: rows are built when first shown, so a thousand keys
// cost the first hundred's work until someone asks for more.
export function pagedTable(columns, rows, { caption, limit = 100 } = {}) {
  const built = new WeakMap();
  const tbody = h("tbody");
  const more = h("button", { class: "button", type: "button" });
  let current = rows;
  let shown = limit;
  const rowFor = (row) => {
    let tr = built.get(row);
    if (!tr) {
      tr = h("tr", {}, columns.map((c) => h("td", { class: c.class, "data-label": c.label }, c.render(row))));
      built.set(row, tr);
    }
    return tr;
  };
  const draw = () => {
    tbody.replaceChildren(...current.slice(0, shown).map(rowFor));
    const rest = current.length - shown;
    more.hidden = rest <= 0;
    more.textContent = `Show ${fmt.int(Math.min(limit, rest))} more (${fmt.int(rest)} left)`;
  };
  more.addEventListener("click", () => {
    shown += limit;
    draw();
  });
  draw();
  const element = h("div", {},
    h("div", { class: "table-wrap" }, h("table", {},
      caption ? h("caption", { class: "visually-hidden" }, caption) : null,
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.class }, c.label)))),
      tbody)),
    h("div", { class: "center" }, more));
  return {
    element,
    setRows(next) {
      current = next;
      shown = limit;
      draw();
    },
  };
}

// A spreadsheet runs a cell that starts with = + - @, a tab or a CR as a formula, and
// report text is caller-chosen (a model's name is what a request said): such a cell gets
// a leading ' (OWASP's advice), unless it is a plain number (money is text in reports).
// As `llm-gateway usage report --format csv` writes it (llm_gateway/billing/reports.py).
const FORMULA_START = /^[=+\-@\t\r]/;
const PLAIN_NUMBER = /^-?[0-9]+(\.[0-9]+)?$/;

function csvCell(v) {
  if (v === null || v === undefined) return "";
  const text = String(v);
  const neutral = typeof v !== "number" && FORMULA_START.test(text) && !PLAIN_NUMBER.test(text) ? `'${text}` : text;
  // Quoted when it holds a separator, a quote or a line break (a CR too: it could end the row).
  return /[",\r\n]/.test(neutral) ? `"${neutral.replace(/"/g, '""')}"` : neutral;
}

export function downloadCsv(filename, columns, rows) {
  const lines = [columns.map(csvCell).join(","), ...rows.map((r) => columns.map((c) => csvCell(r[c])).join(","))];
  const url = URL.createObjectURL(new Blob([lines.join("\r\n") + "\r\n"], { type: "text/csv" }));
  const link = h("a", { href: url, download: filename, class: "visually-hidden" }, "download");
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

export function pageHeader(title, subtitle, ...actions) {
  return h("header", { class: "page-head" },
    h("div", {}, h("h1", { tabindex: "-1" }, title), subtitle ? h("p", { class: "subtitle" }, subtitle) : null),
    actions.length ? h("div", { class: "page-actions" }, actions) : null);
}

export function card(title, ...content) {
  return h("section", { class: "card" }, title ? h("h2", { class: "card-title" }, title) : null, content);
}
