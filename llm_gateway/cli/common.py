"""What every command shares: settings from the environment and the file, a store opened
for the length of one command, and the exit statuses."""

from __future__ import annotations

import argparse
import os
from collections.abc import Awaitable, Callable

from llm_gateway.config import Settings, load_settings
from llm_gateway.stores import Store, open_store

EXIT_CONFIG = 2  # a setting or an argument is wrong
EXIT_FAILED = 1  # the command could not do what it was asked


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
