"""`llm-gateway admin-tokens` and `llm-gateway audit`; and how every admin command runs
the admin service (as actor ``cli``) and reports what it refused."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from llm_gateway.admin.service import (
    CLI_ACTOR,
    AdminError,
    AdminService,
    Invalid,
    NotConfigured,
    event_fields,
    token_fields,
)
from llm_gateway.cli.common import EXIT_CONFIG, EXIT_FAILED, settings_from, with_store
from llm_gateway.stores import Store


def run_admin[T](args: argparse.Namespace, command: str,
                 work: Callable[[AdminService], Awaitable[T]]) -> tuple[int, T | None]:
    """Run ``work`` on a service acting as ``cli``; (exit status, result). A refusal is
    one line on stderr: exit 2 for a bad argument or a missing setting, 1 otherwise."""
    settings = settings_from(args)

    async def on_store(store: Store) -> T:
        return await work(AdminService(store, actor=CLI_ACTOR,  # type: ignore[arg-type]
                                       settings=settings))

    try:
        return 0, asyncio.run(with_store(settings, on_store))
    except AdminError as exc:
        print(f"llm-gateway {command}: {exc}", file=sys.stderr)
        return (EXIT_CONFIG if isinstance(exc, Invalid | NotConfigured) else EXIT_FAILED), None


def when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def register(commands: Any) -> None:
    tokens = commands.add_parser("admin-tokens", help="manage admin API tokens").add_subparsers(
        dest="admin_tokens_command", required=True)
    create = tokens.add_parser("create", help="create an admin token and print it once")
    create.add_argument("--name", required=True, help="who holds it (the audit log says so)")
    create.add_argument("--json", action="store_true", help="print JSON instead of a table")
    create.set_defaults(handler=cmd_tokens_create)
    listing = tokens.add_parser("list", help="list admin tokens (prefixes only)")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(handler=cmd_tokens_list)
    revoke = tokens.add_parser("revoke", help="revoke an admin token")
    revoke.add_argument("token", metavar="PREFIX|ID",
                        help="the admin token's prefix (as `admin-tokens list` shows it) or id")
    revoke.set_defaults(handler=cmd_tokens_revoke)

    audit = commands.add_parser("audit", help="the audit log").add_subparsers(
        dest="audit_command", required=True)
    audit_list = audit.add_parser("list", help="audit events, newest first")
    audit_list.add_argument("--limit", type=int, default=50, help="how many events")
    audit_list.add_argument("--json", action="store_true", help="print JSON instead of a table")
    audit_list.set_defaults(handler=cmd_audit_list)


def cmd_tokens_create(args: argparse.Namespace) -> int:
    status, created = run_admin(args, "admin-tokens create",
                                lambda service: service.create_admin_token(args.name))
    if created is None:
        return status
    record, token = created
    if args.json:
        print(json.dumps({**token_fields(record), "token": token}))
        return 0
    print(f"id:      {record.id}")
    print(f"name:    {record.name}")
    print("The admin token is shown once; store it now:")
    print(token)
    return 0


def cmd_tokens_list(args: argparse.Namespace) -> int:
    status, records = run_admin(args, "admin-tokens list",
                                lambda service: service.list_admin_tokens())
    if records is None:
        return status
    if args.json:
        print(json.dumps([token_fields(r) for r in records]))
        return 0
    print(f"{'PREFIX':<14} {'NAME':<24} {'STATE':<8} CREATED")
    for r in records:
        state = "revoked" if r.revoked_at is not None else "active"
        print(f"{r.prefix:<14} {r.name[:24]:<24} {state:<8} {when(r.created_at)}")
    return 0


def cmd_tokens_revoke(args: argparse.Namespace) -> int:
    status, record = run_admin(args, "admin-tokens revoke",
                               lambda service: service.revoke_admin_token(args.token))
    if record is None:
        return status
    print(f"revoked admin token {record.prefix}… ({record.name})")
    return 0


def cmd_audit_list(args: argparse.Namespace) -> int:
    status, events = run_admin(args, "audit list",
                               lambda service: service.audit_events(limit=args.limit))
    if events is None:
        return status
    if args.json:
        print(json.dumps([event_fields(e) for e in events]))
        return 0
    print(f"{'WHEN':<21} {'ACTOR':<16} {'ACTION':<20} {'TARGET':<30} CHANGE")
    for e in events:
        change = json.dumps({"before": e.before, "after": e.after}, separators=(",", ":"),
                            ensure_ascii=False)
        print(f"{when(e.at):<21} {e.actor[:16]:<16} {e.action:<20} {e.target[:30]:<30} "
              f"{change[:120]}")
    return 0
