"""`llm-gateway keys`: create, list, revoke and rotate gateway keys."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from llm_gateway.cli.common import EXIT_CONFIG, EXIT_FAILED, settings_from, with_store
from llm_gateway.config import Settings
from llm_gateway.keys import (
    DEFAULT_RATE_LIMIT,
    KeyRecord,
    new_key_record,
    parse_duration,
    parse_rate_limit,
)
from llm_gateway.stores import Store


def register(commands: Any) -> None:
    keys = commands.add_parser("keys", help="manage gateway keys").add_subparsers(
        dest="keys_command", required=True)
    create = keys.add_parser("create", help="create a key and print it once")
    create.add_argument("--name", required=True)
    create.add_argument("--subject", help="who the key belongs to (default: its name)")
    create.add_argument("--rate-limit", default="{}/{}".format(*DEFAULT_RATE_LIMIT),
                        metavar="N/SECONDS")
    create.add_argument("--models", help="comma-separated allowed models (default: all)")
    create.add_argument("--expires-in", metavar="DURATION", help="e.g. 30d, 12h")
    create.add_argument("--json", action="store_true")
    create.set_defaults(handler=cmd_keys_create)
    listing = keys.add_parser("list", help="list keys (prefixes only, never keys)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=cmd_keys_list)
    revoke = keys.add_parser("revoke", help="revoke a key")
    revoke.add_argument("key", metavar="PREFIX|ID")
    revoke.set_defaults(handler=cmd_keys_revoke)
    rotate = keys.add_parser("rotate", help="issue a new key and revoke the old one")
    rotate.add_argument("key", metavar="PREFIX|ID")
    rotate.add_argument("--json", action="store_true")
    rotate.set_defaults(handler=cmd_keys_rotate)


async def create_key(
    settings: Settings, *, name: str, subject_id: str | None = None,
    rate_limit: tuple[int, int] = DEFAULT_RATE_LIMIT, models: tuple[str, ...] = (),
    expires_at: float | None = None,
) -> tuple[KeyRecord, str]:
    async def work(store: Store) -> tuple[KeyRecord, str]:
        record, key = new_key_record(
            name=name, subject_id=subject_id, now=time.time(),
            rate_limit_requests=rate_limit[0], rate_limit_window_seconds=rate_limit[1],
            allowed_models=models, expires_at=expires_at,
        )
        await store.insert_key(record)
        return record, key

    return await with_store(settings, work)


def _key_json(record: KeyRecord) -> dict[str, object]:
    return {
        "id": record.id, "prefix": record.prefix, "name": record.name,
        "subject_id": record.subject_id, "is_active": record.is_active,
        "revoked_at": record.revoked_at, "expires_at": record.expires_at,
        "created_at": record.created_at, "last_used_at": record.last_used_at,
        "rate_limit_requests": record.rate_limit_requests,
        "rate_limit_window_seconds": record.rate_limit_window_seconds,
        "allowed_models": list(record.allowed_models),
    }


def _print_new_key(record: KeyRecord, key: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({**_key_json(record), "key": key}))
        return
    print(f"id:      {record.id}")
    print(f"name:    {record.name} (subject {record.subject_id})")
    print(f"limit:   {record.rate_limit_requests} requests / {record.rate_limit_window_seconds}s")
    print(f"models:  {', '.join(record.allowed_models) or 'all'}")
    print("The key is shown once; store it now:")
    print(key)


def cmd_keys_create(args: argparse.Namespace) -> int:
    try:
        rate_limit = parse_rate_limit(args.rate_limit)
        expires_at = time.time() + parse_duration(args.expires_in) if args.expires_in else None
    except ValueError as exc:
        print(f"llm-gateway keys create: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    models = tuple(m.strip() for m in args.models.split(",") if m.strip()) if args.models else ()
    record, key = asyncio.run(create_key(
        settings_from(args), name=args.name, subject_id=args.subject, rate_limit=rate_limit,
        models=models, expires_at=expires_at,
    ))
    _print_new_key(record, key, args.json)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    records: list[KeyRecord] = asyncio.run(
        with_store(settings_from(args), lambda store: store.list_keys())
    )
    if args.json:
        print(json.dumps([_key_json(r) for r in records]))
        return 0
    print(f"{'PREFIX':<13} {'NAME':<20} {'SUBJECT':<20} {'STATE':<8} {'LIMIT':<10} MODELS")
    now = time.time()
    for r in records:
        state = r.refusal(now) or "active"
        limit = f"{r.rate_limit_requests}/{r.rate_limit_window_seconds}s"
        print(f"{r.prefix:<13} {r.name[:20]:<20} {r.subject_id[:20]:<20} {state:<8} {limit:<10} "
              f"{','.join(r.allowed_models) or 'all'}")
    return 0


async def _find(store: Store, prefix_or_id: str) -> KeyRecord:
    record = await store.find_key(prefix_or_id)
    if record is None:
        raise LookupError(f"no key with prefix or id {prefix_or_id!r}")
    return record


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    async def work(store: Store) -> KeyRecord:
        record = await _find(store, args.key)
        await store.revoke_key(record.id, time.time())
        return record

    try:
        record = asyncio.run(with_store(settings_from(args), work))
    except LookupError as exc:
        print(f"llm-gateway keys revoke: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"revoked {record.prefix}… ({record.name}); every gateway refuses it within seconds")
    return 0


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    async def work(store: Store) -> tuple[KeyRecord, str]:
        old = await _find(store, args.key)
        record, key = new_key_record(
            name=old.name, subject_id=old.subject_id, now=time.time(),
            rate_limit_requests=old.rate_limit_requests,
            rate_limit_window_seconds=old.rate_limit_window_seconds,
            allowed_models=old.allowed_models, expires_at=old.expires_at,
        )
        await store.insert_key(record)
        await store.revoke_key(old.id, time.time())
        return record, key

    try:
        record, key = asyncio.run(with_store(settings_from(args), work))
    except LookupError as exc:
        print(f"llm-gateway keys rotate: {exc}", file=sys.stderr)
        return EXIT_FAILED
    _print_new_key(record, key, args.json)
    return 0
