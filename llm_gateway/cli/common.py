"""What every command shares: settings from the environment and the file, a store opened
for the length of one command, and the exit statuses."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Awaitable, Callable

from llm_gateway.config import ConfigError, Settings, load_settings
from llm_gateway.stores import Store, open_store
from llm_gateway.telemetry.logs import JsonFormatter

EXIT_CONFIG = 2  # a setting or an argument is wrong
EXIT_FAILED = 1  # the command could not do what it was asked


def config_failure(exc: ConfigError) -> int:
    """Say, in one line on stderr, which setting cannot be used; the exit status. With
    ``LOG_FORMAT=json`` in the environment the line is a JSON log line like every other (the
    settings may not have loaded, so logging may not be set up: the variable is read here)."""
    if os.environ.get("LOG_FORMAT", "").strip().lower() == "json":
        record = logging.LogRecord("llm_gateway", logging.ERROR, __file__, 0,
                                   "cannot start: %s", (exc,), None)
        print(JsonFormatter().format(record), file=sys.stderr)
    else:
        print(f"llm-gateway: {exc}", file=sys.stderr)
    return EXIT_CONFIG


def settings_from(args: argparse.Namespace) -> Settings:
    return load_settings(os.environ, getattr(args, "config", None))


async def with_store[T](settings: Settings, work: Callable[[Store], Awaitable[T]]) -> T:
    """Open the store, migrate it, run ``work`` on it, close it."""
    store: Store = open_store(settings.database_url)
    try:
        await store.migrate()
        return await work(store)
    finally:
        await store.close()
