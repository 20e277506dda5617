"""Where the live routes come from, and how they change without a restart.

The settings file's route sections are the base; the admin plane's latest overlay (in the
database) goes on top; provider keys stored encrypted fill providers whose key no
variable gives. The file is looked at every ``POLL_SECONDS`` (and at once on SIGHUP,
through ``reload_now``): a changed file or overlay becomes a new numbered version, logged;
a bad one is refused with its reason on one line (at ERROR, and kept as ``last_error``),
and the last good routes keep serving. Bad is whatever would stop the gateway at start-up
(a file that cannot be read, is not YAML, holds an unknown setting, routes that cannot
serve), and a file that lost the route sections the gateway started with (an emptied or
truncated file: going back to the ``VENICE_*`` provider takes a restart). Requests in
flight keep the plan they were admitted with.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from llm_gateway.config import ConfigError, Secret, Settings, load_settings
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
        # The file's last stamp and what it held: read again only when it changes.
        self._file: tuple[Any, Mapping[str, Any] | str] | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.version = router.table.version
        self.last_error: str | None = None
        # What the version in force was made of, the same in every process that took
        # the same file and database version (each numbers its versions itself):
        # "FILE + db v3", and a digest of the route document.
        self.origin = self._where(None)
        self.digest = route_digest(settings.routes)

    async def start(self) -> None:
        await self.check()
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self._watch())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def reload_now(self) -> None:
        """Look again at once (SIGHUP; an admin change in this process); from any thread."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to wake
                self._loop.call_soon_threadsafe(self._wake.set)

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
            if isinstance(file_routes, str):
                raise RouteError(file_routes)
            document = merge_routes(file_routes, overlay["document"]) if overlay else file_routes
            table = await self._build(document, file_routes, overlay)
        except RouteError as exc:
            self.last_error = " ".join(str(exc).split())  # one line, whatever YAML said
            log.error("routes: refused %s (%s); still serving version %d", self._where(overlay),
                      self.last_error, self.version)
            return False
        self.version += 1
        self.last_error = None
        self.origin, self.digest = self._where(overlay), route_digest(document)
        self._router.replace_table(dataclasses.replace(table, version=self.version))
        log.info("routes: version %d in force (%s, digest %s: %d providers, %d models)",
                 self.version, self.origin, self.digest, len(table.providers),
                 len(table.models))
        return True

    def _read_file(self) -> tuple[Any, Mapping[str, Any] | str]:
        """The file's stamp, and its route sections; or why the file cannot be taken."""
        path = self._settings.config_file
        if not path:
            return None, self._settings.routes
        try:
            stat = Path(path).stat()
        except OSError as exc:
            return ("missing", exc.strerror), f"LLM_GATEWAY_CONFIG: cannot read {path}: " \
                                               f"{exc.strerror}"
        stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if self._file is None or self._file[0] != stamp:
            self._file = stamp, self._file_routes(path)
        return self._file

    def _file_routes(self, path: str) -> Mapping[str, Any] | str:
        try:
            # As at start-up: the file must still load, whole, for the next restart.
            routes = load_settings(self._environ, path).routes
        except ConfigError as exc:
            return str(exc)
        except ValueError as exc:  # bytes that are no text (UnicodeDecodeError)
            return f"LLM_GATEWAY_CONFIG: cannot read {path}: {exc}"
        started = self._settings.routes
        lost = ("route sections" if started and not routes else
                "providers: section" if started.get("providers") and not routes.get("providers")
                else None)
        if lost:
            return (f"{path}: no {lost} any more, as at start-up there were (an emptied or "
                    f"truncated file?); going back to the VENICE_* provider takes a restart")
        return routes

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

    async def _build(self, document: Mapping[str, Any], file_routes: Mapping[str, Any],
                     overlay: dict[str, Any] | None) -> RouteTable:
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


def route_digest(document: Mapping[str, Any]) -> str:
    """A short fingerprint of a route document: equal in every process that reads the same
    routes, whatever number each gave its version."""
    canonical = json.dumps(document, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


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
