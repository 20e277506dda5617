"""`llm-gateway reconcile`: the provider's own usage and cost report against the gateway's
records, per UTC day and model. Exit 0 when every compared figure is within the
tolerance, 1 when one is beyond it, 2 when it cannot tell (a wrong argument, no admin
key, the provider's report unreadable). Each run also keeps each model's drift in the
database, which every gateway's /metrics exports (llm_gateway_reconcile_drift_ratio)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from llm_gateway.billing.provider_reports import LEDGERS, ledger_for
from llm_gateway.billing.reconcile import (
    Reconciliation,
    ToleranceError,
    metric_drifts,
    parse_tolerance,
    reconcile,
)
from llm_gateway.billing.reconcile_records import recorded
from llm_gateway.billing.reconcile_render import as_json, as_table
from llm_gateway.billing.report_client import ReportFetchError, ReportSource, fetch_billed
from llm_gateway.cli.common import EXIT_CONFIG, EXIT_FAILED, settings_from
from llm_gateway.config import Settings
from llm_gateway.routing.table import ProviderConfig
from llm_gateway.stores import StoreUnavailable
from llm_gateway.wiring import build_gateway

COMMAND = "llm-gateway reconcile"
MAX_DAYS = 366


def register(commands: Any) -> None:
    command = commands.add_parser(
        "reconcile", help="compare a provider's own usage and cost report with the records")
    command.add_argument("--provider", required=True, help="a provider of the routes")
    command.add_argument("--since", metavar="YYYY-MM-DD",
                         help="first UTC day (default: yesterday)")
    command.add_argument("--until", metavar="YYYY-MM-DD",
                         help="UTC day it ends before (default: today)")
    command.add_argument("--format", choices=("table", "json"), default="table",
                         help="a table for people, JSON lines for programs")
    command.add_argument("--tolerance", default="0.5%",
                         help="largest relative drift that reconciles: 0.5%% or 0.005 "
                              "(default 0.5%%)")
    command.set_defaults(handler=cmd_reconcile)


class Refused(Exception):
    """What stops a reconciliation before it compares: str() says it in one line."""


@dataclass(frozen=True, slots=True)
class Asked:
    provider: str
    since: date
    until: date
    tolerance: Decimal


def _day(text: str | None, default: date, option: str) -> date:
    if text is None:
        return default
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise Refused(f"{option}: expected a day as YYYY-MM-DD, got {text!r}") from None


def asked_from(args: argparse.Namespace, today: date) -> Asked:
    since = _day(args.since, today - timedelta(days=1), "--since")
    until = _day(args.until, max(today, since + timedelta(days=1)), "--until")
    if until <= since:
        raise Refused(f"--until ({until}) must be a later day than --since ({since})")
    if (until - since).days > MAX_DAYS:
        raise Refused(f"at most {MAX_DAYS} days at once, not {(until - since).days}")
    try:
        tolerance = parse_tolerance(args.tolerance)
    except ToleranceError as exc:
        raise Refused(str(exc)) from None
    return Asked(args.provider, since, until, tolerance)


def admin_key_of(provider: ProviderConfig, environ: Any) -> str:
    where = f"providers.{provider.name}.admin_key_env"
    if ledger_for(provider.profile) is None:
        raise Refused(f"provider {provider.name!r} (profile {provider.profile}) publishes no "
                      f"usage report the gateway reads; reconcile reads those of "
                      f"{', '.join(sorted(LEDGERS))}")
    if not provider.admin_key_env:
        raise Refused(f"{where} is not set: name the variable that holds the provider's "
                      "admin key (its usage and cost report needs one)")
    key = (environ.get(provider.admin_key_env) or "").strip()
    if not key:
        raise Refused(f"{provider.admin_key_env} is not set ({where}): the provider's "
                      "admin key")
    return key


def source_of(provider: ProviderConfig) -> ReportSource:
    auth = provider.auth_header
    return ReportSource(
        name=provider.name, base_url=provider.base_url,
        headers=tuple((name, value) for name, value in provider.headers if name != auth),
        connect_timeout=provider.timeouts.connect, read_timeout=provider.timeouts.read)


async def run(settings: Settings, asked: Asked, *, transport: Any = None) -> Reconciliation:
    """Read both sides, compare them, keep each model's drift."""
    logging.getLogger("llm_gateway.routes").setLevel(logging.WARNING)
    gateway = build_gateway(settings)
    try:
        await gateway.store.migrate()
        await gateway.routes.start()  # the file's routes and the admin overlay
        table = gateway.router.table
        provider = table.providers.get(asked.provider)
        if provider is None:
            raise Refused(f"--provider: no provider {asked.provider!r} in the routes "
                          f"(known: {', '.join(sorted(table.providers))})")
        environ = os.environ if settings.environ is None else settings.environ
        admin_key = admin_key_of(provider, environ)
        ledger = ledger_for(provider.profile)
        assert ledger is not None  # admin_key_of refused it otherwise
        billed = await fetch_billed(source_of(provider), ledger, admin_key, asked.since,
                                    asked.until, transport=transport)
        ours = await recorded(gateway.store, provider.name, asked.since, asked.until)
        result = reconcile(provider.name, billed, ours, since=asked.since.isoformat(),
                           until=asked.until.isoformat(), tolerance=asked.tolerance,
                           compared=ledger.compared)
        keep = getattr(gateway.store, "replace_reconcile_drift", None)
        if keep is not None:
            await keep(provider.name, metric_drifts(result), since=result.since,
                       until=result.until, at=time.time())
        return result
    finally:
        await gateway.close()


def cmd_reconcile(args: argparse.Namespace) -> int:
    try:
        asked = asked_from(args, datetime.now(UTC).date())
        result = asyncio.run(run(settings_from(args), asked))
    except (Refused, ReportFetchError) as exc:
        print(f"{COMMAND}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except StoreUnavailable as exc:
        print(f"{COMMAND}: the database did not answer ({exc})", file=sys.stderr)
        return EXIT_CONFIG
    print(json.dumps(as_json(result), indent=2) if args.format == "json"
          else as_table(result))
    return 0 if result.within else EXIT_FAILED
