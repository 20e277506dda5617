"""`llm-gateway providers`: provider keys stored encrypted (AES-GCM under
LLM_GATEWAY_SECRET_KEY), shown only masked."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from llm_gateway.cli.admin import run_admin, when
from llm_gateway.cli.common import EXIT_CONFIG, settings_from


def register(commands: Any) -> None:
    providers = commands.add_parser("providers", help="provider keys, stored encrypted")
    sub = providers.add_subparsers(dest="providers_command", required=True)
    set_key = sub.add_parser("set-key", help="store NAME's key, read from stdin, encrypted")
    set_key.add_argument("name", metavar="NAME", help="the provider, as named in the routes")
    set_key.set_defaults(handler=cmd_set_key)
    listing = sub.add_parser("list", help="stored provider keys, masked")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(handler=cmd_list)


def cmd_set_key(args: argparse.Namespace) -> int:
    # Refused before reading anything: without the secret there is nowhere safe to put it.
    if not settings_from(args).secret_key:
        print("llm-gateway providers set-key: LLM_GATEWAY_SECRET_KEY is not set; provider "
              "keys are only ever stored encrypted under it", file=sys.stderr)
        return EXIT_CONFIG
    # From stdin, never an argument: arguments end up in shell history and `ps`.
    key = sys.stdin.readline().strip()
    if not key:
        print("llm-gateway providers set-key: no key on stdin", file=sys.stderr)
        return EXIT_CONFIG
    status, stored = run_admin(args, "providers set-key",
                               lambda service: service.set_provider_key(args.name, key))
    if stored is not None:
        print(f"stored the key of {stored['name']} ({stored['key']}), encrypted")
    return status


def cmd_list(args: argparse.Namespace) -> int:
    status, keys = run_admin(args, "providers list", lambda service: service.provider_keys())
    if keys is None:
        return status
    if args.json:
        print(json.dumps(keys))
        return 0
    print(f"{'PROVIDER':<20} {'KEY':<14} UPDATED")
    for key in keys:
        shown = key["key"] or "(needs LLM_GATEWAY_SECRET_KEY)"
        print(f"{key['name'][:20]:<20} {shown:<14} {when(key['updated_at'])}")
    return 0
