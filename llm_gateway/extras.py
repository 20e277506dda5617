"""The optional parts and the extra that installs each: the core installs lean (`serve` on
SQLite), and a setting that needs a part not installed fails with one line saying which
extra to install, instead of a ModuleNotFoundError from deep inside."""

from __future__ import annotations

import importlib
from types import ModuleType

from llm_gateway.config import ConfigError

# extra -> (the module it provides, the setting or command that needs it)
EXTRAS = {
    "sidecar": ("mitmproxy", "llm-gateway sidecar"),
    "postgres": ("psycopg", "DATABASE_URL (postgresql://)"),
    "redis": ("redis", "REDIS_URL"),
    "otel": ("opentelemetry.exporter.otlp.proto.http", "OTEL_EXPORTER_OTLP_ENDPOINT"),
    "jwt": ("jwt", "JWT_JWKS_URL / JWT_PUBLIC_KEY"),
}


class MissingExtra(ConfigError):
    """A part of the gateway that the settings ask for is not installed."""

    def __init__(self, extra: str, missing: str) -> None:
        super().__init__(EXTRAS[extra][1], f"needs the `{extra}` extra ({missing} is not "
                                           f"installed): pip install 'llm-gateway[{extra}]'")
        self.extra = extra


def need(extra: str) -> ModuleType:
    """The extra's module, imported; MissingExtra when it (or what it needs) is absent."""
    try:
        return importlib.import_module(EXTRAS[extra][0])
    except ModuleNotFoundError as exc:
        raise MissingExtra(extra, exc.name or EXTRAS[extra][0]) from None
