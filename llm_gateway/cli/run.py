"""Running things: serve, demo, migrate, the fake upstream, the sidecar, the injector."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from llm_gateway.cli.common import config_failure, settings_from
from llm_gateway.config import ConfigError, Settings, host_port_argument, parse_workers
from llm_gateway.extras import need
from llm_gateway.stores import open_store

if TYPE_CHECKING:
    from llm_gateway.adapters.server import Listeners


def register(commands: Any) -> None:
    serve = commands.add_parser(
        "serve", help="run the gateway (needs VENICE_API_KEY) and its admin listener")
    serve.add_argument(
        "--workers", metavar="N",
        help="worker processes sharing the listening socket: a number, or auto (the CPUs "
             "this process may use); default: WORKERS, else 1")
    serve.set_defaults(handler=cmd_serve)
    commands.add_parser("migrate", help="apply database migrations and exit").set_defaults(
        handler=cmd_migrate)

    fake = commands.add_parser("fake-upstream", help="run the bundled fake OpenAI/Venice server")
    fake.add_argument("--listen", type=host_port_argument, default="127.0.0.1:3002",
                      help="where it listens (point VENICE_BASE_URL at http://HOST:PORT/api/v1; "
                           "not 3001, serve's admin port)")
    fake.add_argument("--api-key", default="sk-fake-upstream",
                      help="the provider key it accepts (VENICE_API_KEY of the gateway)")
    fake.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between chunks")
    fake.add_argument("--chunks", type=int, default=8, help="chunks in each streamed answer")
    fake.add_argument("--usage-mode", choices=["venice", "openai", "anthropic", "gemini"],
                      default="venice", help="which provider it imitates (its usage, errors "
                                             "and API)")
    fake.add_argument("--auth-header", default="authorization",
                      help="where the fake expects its key: authorization (Bearer) or a header")
    _fake_billing_options(fake)
    fake.set_defaults(handler=cmd_fake_upstream)

    commands.add_parser(
        "sidecar", help="run the mitmproxy sidecar (HTTPS_PROXY or reverse proxy)", add_help=False
    ).set_defaults(handler=cmd_sidecar, passthrough=True)
    commands.add_parser(
        "injector", help="run the Kubernetes pod-injection webhook", add_help=False
    ).set_defaults(handler=cmd_injector, passthrough=True)


def cmd_serve(args: argparse.Namespace) -> int:
    # Imported here, before any worker is forked: each starts with them loaded (and
    # shares their memory until it writes to it).
    import llm_gateway.adapters.asgi
    import llm_gateway.admin.app
    import llm_gateway.wiring  # noqa: F401
    from llm_gateway.adapters.server import run_workers

    settings = serve_settings(args)
    if settings.workers == 1:
        return _serve(settings)
    return run_workers(settings, _worker, reload_settings=lambda: serve_settings(args),
                       side=[settings.admin_bind] if settings.admin_bind else [])


def serve_settings(args: argparse.Namespace) -> Settings:
    """The settings, with ``--workers`` over WORKERS, and the provider key they need."""
    settings = settings_from(args)
    if args.workers is not None:
        try:
            settings = dataclasses.replace(settings, workers=parse_workers(args.workers))
        except ValueError as exc:
            raise ConfigError("--workers", str(exc)) from None
    settings.require_provider_key()
    return settings


def _serve(settings: Settings, listeners: Listeners | None = None,
           started: Callable[[], None] | None = None) -> int:
    """One gateway process (or one worker, on its supervisor's ``listeners``)."""
    from llm_gateway.adapters.asgi import create_app
    from llm_gateway.adapters.server import run_server
    from llm_gateway.admin.app import create_admin_app
    from llm_gateway.wiring import build_gateway

    gateway = build_gateway(settings)
    # The admin listener shares the process, the event loop and the gateway (its key
    # cache: a change made there is seen here at once); never the public listener.
    admin = [(create_admin_app(gateway), settings.admin_bind)] if settings.admin_bind else []
    run_server(create_app(settings, gateway=gateway), settings, also=admin,
               listeners=listeners, on_reload=gateway.reload_routes, on_started=started)
    return 0


def _worker(settings: Settings, listeners: Listeners, started: Callable[[], None]) -> int:
    try:
        return _serve(settings, listeners, started)
    except ConfigError as exc:  # found while building the gateway (routes, prices)
        return config_failure(exc)


def cmd_migrate(args: argparse.Namespace) -> int:
    async def run() -> list[int]:
        store = open_store(settings_from(args).database_url)
        try:
            return await store.migrate()
        finally:
            await store.close()

    applied = asyncio.run(run())
    print(f"applied migrations: {', '.join(map(str, applied))}" if applied
          else "database is up to date")
    return 0


def _fake_billing_options(fake: argparse.ArgumentParser) -> None:
    """The fake's own bill: its usage and cost report APIs (llm-gateway reconcile reads them)."""
    fake.add_argument("--admin-key", default="sk-fake-admin",
                      help="the key its usage and cost report APIs take (and nothing else)")
    fake.add_argument("--ledger", action="store_true",
                      help="remember every billed request served, for its reports")
    skew = fake.add_mutually_exclusive_group()
    skew.add_argument("--over-bill", type=int, default=0, metavar="REQUESTS",
                      help="its reports bill this many requests it never served (implies "
                           "--ledger)")
    skew.add_argument("--under-bill", type=int, default=0, metavar="REQUESTS",
                      help="its reports leave out the last requests it served (implies "
                           "--ledger)")


def cmd_fake_upstream(args: argparse.Namespace) -> int:
    from llm_gateway.testing.fake_upstream import serve_fake_upstream

    host, port = args.listen
    if args.over_bill < 0 or args.under_bill < 0:
        return config_failure(ConfigError("--over-bill/--under-bill", "expected a count >= 0"))
    skew = args.over_bill - args.under_bill
    serve_fake_upstream(host, port, api_key=args.api_key, chunk_delay=args.chunk_delay,
                        chunk_count=args.chunks, usage_mode=args.usage_mode,
                        auth_header=args.auth_header, admin_key=args.admin_key,
                        ledger=args.ledger or skew != 0, billing_skew=skew)
    return 0


def cmd_sidecar(args: argparse.Namespace, rest: Sequence[str]) -> int:
    need("sidecar")
    from llm_gateway.adapters.sidecar import sidecar_main

    return sidecar_main(list(rest), settings_from(args))


def cmd_injector(args: argparse.Namespace, rest: Sequence[str]) -> int:
    from llm_gateway.k8s.main import injector_main

    return injector_main(list(rest))
