// Providers and routes: each provider and model alias with where it comes from (the file,
// or a database version), health per target (refreshed live), the versions with rollback,
// a change form (refused with the reason when the change would not serve), and provider
// keys (stored encrypted, shown masked).

import { api } from "../api.js";
import { badge, card, confirmDialog, empty, field, fmt, formError, h, pageHeader, table, toast } from "../ui.js";

const REFRESH_MS = 5000;

export async function render(ctx) {
  const [routes, versions, keys] = await Promise.all([api("/routes"), api("/routes/versions?limit=20"), api("/provider-keys")]);
  const page = h("div", { class: "page" });
  const status = h("p", { class: "muted small live-status", "aria-live": "polite" }, `Health refreshed ${new Date().toLocaleTimeString()}`);
  page.append(pageHeader("Providers & routes", `Routes version ${routes.version ?? "– (the file's only)"}. Default provider: ${routes.default_provider}; unknown model names: ${routes.unknown_models}.`));
  page.append(card("Providers", providers(routes)));
  const models = h("div", {}, modelTable(routes));
  page.append(card("Model aliases", status, models));
  page.append(h("div", { class: "grid-2" }, card("Change a route", changeForm()), card("Versions", versionList(versions))));
  page.append(card("Provider keys", providerKeys(keys)));

  // Live health: poll while this page is shown and the tab is visible.
  const timer = setInterval(async () => {
    if (document.hidden || !ctx.current()) return;
    try {
      const fresh = await api("/routes");
      models.replaceChildren(modelTable(fresh));
      status.textContent = `Health refreshed ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      status.textContent = `Could not refresh: ${error.message}`;
    }
  }, REFRESH_MS);
  ctx.onLeave(() => clearInterval(timer));
  return page;
}

function providers(routes) {
  return table([
    { label: "Provider", render: (p) => h("div", {}, h("strong", {}, p.name), p.default ? h("span", { class: "muted small" }, " default") : null) },
    { label: "Source", render: (p) => badge(p.source, "source") },
    { label: "Base URL", render: (p) => h("span", { class: "mono small" }, p.base_url) },
    { label: "Profile", render: (p) => p.profile },
    { label: "Key", render: (p) => (p.key_stored ? badge("stored, encrypted", "active") : p.key_configured ? badge(`from ${p.api_key_env}`, "active") : p.auth_header ? badge("missing", "revoked") : h("span", { class: "muted" }, "none needed")) },
    { label: "Max concurrency", class: "num", render: (p) => (p.max_concurrency ? fmt.int(p.max_concurrency) : "–") },
  ], routes.providers, { caption: "Providers" });
}

function modelTable(routes) {
  if (!routes.models.length) return empty("No model aliases", `Every model name goes to ${routes.default_provider} as it is.`);
  return table([
    { label: "Alias", render: (m) => h("strong", {}, m.name) },
    { label: "Source", render: (m) => badge(m.source, "source") },
    { label: "Targets", render: (m) => h("ul", { class: "targets" }, m.targets.map((t) => h("li", {},
      badge(t.health), ` ${t.provider}/${t.model}`, h("span", { class: "muted small" }, ` weight ${t.weight}${t.priority ? `, priority ${t.priority}` : ""}`)))) },
    { label: "Context", class: "num", render: (m) => (m.context_window ? fmt.int(m.context_window) : "–") },
  ], routes.models, { caption: "Model aliases" });
}

function reload() {
  window.dispatchEvent(new HashChangeEvent("hashchange"));
}

function changeForm() {
  const kind = h("select", { name: "kind" }, h("option", { value: "model" }, "Model alias"), h("option", { value: "provider" }, "Provider"));
  const name = h("input", { name: "name", required: true, placeholder: "chat-fast" });
  const entry = h("textarea", { name: "entry", rows: "7", spellcheck: "false", class: "mono",
    placeholder: '{"targets": [{"provider": "venice", "model": "llama-3.3-70b", "weight": 70}]}' });
  const note = h("input", { name: "note", placeholder: "why (kept with the version)" });
  const save = h("button", { class: "button primary", type: "submit" }, "Save as a new version");
  const remove = h("button", { class: "button danger", type: "button" }, "Delete");
  const form = h("form", { class: "form", novalidate: true },
    h("div", { class: "field-row" }, field("Kind", kind), field("Name", name)),
    field("Entry (JSON, as in the YAML file)", entry, "The whole entry: it replaces the file's entry of the same name."),
    field("Note", note), h("div", { class: "button-row" }, save, remove));
  const send = async (body) => {
    try {
      const version = await api("/routes", { method: "POST", body });
      toast(`Routes version ${version.version} saved.`);
      reload();
    } catch (error) {
      formError(form, error);
    }
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    let parsed;
    try {
      parsed = JSON.parse(entry.value);
    } catch {
      return formError(form, new Error("The entry is not valid JSON."));
    }
    send({ kind: kind.value, name: name.value.trim(), entry: parsed, note: note.value });
  });
  remove.addEventListener("click", async () => {
    if (!name.value.trim()) return formError(form, new Error("Name the route to delete."));
    if (await confirmDialog("Delete this route?", `The ${kind.value} ${name.value} is removed in a new version.`, "Delete")) {
      send({ kind: kind.value, name: name.value.trim(), entry: null, note: note.value });
    }
  });
  return form;
}

function versionList(versions) {
  if (!versions.length) return empty("No versions yet", "The file's routes are in force. A change made here becomes version 1.");
  return h("ol", { class: "versions" }, versions.map((v, i) => h("li", {},
    h("div", {}, h("strong", {}, `v${v.version}`), ` by ${v.created_by}, ${fmt.date(v.created_at)}`, v.note ? h("div", { class: "muted small" }, v.note) : null),
    i === 0 ? badge("current", "active") : h("button", { class: "button small", type: "button", "aria-label": `Roll back to version ${v.version}`, onclick: () => rollback(v.version) }, "Roll back"))));
}

async function rollback(version) {
  if (!(await confirmDialog(`Roll back to version ${version}?`, "A new version equal to it is saved and served at once.", "Roll back", "primary"))) return;
  try {
    const saved = await api("/routes/rollback", { method: "POST", body: { version } });
    toast(`Routes version ${saved.version} (= v${version}) saved.`);
    reload();
  } catch (error) {
    toast(error.message, "error");
  }
}

function providerKeys(keys) {
  const provider = h("input", { name: "provider", required: true, placeholder: "venice" });
  const secret = h("input", { name: "key", type: "password", autocomplete: "off", required: true });
  const form = h("form", { class: "form inline-form", novalidate: true }, field("Provider", provider), field("Key", secret),
    h("button", { class: "button primary", type: "submit" }, "Store encrypted"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const saved = await api(`/provider-keys/${encodeURIComponent(provider.value.trim())}`, { method: "PUT", body: { key: secret.value } });
      secret.value = "";
      toast(`Key of ${saved.name} stored (${saved.key}).`);
      reload();
    } catch (error) {
      formError(form, error);
    }
  });
  const list = keys.length
    ? table([
      { label: "Provider", render: (k) => k.name },
      { label: "Key", render: (k) => (k.key ? h("span", { class: "mono" }, k.key) : h("span", { class: "muted" }, "unreadable with this gateway's secret")) },
      { label: "Updated", render: (k) => fmt.date(k.updated_at) },
    ], keys, { caption: "Stored provider keys" })
    : empty("No provider key stored", "Keys come from the environment (api_key_env) unless one is stored here.");
  return h("div", {}, list, form);
}
