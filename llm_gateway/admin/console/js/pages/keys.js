// Keys: every gateway key (prefixes only) with search; create (the key shown once), edit,
// disable/enable, rotate and revoke (with confirmation).

import { api } from "../api.js";
import { badge, confirmDialog, empty, field, fmt, formError, h, openDialog, pageHeader, pagedTable, secretDialog, toast } from "../ui.js";

const EXPIRY = [["", "Never"], ["604800", "7 days"], ["2592000", "30 days"], ["7776000", "90 days"], ["31536000", "1 year"]];

export async function render(ctx) {
  const keys = await api("/keys");
  const page = h("div", { class: "page" });
  const create = h("button", { class: "button primary", type: "button", onclick: () => createDialog(ctx) }, "Create key");
  page.append(pageHeader("Keys", "Gateway keys are shown once, at creation; only their prefix is kept in view.", create));
  if (!keys.length) {
    page.append(empty("No keys yet", "Create a key for an application or a team; it is shown once.",
      h("button", { class: "button primary", type: "button", onclick: () => createDialog(ctx) }, "Create the first key")));
    return page;
  }
  const search = h("input", { type: "search", placeholder: "Name, prefix, subject or model", autocomplete: "off" });
  const state = h("select", {}, ["all", "active", "disabled", "revoked", "expired"].map((s) => h("option", { value: s }, s === "all" ? "Any state" : s)));
  const count = h("p", { class: "muted count", "aria-live": "polite" });
  const listing = pagedTable(columns(), keys, { caption: "Gateway keys" });
  const haystack = new Map(keys.map((k) => [k, [k.name, k.prefix, k.subject_id, ...k.allowed_models].join(" ").toLowerCase()]));
  const filter = () => {
    const words = search.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    const shown = keys.filter((k) => words.every((w) => haystack.get(k).includes(w)) && (state.value === "all" || k.state === state.value));
    listing.setRows(shown);
    count.textContent = `${fmt.int(shown.length)} of ${fmt.int(keys.length)} keys`;
  };
  search.addEventListener("input", filter);
  state.addEventListener("change", filter);
  filter();
  page.append(h("div", { class: "toolbar" }, field("Search keys", search), field("State", state), count), listing.element);
  return page;
}

function columns() {
  return [
    { label: "Name", class: "nowrap", render: (k) => h("div", {},
      // The name opens the key's settings (a revoked key has none left to change).
      k.state === "revoked" ? h("strong", {}, k.name)
        : h("button", { class: "link-button", type: "button", title: "Edit this key", "aria-label": `Edit ${k.name} (${k.prefix}…)`, onclick: () => editDialog(k) }, k.name),
      h("div", { class: "muted mono small" }, `${k.prefix}…`)) },
    { label: "Subject", render: (k) => k.subject_id },
    { label: "State", render: (k) => badge(k.state) },
    { label: "Limit", class: "nowrap", render: (k) => h("div", {}, `${k.rate_limit_requests} / ${k.rate_limit_window_seconds}s`,
      k.expires_at ? h("div", { class: "muted small" }, `expires ${fmt.date(k.expires_at).slice(0, 10)}`) : null) },
    { label: "Models", render: models },
    { label: "Last used", class: "nowrap", render: (k) => fmt.ago(k.last_used_at) },
    { label: "Actions", class: "actions", render: actions },
  ];
}

// "all", one model, or the first and how many more (all of them in the tooltip).
function models(k) {
  const list = k.allowed_models;
  if (!list.length) return h("span", { class: "muted" }, "all");
  if (list.length === 1) return list[0];
  return h("span", { title: list.join(", ") }, list[0], h("span", { class: "muted" }, ` +${list.length - 1}`));
}

function actions(k) {
  if (k.state === "revoked") return h("span", { class: "muted" }, "revoked");
  const label = `${k.name} (${k.prefix}…)`;
  return h("div", { class: "button-row" },
    k.is_active
      ? h("button", { class: "button small", type: "button", "aria-label": `Disable ${label}`, onclick: () => change(k, "disable") }, "Disable")
      : h("button", { class: "button small", type: "button", "aria-label": `Enable ${label}`, onclick: () => change(k, "enable") }, "Enable"),
    h("button", { class: "button small", type: "button", "aria-label": `Rotate ${label}`, onclick: () => rotate(k) }, "Rotate"),
    h("button", { class: "button small danger", type: "button", "aria-label": `Revoke ${label}`, onclick: () => revoke(k) }, "Revoke"));
}

function reload() {
  window.dispatchEvent(new HashChangeEvent("hashchange"));
}

async function change(k, action) {
  try {
    await api(`/keys/${k.id}/${action}`, { method: "POST" });
    toast(`${k.name} ${action}d. Every gateway sees it within seconds.`);
    reload();
  } catch (error) {
    toast(error.message, "error");
  }
}

async function revoke(k) {
  if (!(await confirmDialog("Revoke this key?", `${k.name} (${k.prefix}…) will be refused for good, on every gateway within seconds. This cannot be undone.`, "Revoke key"))) return;
  await change(k, "revoke");
}

async function rotate(k) {
  if (!(await confirmDialog("Rotate this key?", `A new key with the same settings replaces ${k.prefix}…, which is revoked now. Applications must switch to the new key.`, "Rotate key", "primary"))) return;
  try {
    const created = await api(`/keys/${k.id}/rotate`, { method: "POST" });
    secretDialog("New key", created.key, "Copy the new key now: it is shown this once.").addEventListener("close", reload);
  } catch (error) {
    toast(error.message, "error");
  }
}

function keyForm(values = {}) {
  const inputs = {
    name: h("input", { name: "name", required: true, maxlength: "200", value: values.name || "" }),
    subject: h("input", { name: "subject", maxlength: "200", value: values.subject_id || "", placeholder: "defaults to the name" }),
    requests: h("input", { name: "requests", type: "number", min: "1", required: true, value: values.rate_limit_requests || 60 }),
    window: h("input", { name: "window", type: "number", min: "1", required: true, value: values.rate_limit_window_seconds || 60 }),
    models: h("input", { name: "models", value: (values.allowed_models || []).join(", "), placeholder: "all models" }),
    expiry: h("select", { name: "expiry" }, EXPIRY.map(([v, label]) => h("option", { value: v }, label))),
  };
  const fields = [
    field("Name", inputs.name, "Who uses it, e.g. the application's name."),
    field("Subject", inputs.subject, "The team or user it belongs to; budgets apply per subject too."),
    h("div", { class: "field-row" }, field("Requests", inputs.requests), field("per seconds", inputs.window)),
    field("Allowed models", inputs.models, "Comma-separated; empty allows every model."),
    field(values.name ? "Expires (from now)" : "Expires", inputs.expiry),
  ];
  const read = () => ({
    name: inputs.name.value.trim(),
    subject_id: inputs.subject.value.trim() || null,
    rate_limit_requests: Number(inputs.requests.value),
    rate_limit_window_seconds: Number(inputs.window.value),
    allowed_models: inputs.models.value.split(",").map((m) => m.trim()).filter(Boolean),
    expires_at: inputs.expiry.value ? Date.now() / 1000 + Number(inputs.expiry.value) : null,
  });
  return { fields, read, inputs };
}

function createDialog() {
  const { fields, read, inputs } = keyForm();
  const form = h("form", { class: "form", novalidate: true }, fields);
  const submit = h("button", { class: "button primary", type: "submit", form: "key-form" }, "Create key");
  form.id = "key-form";
  const dialog = openDialog("Create a key", form, { actions: [h("button", { class: "button", type: "button", onclick: () => dialog.close() }, "Cancel"), submit] });
  inputs.name.focus();
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = read();
    if (!body.name) return formError(form, new Error("A key needs a name."));
    submit.disabled = true;
    try {
      const created = await api("/keys", { method: "POST", body });
      dialog.close();
      secretDialog("Your new key", created.key, `Copy the key for ${created.name} now: it is shown this once and cannot be recovered.`).addEventListener("close", reload);
    } catch (error) {
      submit.disabled = false;
      formError(form, error);
    }
  });
}

function editDialog(k) {
  const { fields, read, inputs } = keyForm(k);
  const keep = h("option", { value: "keep", selected: true }, k.expires_at ? `Keep (${fmt.date(k.expires_at)})` : "Keep (never)");
  inputs.expiry.prepend(keep);
  inputs.expiry.value = "keep";
  const form = h("form", { class: "form", id: "edit-form", novalidate: true }, fields);
  const submit = h("button", { class: "button primary", type: "submit", form: "edit-form" }, "Save");
  const dialog = openDialog(`Edit ${k.name}`, form, { actions: [h("button", { class: "button", type: "button", onclick: () => dialog.close() }, "Cancel"), submit] });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = read();
    if (inputs.expiry.value === "keep") delete body.expires_at;
    if (!body.subject_id) delete body.subject_id;
    submit.disabled = true;
    try {
      await api(`/keys/${k.id}`, { method: "PATCH", body });
      dialog.close();
      toast(`${body.name} saved.`);
      reload();
    } catch (error) {
      submit.disabled = false;
      formError(form, error);
    }
  });
}
