"""`llm-gateway routes show`: the routes the settings file and the admin overlay make, as
the running gateways take them, where each comes from, and each target's state when the
gateways share it.

This command is a process of its own: it reads what the gateways read (the file, the
database's latest route version, stored keys), not a gateway's memory. So it names the
routes by what they are made of (``FILE + db v3`` and a digest, which every gateway logs
with each version it takes), never by a version number, which each gateway process counts
for itself. Health is shared only through Redis (or a `serve --workers` file): without
it each gateway process judges on its own, and this command says it cannot know.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from typing import Any

from llm_gateway.cli.common import settings_from
from llm_gateway.wiring import build_gateway

UNKNOWN = "unknown"
PER_PROCESS = ("per gateway process, not shared: see /readyz or /admin/v1/routes on each "
               "running gateway")


def register(commands: Any) -> None:
    routes = commands.add_parser("routes", help="the routes in force").add_subparsers(
        dest="routes_command", required=True)
    show = routes.add_parser("show", help="providers, aliases, targets and their health")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.set_defaults(handler=cmd_routes_show)


async def _view(args: argparse.Namespace) -> dict[str, Any]:
    # Its own "version 1 in force" would read as a gateway's; a refusal is still said.
    logging.getLogger("llm_gateway.routes").setLevel(logging.WARNING)
    gateway = build_gateway(settings_from(args))
    try:
        await gateway.store.migrate()
        await gateway.routes.start()
        shared = gateway.shared_health
        known = shared is not None and await shared.refresh()
        health = ("shared by the running gateways" if known else PER_PROCESS if shared is None
                  else "unknown: the shared health store did not answer")
        view = gateway.routes_view()
        view.pop("version", None)  # this process's own count: means nothing elsewhere
        latest = getattr(gateway.store, "latest_route_version", None)
        database = await latest() if latest is not None else None
        if not known:
            for model in view["models"].values():  # type: ignore[attr-defined]
                for target in model["targets"]:
                    target["state"] = UNKNOWN
        return {"routes": gateway.routes.origin, "digest": gateway.routes.digest,
                "database_version": database.version if database else None,
                "health": health, **view}
    finally:
        await gateway.close()


def cmd_routes_show(args: argparse.Namespace) -> int:
    view = asyncio.run(_view(args))
    if args.json:
        print(json.dumps(view, indent=2))
        return 0
    print(f"routes {view['routes']} (digest {view['digest']}; default provider "
          f"{view['default_provider']}, unknown models: {view['unknown_models']})")
    if view["refused"]:
        print(f"refused, the routes above keep serving: {view['refused']}")
    print(f"health: {view['health']}")
    for name, provider in view["providers"].items():
        print(f"provider {name:<16} {provider['profile']:<8} {provider['base_url']}  "
              f"[{provider['source']}]")
    for name, model in view["models"].items():
        print(f"model {name} [{model['source']}]")
        for target in model["targets"]:
            print(f"  -> {target['provider']}/{target['model']:<28} weight {target['weight']:<4} "
                  f"priority {target['priority']}  {target['state'].upper()}")
    return 0
