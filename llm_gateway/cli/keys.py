"""`llm-gateway keys`: create, list, show, update, disable, enable, revoke and rotate
gateway keys, through the admin service (so each change is audited as ``cli``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from llm_gateway.admin.service import CLI_ACTOR, AdminService, key_fields, key_state
from llm_gateway.cli.admin import run_admin
from llm_gateway.cli.common import EXIT_CONFIG, settings_from, with_store
from llm_gateway.config import Settings
from llm_gateway.keys import (
    DEFAULT_RATE_LIMIT,
    KeyRecord,
    parse_duration,
    parse_rate_limit,
)
from llm_gateway.stores import Store

KEY_HELP = "the key's prefix (as `keys list` shows it) or id"

def register(commands: Any) -> None:
    keys = commands.add_parser("keys", help="manage gateway keys").add_subparsers(
        dest="keys_command", required=True)
    create = keys.add_parser("create", help="create a key and print it once")
    create.add_argument("--name", required=True, help="what the key is for (shown in lists)")
    create.add_argument("--subject", help="who the key belongs to (default: its name)")
    create.add_argument("--rate-limit", default="{}/{}".format(*DEFAULT_RATE_LIMIT),
                        metavar="N/SECONDS", help="at most N requests per SECONDS")
    create.add_argument("--burst", metavar="N", help=_BURST_HELP)
    create.add_argument("--models", help="comma-separated allowed models (default: all)")
    create.add_argument("--expires-in", metavar="DURATION", help="e.g. 30d, 12h")
    create.add_argument("--json", action="store_true", help="print JSON instead of a table")
    create.set_defaults(handler=cmd_keys_create)
    listing = keys.add_parser("list", help="list keys (prefixes only, never keys)")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(handler=cmd_keys_list)
    show = keys.add_parser("show", help="one key's settings and state")
    show.add_argument("key", metavar="PREFIX|ID", help=KEY_HELP)
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.set_defaults(handler=cmd_keys_show)
    _register_update(keys)
    for name, help_text in (("disable", "refuse a key until it is enabled again"),
                            ("enable", "accept a disabled key again (never a revoked one)"),
                            ("revoke", "revoke a key")):
        command = keys.add_parser(name, help=help_text)
        command.add_argument("key", metavar="PREFIX|ID", help=KEY_HELP)
        command.set_defaults(handler=_STATE_COMMANDS[name])
    rotate = keys.add_parser("rotate", help="issue a new key and revoke the old one")
    rotate.add_argument("key", metavar="PREFIX|ID", help=KEY_HELP)
    rotate.add_argument("--json", action="store_true", help="print JSON instead of a table")
    rotate.set_defaults(handler=cmd_keys_rotate)


def _register_update(keys: Any) -> None:
    update = keys.add_parser("update", help="change a key's name, subject, limit, models "
                                            "or expiry")
    update.add_argument("key", metavar="PREFIX|ID", help=KEY_HELP)
    update.add_argument("--name", help="a new name")
    update.add_argument("--subject", help="a new subject (team or user) id")
    update.add_argument("--rate-limit", metavar="N/SECONDS",
                        help="a new request limit: N requests per SECONDS")
    burst = update.add_mutually_exclusive_group()
    burst.add_argument("--burst", metavar="N", help=_BURST_HELP)
    burst.add_argument("--no-burst", action="store_true", help="burst = the limit again")
    models = update.add_mutually_exclusive_group()
    models.add_argument("--models", help="comma-separated allowed models")
    models.add_argument("--all-models", action="store_true", help="allow every model")
    expiry = update.add_mutually_exclusive_group()
    expiry.add_argument("--expires-in", metavar="DURATION", help="from now, e.g. 30d")
    expiry.add_argument("--no-expiry", action="store_true", help="the key no longer expires")
    update.add_argument("--json", action="store_true", help="print JSON instead of a table")
    update.set_defaults(handler=cmd_keys_update)


_BURST_HELP = ("requests the key may send at once under RATE_LIMIT_ALGORITHM=token-bucket "
               "(its bucket's capacity, refilled at N per SECONDS; default: N)")


def _burst(text: str) -> int:
    try:
        burst = int(text)
    except ValueError:
        burst = 0
    if burst <= 0:
        raise ValueError(f"expected --burst as a whole number above 0, got {text!r}")
    return burst


def _limit_line(record: KeyRecord) -> str:
    burst = f", burst {record.rate_limit_burst}" if record.rate_limit_burst else ""
    return (f"limit:   {record.rate_limit_requests} requests / "
            f"{record.rate_limit_window_seconds}s{burst}")


def _models(text: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in text.split(",") if m.strip())


async def create_key(
    settings: Settings, *, name: str, subject_id: str | None = None,
    rate_limit: tuple[int, int] = DEFAULT_RATE_LIMIT, models: tuple[str, ...] = (),
    expires_at: float | None = None,
) -> tuple[KeyRecord, str]:
    async def work(store: Store) -> tuple[KeyRecord, str]:
        service = AdminService(store, actor=CLI_ACTOR, settings=settings)  # type: ignore[arg-type]
        return await service.create_key(name=name, subject_id=subject_id,
                                        rate_limit=rate_limit, models=models,
                                        expires_at=expires_at)

    return await with_store(settings, work)


def _print_new_key(record: KeyRecord, key: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({**key_fields(record), "key": key}))
        return
    print(f"id:      {record.id}")
    print(f"name:    {record.name} (subject {record.subject_id})")
    print(_limit_line(record))
    print(f"models:  {', '.join(record.allowed_models) or 'all'}")
    print("The key is shown once; store it now:")
    print(key)


def cmd_keys_create(args: argparse.Namespace) -> int:
    try:
        rate_limit = parse_rate_limit(args.rate_limit)
        expires_at = time.time() + parse_duration(args.expires_in) if args.expires_in else None
        burst = _burst(args.burst) if args.burst is not None else None
    except ValueError as exc:
        print(f"llm-gateway keys create: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    models = _models(args.models) if args.models else ()
    status, created = run_admin(args, "keys create", lambda service: service.create_key(
        name=args.name, subject_id=args.subject, rate_limit=rate_limit, models=models,
        expires_at=expires_at, burst=burst,
    ))
    if created is not None:
        _print_new_key(*created, args.json)
    return status


def cmd_keys_list(args: argparse.Namespace) -> int:
    records: list[KeyRecord] = asyncio.run(
        with_store(settings_from(args), lambda store: store.list_keys())
    )
    if args.json:
        print(json.dumps([key_fields(r) for r in records]))
        return 0
    print(f"{'PREFIX':<13} {'NAME':<20} {'SUBJECT':<20} {'STATE':<8} {'LIMIT':<10} MODELS")
    now = time.time()
    for r in records:
        state = r.refusal(now) or "active"
        limit = f"{r.rate_limit_requests}/{r.rate_limit_window_seconds}s"
        print(f"{r.prefix:<13} {r.name[:20]:<20} {r.subject_id[:20]:<20} {state:<8} {limit:<10} "
              f"{','.join(r.allowed_models) or 'all'}")
    return 0


def _print_key(record: KeyRecord, as_json: bool) -> None:
    state = key_state(record, time.time())
    if as_json:
        print(json.dumps({**key_fields(record), "state": state}))
        return
    expires = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(record.expires_at)) \
        if record.expires_at else "never"
    print(f"id:      {record.id}")
    print(f"prefix:  {record.prefix}…")
    print(f"name:    {record.name} (subject {record.subject_id})")
    print(f"state:   {state}")
    print(_limit_line(record))
    print(f"models:  {', '.join(record.allowed_models) or 'all'}")
    print(f"expires: {expires}")


def cmd_keys_show(args: argparse.Namespace) -> int:
    status, record = run_admin(args, "keys show", lambda service: service.find_key(args.key))
    if record is not None:
        _print_key(record, args.json)
    return status


def cmd_keys_update(args: argparse.Namespace) -> int:
    fields: dict[str, Any] = {}
    try:
        if args.rate_limit:
            limit = parse_rate_limit(args.rate_limit)
            fields["rate_limit_requests"], fields["rate_limit_window_seconds"] = limit
        if args.expires_in:
            fields["expires_at"] = time.time() + parse_duration(args.expires_in)
        if args.burst is not None or args.no_burst:
            fields["rate_limit_burst"] = None if args.no_burst else _burst(args.burst)
    except ValueError as exc:
        print(f"llm-gateway keys update: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.no_expiry:
        fields["expires_at"] = None
    if args.models is not None or args.all_models:
        fields["allowed_models"] = () if args.all_models else _models(args.models)
    for option, field in (("name", "name"), ("subject", "subject_id")):
        if getattr(args, option) is not None:
            fields[field] = getattr(args, option)
    status, record = run_admin(args, "keys update",
                               lambda service: service.update_key(args.key, fields))
    if record is not None:
        _print_key(record, args.json)
    return status


def _state_command(name: str) -> Any:
    def command(args: argparse.Namespace) -> int:
        def work(service: AdminService) -> Any:
            if name == "revoke":
                return service.revoke_key(args.key)
            return service.set_key_enabled(args.key, name == "enable")

        status, record = run_admin(args, f"keys {name}", work)
        if record is None:
            return status
        if name == "revoke":
            print(f"revoked {record.prefix}… ({record.name}); every gateway refuses it within "
                  "seconds")
        else:
            print(f"{name}d {record.prefix}… ({record.name}); every gateway sees it within "
                  "seconds")
        return status

    return command


_STATE_COMMANDS = {name: _state_command(name) for name in ("disable", "enable", "revoke")}


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    status, rotated = run_admin(args, "keys rotate",
                                lambda service: service.rotate_key(args.key))
    if rotated is None:
        return status
    _print_new_key(*rotated, args.json)
    return 0
