"""Where the live routes come from, and how they change without a restart.

The settings file's route sections are the base; the admin plane's latest overlay (in the
database) goes on top; provider keys stored encrypted fill providers whose key no
variable gives. The file is looked at every ``POLL_SECONDS`` (and at once on SIGHUP,
through ``reload_now``): a changed file or overlay becomes a new numbered version, logged;
a bad one is refused with its reason on one line, and the last good routes keep serving.
Requests in flight keep the plan they were admitted with.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from llm_gateway.config import ROUTE_KEYS, Secret, Settings
from llm_gateway.routing.config import RouteError, merge_routes, parse_routes
from llm_gateway.routing.router import Router
from llm_gateway.routing.table import RouteTable

log = logging.getLogger("llm_gateway.routes")

POLL_SECONDS = 1.0
# Opens a stored provider key: (name, nonce, ciphertext) -> the key. Given by the wiring
# (it knows the secret key); None: stored keys are not used.
KeyOpener = Callable[[str, bytes, bytes], str]


class RouteSource:
    def __init__(self, settings: Settings, router: Router, store: object, *,
                 environ: Mapping[str, str] | None = None,
                 open_key: KeyOpener | None = None) -> None:
        self._settings = settings
        self._router = router
        self._store = store
        self._environ = os.environ if environ is None else environ
        self._open_key = open_key
        self._seen: tuple[Any, ...] | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.version = router.table.version
        self.last_error: str | None = None

    async def start(self) -> None:
        await self.check()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def reload_now(self) -> None:
        """Look again at once (SIGHUP; an admin change in this process)."""
        self._wake.set()

    async def _watch(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_SECONDS)
            self._wake.clear()
            try:
                await self.check()
            except Exception as exc:  # a store hiccup: the routes in force keep serving
                log.warning("routes: could not look for changes: %s", type(exc).__name__)

    async def check(self) -> bool:
        """Take a new version if the file or the overlay changed; True when one was taken."""
        file_stamp, file_routes = self._read_file()
        overlay = await self._overlay()
        stamp = (file_stamp, overlay.get("version") if overlay else None,
                 await self._keys_stamp())
        if stamp == self._seen:
            return False
        self._seen = stamp
        try:
            table = await self._build(file_routes, overlay)
        except RouteError as exc:
            self.last_error = str(exc)
            log.error("routes: refused %s (%s); still serving version %d", self._where(overlay),
                      exc, self.version)
            return False
        self.version += 1
        self.last_error = None
        self._router.replace_table(dataclasses.replace(table, version=self.version))
        log.info("routes: version %d in force (%s: %d providers, %d models)", self.version,
                 self._where(overlay), len(table.providers), len(table.models))
        return True

    def _read_file(self) -> tuple[Any, Mapping[str, Any]]:
        path = self._settings.config_file
        if not path:
            return None, self._settings.routes
        try:
            stat = Path(path).stat()
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            # Unreadable now (an editor's half-written file): keep what is in force.
            return ("unreadable", str(exc)), self._settings.routes
        routes = {k: loaded[k] for k in ROUTE_KEYS if isinstance(loaded, dict) and k in loaded}
        return (stat.st_mtime_ns, stat.st_size, stat.st_ino), routes

    async def _keys_stamp(self) -> tuple[tuple[str, float], ...]:
        """When each stored provider key last changed: a new key applies at once."""
        stored = getattr(self._store, "provider_keys", None)
        if self._open_key is None or stored is None:
            return ()
        return tuple((k.name, k.updated_at) for k in await stored())

    async def _overlay(self) -> dict[str, Any] | None:
        latest = getattr(self._store, "latest_route_version", None)
        if latest is None:
            return None
        version = await latest()
        if version is None:
            return None
        return {"version": version.version, "document": version.document}

    async def _build(self, file_routes: Mapping[str, Any],
                     overlay: dict[str, Any] | None) -> RouteTable:
        document = merge_routes(file_routes, overlay["document"]) if overlay else file_routes
        table = parse_routes(document, self._environ, self._settings)
        return dataclasses.replace(
            table, providers=MappingProxyType(await self._with_stored_keys(table)),
            sources=MappingProxyType(_sources(file_routes, overlay)),
        )

    async def _with_stored_keys(self, table: RouteTable) -> dict[str, Any]:
        providers = dict(table.providers)
        stored = getattr(self._store, "provider_keys", None)
        if self._open_key is None or stored is None:
            return providers
        for sealed in await stored():
            provider = providers.get(sealed.name)
            if provider is not None and not provider.api_key:
                key = self._open_key(sealed.name, sealed.nonce, sealed.ciphertext)
                providers[sealed.name] = dataclasses.replace(provider, api_key=Secret(key))
        return providers

    def _where(self, overlay: dict[str, Any] | None) -> str:
        base = self._settings.config_file or "settings"
        return f"{base} + db v{overlay['version']}" if overlay else base


def _sources(file_routes: Mapping[str, Any], overlay: dict[str, Any] | None) -> dict[str, str]:
    """Where each provider and model comes from: the file, or a database version."""
    sources: dict[str, str] = {}
    for section in ("providers", "models"):
        for name in file_routes.get(section) or {}:
            sources[f"{section}.{name}"] = "file"
        if overlay:
            for name, entry in (overlay["document"].get(section) or {}).items():
                key = f"{section}.{name}"
                if entry is None:
                    sources.pop(key, None)
                else:
                    sources[key] = f"db v{overlay['version']}"
    if not file_routes.get("providers") and not (overlay and overlay["document"].get("providers")):
        sources["providers.venice"] = "environment"
    return sources
