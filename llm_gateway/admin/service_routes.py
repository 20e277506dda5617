"""Routes and provider keys through the admin service.

The settings file's routes stay the base. Admin changes are an overlay document
(``{"providers": {...}, "models": {...}}``, whose entries replace the file's of the same
name; ``null`` removes one), kept as numbered versions in the store. Every change is
checked by the routing package's own parser on the merged document before it is stored:
a change that would not serve is refused with the parser's one-line reason.

Provider keys are sealed with AES-GCM under LLM_GATEWAY_SECRET_KEY and only ever shown
masked.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.admin.common import (
    INTEGER_MAX,
    Invalid,
    NotConfigured,
    NotFound,
    ServiceBase,
    whole_number,
)
from llm_gateway.crypto import (
    CannotDecrypt,
    SecretBox,
    SecretKeyError,
    mask_secret,
    provider_key_context,
)
from llm_gateway.routing.config import RouteError, merge_routes, parse_routes
from llm_gateway.routing.table import RouteTable
from llm_gateway.stores.admin import RouteVersion, StoredProviderKey

ROUTE_KINDS = {"provider": "providers", "model": "models"}


def _entry_source(name: str, section: str, file_document: dict[str, Any],
                  versions: list[RouteVersion]) -> str:
    """Where an entry's current form comes from: ``db vN`` (the oldest version of the
    unbroken run that holds it as it is now), ``file`` or ``settings``."""
    newest = (versions[0].document.get(section) or {}) if versions else {}
    if name not in newest:
        return "file" if name in (file_document.get(section) or {}) else "settings"
    source = versions[0].version
    for version in versions[1:]:
        entries = version.document.get(section) or {}
        if name not in entries or entries[name] != newest[name]:
            break
        source = version.version
    return f"db v{source}"


def _provider_view(table: RouteTable, name: str, source: str,
                   stored: set[str]) -> dict[str, Any]:
    provider = table.providers[name]
    return {
        "name": name, "source": source, "base_url": provider.base_url,
        "profile": provider.profile,
        "auth_header": provider.auth_header, "api_key_env": provider.api_key_env,
        "key_configured": bool(provider.api_key) or name in stored,
        "key_stored": name in stored, "max_concurrency": provider.max_concurrency,
        "default": name == table.default_provider,
    }


def _health(gateway: Any) -> tuple[dict[str, str], Any]:
    """Health per target from the running gateway: (target key -> state, its own view)."""
    if gateway is None:
        return {}, None
    live = gateway.routes_view() if hasattr(gateway, "routes_view") else None
    states = {key: str(state) for key, state in gateway.router.states().items()}
    return states, live


class RouteOps(ServiceBase):
    async def _overlay(self) -> tuple[RouteVersion | None, dict[str, Any]]:
        latest = await self.store.latest_route_version()
        return latest, dict(latest.document) if latest else {"providers": {}, "models": {}}

    def _table(self, overlay: dict[str, Any]) -> RouteTable:
        merged = merge_routes(dict(self.settings.routes), overlay)
        try:
            return parse_routes(merged, self.environ, self.settings)
        except RouteError as exc:
            raise Invalid(str(exc)) from None

    async def routes(self) -> dict[str, Any]:
        """The effective routes, where each comes from, and health per target."""
        versions = await self.store.route_versions(limit=1000)
        latest = versions[0] if versions else None
        table = self._table(dict(latest.document) if latest else {})
        file_document = dict(self.settings.routes)
        stored = {key.name for key in await self.store.provider_keys()}
        states, live = _health(self.gateway)
        models = []
        for name, route in table.models.items():
            targets = [{"provider": t.provider, "model": t.model, "weight": t.weight,
                        "priority": t.priority, "health": states.get(t.key, "healthy")}
                       for t in route.targets]
            models.append({"name": name, "source": _entry_source(name, "models", file_document,
                                                                 versions),
                           "context_window": route.context_window, "targets": targets})
        return {
            "version": latest.version if latest else None,
            "default_provider": table.default_provider,
            "unknown_models": table.unknown_models,
            "providers": [_provider_view(table, name, _entry_source(
                name, "providers", file_document, versions), stored)
                for name in table.providers],
            "models": models, "health": states, "live": live,
        }

    async def change_route(self, kind: str, name: str, entry: dict[str, Any] | None,
                           note: str = "") -> RouteVersion:
        """Create, edit or (``entry`` None) delete one provider or model alias."""
        section = ROUTE_KINDS.get(kind)
        if section is None:
            raise Invalid(f"kind: expected provider or model, got {kind!r}")
        if not name.strip():
            raise Invalid("a route needs a name")
        _, overlay = await self._overlay()
        entries = dict(overlay.get(section) or {})
        before = entries.get(name, (self.settings.routes.get(section) or {}).get(name))
        in_file = name in (self.settings.routes.get(section) or {})
        if entry is None and name not in entries and not in_file:
            raise NotFound(f"no {kind} named {name!r}")
        if entry is None and not in_file:
            entries.pop(name)
        else:
            entries[name] = entry  # None over a file entry removes it
        document = {**overlay, section: entries}
        return await self._save(document, f"route.{'delete' if entry is None else 'change'}",
                                f"route:{kind}:{name}", {name: before}, {name: entry}, note)

    async def rollback_routes(self, version: int, note: str = "") -> RouteVersion:
        old = await self.store.route_version(whole_number(version, "version", 1, INTEGER_MAX))
        if old is None:
            raise NotFound(f"no routes version {version}")
        latest, _ = await self._overlay()
        return await self._save(
            dict(old.document), "route.rollback", "routes",
            {"version": latest.version if latest else None}, {"version": version},
            note or f"rollback to version {version}")

    async def _save(self, document: dict[str, Any], action: str, target: str,
                    before: dict[str, Any], after: dict[str, Any], note: str) -> RouteVersion:
        table = self._table(document)

        def audit(number: int) -> Any:
            return self.event(action, target, before, {**after, "route_version": number})

        saved = await self.store.add_route_version(
            document, created_by=self.actor, created_at=self.clock(), note=note, audit=audit)
        await self._apply(table)
        return saved

    async def _apply(self, table: RouteTable) -> None:
        """This process serves the new version before the change is answered (other
        replicas find it in the store within their route source's poll)."""
        if self.gateway is None:
            return
        source = getattr(self.gateway, "routes", None)
        if source is not None and hasattr(source, "check"):
            await source.check()  # the gateway's own path: versions, sources, stored keys
        else:
            self.gateway.router.replace_table(table)

    async def route_versions(self, limit: int = 50) -> list[RouteVersion]:
        return await self.store.route_versions(limit=limit)

    # ---- provider keys --------------------------------------------------------------

    def _box(self) -> SecretBox:
        if not self.settings.secret_key:
            raise NotConfigured("LLM_GATEWAY_SECRET_KEY is not set: provider keys are only "
                                "ever stored encrypted under it")
        try:
            return SecretBox.from_secret(self.settings.secret_key)
        except SecretKeyError as exc:
            raise NotConfigured(str(exc)) from None

    def _open(self, box: SecretBox | None, stored: StoredProviderKey) -> str | None:
        if box is None:
            return None
        try:
            return box.open(stored.nonce, stored.ciphertext,
                            context=provider_key_context(stored.name))
        except CannotDecrypt:
            return None

    def _masked(self, box: SecretBox | None, stored: StoredProviderKey) -> str | None:
        plaintext = self._open(box, stored)
        return None if plaintext is None else mask_secret(plaintext)

    async def set_provider_key(self, name: str, plaintext: str) -> dict[str, Any]:
        plaintext = plaintext.strip()
        if not name.strip() or not plaintext:
            raise Invalid("a provider key needs a provider name and a key")
        box = self._box()
        nonce, ciphertext = box.seal(plaintext, context=provider_key_context(name))
        now = self.clock()
        old = await self.store.provider_key(name)
        stored = StoredProviderKey(name, nonce, ciphertext, old.created_at if old else now, now)
        # The event masks both; an old key sealed under another secret shows as null.
        before = {"key": self._open(box, old)} if old else None
        await self.store.set_provider_key(stored, audit=self.event(
            "provider_key.set", f"provider:{name}", before, {"key": plaintext}))
        return self._provider_key_view(box, stored)

    def _provider_key_view(self, box: SecretBox | None,
                           stored: StoredProviderKey) -> dict[str, Any]:
        return {"name": stored.name, "key": self._masked(box, stored),
                "created_at": stored.created_at, "updated_at": stored.updated_at}

    async def provider_keys(self) -> list[dict[str, Any]]:
        """Stored keys, masked (``key`` is None when LLM_GATEWAY_SECRET_KEY is missing or
        is not the one they were sealed under)."""
        try:
            box: SecretBox | None = self._box()
        except NotConfigured:
            box = None
        return [self._provider_key_view(box, key) for key in await self.store.provider_keys()]

    async def delete_provider_key(self, name: str) -> None:
        old = await self.store.provider_key(name)
        if old is None:
            raise NotFound(f"no stored key for provider {name!r}")
        await self.store.delete_provider_key(name, audit=self.event(
            "provider_key.delete", f"provider:{name}", {"key": "(stored)"}, None))
