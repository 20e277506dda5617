"""`llm-gateway routes show`: the routes the settings file and the admin overlay make,
where each comes from, and, from Redis when replicas share health, each target's state."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from llm_gateway.cli.common import settings_from
from llm_gateway.wiring import build_gateway


def register(commands: Any) -> None:
    routes = commands.add_parser("routes", help="the routes in force").add_subparsers(
        dest="routes_command", required=True)
    show = routes.add_parser("show", help="providers, aliases, targets and their health")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=cmd_routes_show)


async def _view(args: argparse.Namespace) -> dict[str, Any]:
    gateway = build_gateway(settings_from(args))
    try:
        await gateway.store.migrate()
        await gateway.routes.start()
        if gateway.shared_health is not None:
            await gateway.shared_health.refresh()
        return gateway.routes_view()
    finally:
        await gateway.close()


def cmd_routes_show(args: argparse.Namespace) -> int:
    view = asyncio.run(_view(args))
    if args.json:
        print(json.dumps(view, indent=2))
        return 0
    print(f"routes version {view['version']} (default provider {view['default_provider']}, "
          f"unknown models: {view['unknown_models']})")
    if view["refused"]:
        print(f"last change refused: {view['refused']}")
    for name, provider in view["providers"].items():
        print(f"provider {name:<16} {provider['profile']:<8} {provider['base_url']}  "
              f"[{provider['source']}]")
    for name, model in view["models"].items():
        print(f"model {name} [{model['source']}]")
        for target in model["targets"]:
            print(f"  -> {target['provider']}/{target['model']:<28} weight {target['weight']:<4} "
                  f"priority {target['priority']}  {target['state'].upper()}")
    return 0
