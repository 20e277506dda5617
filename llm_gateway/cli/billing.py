"""`llm-gateway prices` and `llm-gateway budgets`. Money is read as Decimal from the
argument's text, never through a float."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from decimal import Decimal
from typing import Any

from llm_gateway.admin.common import parse_time
from llm_gateway.admin.service import (
    CLI_ACTOR,
    OPTIONAL_RATES,
    AdminError,
    AdminService,
    Invalid,
    NotConfigured,
    budget_fields,
    price_fields,
)
from llm_gateway.billing.catalogue import (
    Change,
    Routed,
    catalogue_prices,
    listed_prices,
    plan_sync,
)
from llm_gateway.billing.model import RATE_FIELDS, BudgetScope, Price
from llm_gateway.billing.prices import PriceBook, merge_prices
from llm_gateway.cli.admin import run_admin, when
from llm_gateway.cli.common import EXIT_CONFIG, EXIT_FAILED, settings_from
from llm_gateway.engine import Gateway
from llm_gateway.routing.table import ProviderConfig, RouteTable
from llm_gateway.wiring import build_gateway

_USD_OPTIONS = ("daily_usd", "monthly_usd")
_COUNT_OPTIONS = ("daily_tokens", "monthly_tokens", "tokens_per_minute", "max_output_tokens")
_NO_LIMIT = "none"
# The options of a price's optional rates: (its field, what it is priced at when unset).
_OPTIONAL_RATE_OPTIONS = {
    "--cached-input": ("cached_input_per_mtok", "the input price"),
    "--cache-write": ("cache_write_per_mtok", "the input price"),
    "--cache-write-1h": ("cache_write_1h_per_mtok", "--cache-write, else the input price"),
}


_BUDGET_HELP = {
    "daily_usd": "USD a day (UTC)", "monthly_usd": "USD a calendar month (UTC)",
    "daily_tokens": "tokens a day (UTC)", "monthly_tokens": "tokens a calendar month (UTC)",
    "tokens_per_minute": "tokens a minute, as a bucket refilled continuously",
    "max_output_tokens": "the largest max_tokens one request may ask for (see --over-cap)",
}

def register(commands: Any) -> None:
    prices = commands.add_parser("prices", help="model prices (USD per million tokens)")
    prices_commands = prices.add_subparsers(dest="prices_command", required=True)
    set_price = prices_commands.add_parser("set", help="set a model's price from a moment on")
    set_price.add_argument("--provider", required=True,
                           help="the provider the price is for (as `providers list` names it)")
    set_price.add_argument("--model", required=True, help="the provider's model name")
    set_price.add_argument("--input", required=True, metavar="USD", help="per million tokens")
    set_price.add_argument("--output", required=True, metavar="USD", help="per million tokens")
    # Each rate a price may leave unset, by the option that sets it.
    for option, (name, fallback) in _OPTIONAL_RATE_OPTIONS.items():
        set_price.add_argument(option, dest=name, metavar="USD",
                               help=f"per million tokens (default: {fallback})")
    set_price.add_argument("--from", dest="effective_from", metavar="ISO8601",
                           help="when it takes effect (default: now)")
    set_price.set_defaults(handler=cmd_prices_set)
    list_prices = prices_commands.add_parser("list", help="every price")
    list_prices.add_argument("--json", action="store_true", help="print JSON instead of a table")
    list_prices.add_argument("--unpriced", action="store_true",
                             help="instead: every routed model without a price in force")
    list_prices.set_defaults(handler=cmd_prices_list)
    sync = prices_commands.add_parser(
        "sync", help="load the routed models' prices from the genai-prices catalogue (and a "
        "provider's own model list where it has prices); operator prices always win")
    sync.add_argument("--provider", help="only this provider's models")
    sync.add_argument("--dry-run", action="store_true", help="show the changes, write nothing")
    sync.set_defaults(handler=cmd_prices_sync)

    budgets = commands.add_parser("budgets", help="USD and token budgets of keys and subjects")
    budgets_commands = budgets.add_subparsers(dest="budgets_command", required=True)
    set_budget = budgets_commands.add_parser(
        "set", help=f"set limits (only those given change; '{_NO_LIMIT}' removes one)")
    _scope_options(set_budget, required=True)
    for name in (*_USD_OPTIONS, *_COUNT_OPTIONS):
        set_budget.add_argument(f"--{name.replace('_', '-')}", dest=name,
                                metavar="USD" if name in _USD_OPTIONS else "N",
                                help=_BUDGET_HELP[name])
    set_budget.add_argument("--over-cap", choices=["clamp", "reject"],
                            help="a max_tokens above the cap: lowered, or refused with 400")
    set_budget.add_argument("--stop-streams-at-budget", action=argparse.BooleanOptionalAction,
                            help="end a stream whose spend reaches the budget")
    set_budget.add_argument("--json", action="store_true", help="print JSON instead of a table")
    set_budget.set_defaults(handler=cmd_budgets_set)
    show = budgets_commands.add_parser("show", help="one budget, or all with their spend")
    _scope_options(show, required=False)
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.set_defaults(handler=cmd_budgets_show)


def _scope_options(parser: argparse.ArgumentParser, *, required: bool) -> None:
    scope = parser.add_mutually_exclusive_group(required=required)
    scope.add_argument("--key", metavar="PREFIX|ID", help="a gateway key, by prefix or id")
    scope.add_argument("--subject", metavar="ID", help="a subject (a team or user), by id")


def _scope(args: argparse.Namespace) -> tuple[BudgetScope, str]:
    if args.key is not None:
        return BudgetScope.KEY, args.key
    return BudgetScope.SUBJECT, args.subject


def cmd_prices_set(args: argparse.Namespace) -> int:
    def work(service: AdminService) -> Any:
        start = parse_time(args.effective_from, "--from") if args.effective_from else None
        return service.set_price(provider=args.provider, model=args.model,
                                 input_per_mtok=args.input, output_per_mtok=args.output,
                                 effective_from=start,
                                 **{name: getattr(args, name) for name in OPTIONAL_RATES})

    status, price = run_admin(args, "prices set", work)
    if price is not None:
        fields = price_fields(price)
        rates = [f"{label} {fields[name]}" for name, label in
                 (("input_per_mtok", "input"), ("output_per_mtok", "output"),
                  *OPTIONAL_RATES.items()) if fields[name] is not None]
        print(f"{price.provider}/{price.model}: {', '.join(rates)} USD per million tokens "
              f"from {when(price.effective_from)}")
    return status


def cmd_prices_list(args: argparse.Namespace) -> int:
    if args.unpriced:
        return cmd_prices_unpriced(args)
    status, prices = run_admin(args, "prices list", lambda service: service.prices())
    if prices is None:
        return status
    rows = [price_fields(p) for p in prices]
    if args.json:
        print(json.dumps(rows))
        return 0
    rates = ("input_per_mtok", "output_per_mtok", *OPTIONAL_RATES)
    headings = ("INPUT", "OUTPUT", "CACHE READ", "CACHE WRITE", "WRITE 1H")
    print(f"{'PROVIDER':<12} {'MODEL':<28} "
          + "".join(f"{heading:>12} " for heading in headings) + f"{'SOURCE':<10} FROM")
    for row in rows:
        above = row["long_context_above"]
        print(f"{row['provider'][:12]:<12} {row['model'][:28]:<28} "
              + "".join(f"{row[name] or '-':>12} " for name in rates)
              + f"{row['source']:<10} " + when(row["effective_from"])
              + ("" if above is None else f" (above {above} prompt tokens: "
                 + ", ".join(f"{row['long_context'][name] or '-'}" for name in rates) + ")"))
    return 0



def _routed(table: RouteTable) -> list[Routed]:
    """Every upstream model an alias routes to, with the aliases using it."""
    aliases: dict[tuple[str, str], list[str]] = {}
    for alias, route in table.models.items():
        for target in route.targets:
            if not target.passthrough:
                aliases.setdefault((target.provider, target.model), []).append(alias)
    return [Routed(provider=provider, profile=table.providers[provider].profile,
                   base_url=table.providers[provider].base_url, model=model,
                   aliases=tuple(names))
            for (provider, model), names in aliases.items()]


def _with_routes[T](args: argparse.Namespace, command: str,
                    work: Callable[[Gateway, AdminService], Awaitable[T]]) -> tuple[int, T | None]:
    """Run ``work`` with the routes the gateways take (the file and the admin overlay) and
    the admin service acting as ``cli``."""
    settings = settings_from(args)
    # Its own "version 1 in force" would read as a gateway's.
    logging.getLogger("llm_gateway.routes").setLevel(logging.WARNING)

    async def run() -> T:
        gateway = build_gateway(settings)
        try:
            await gateway.store.migrate()
            await gateway.routes.start()
            service = AdminService(gateway.store, actor=CLI_ACTOR,  # type: ignore[arg-type]
                                   settings=settings)
            return await work(gateway, service)
        finally:
            await gateway.close()

    try:
        return 0, asyncio.run(run())
    except AdminError as exc:
        print(f"llm-gateway {command}: {exc}", file=sys.stderr)
        return (EXIT_CONFIG if isinstance(exc, Invalid | NotConfigured) else EXIT_FAILED), None


def cmd_prices_unpriced(args: argparse.Namespace) -> int:
    async def work(gateway: Gateway, service: AdminService) -> list[dict[str, Any]]:
        book = PriceBook(merge_prices(gateway.seed_prices, await service.prices()))
        now = time.time()
        return [{"provider": r.provider, "model": r.model, "aliases": list(r.aliases)}
                for r in _routed(gateway.router.table)
                if book.price_at(r.provider, r.model, now) is None]

    status, rows = _with_routes(args, "prices list", work)
    if rows is None:
        return status
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'PROVIDER':<12} {'MODEL':<36} ALIASES")
    for row in rows:
        print(f"{row['provider'][:12]:<12} {row['model'][:36]:<36} {', '.join(row['aliases'])}")
    return 0


async def _listed(provider: ProviderConfig, notes: list[str]) -> Mapping[str, Any]:
    """The provider's model list (GET /models with its key), where it may publish prices
    (nothing, said in ``notes``, when it does not answer)."""
    import httpx  # only this command calls a provider itself: no gateway imports it

    headers = dict([*provider.headers, *provider.auth_headers()])
    try:
        async with httpx.AsyncClient(timeout=provider.timeouts.read) as client:
            answer = await client.get(provider.url("/models"), headers=headers)
            answer.raise_for_status()
            listed = answer.json()
    except (httpx.HTTPError, ValueError) as exc:
        notes.append(f"{provider.name}: its model list did not answer ({type(exc).__name__})")
        return {}
    return listed if isinstance(listed, Mapping) else {}


async def _proposed(routed: list[Routed], table: RouteTable,
                    notes: list[str]) -> list[Price]:
    """The catalogue's rows for each routed model; for a model the dataset does not know,
    its provider's listed price."""
    lists: dict[str, Mapping[str, Any]] = {}
    proposed: list[Price] = []
    now = round(time.time(), 6)
    for model in routed:
        rows = catalogue_prices(model)
        if rows is None:
            if model.provider not in lists:
                lists[model.provider] = await _listed(table.providers[model.provider], notes)
            listed = listed_prices(model, lists[model.provider], now)
            rows = [] if listed is None else [listed]
        if not rows:
            notes.append(f"{model.provider}/{model.model}: neither the catalogue nor the "
                         "provider's model list prices it")
        proposed.extend(rows)
    return proposed


def cmd_prices_sync(args: argparse.Namespace) -> int:
    async def work(gateway: Gateway, service: AdminService) -> tuple[list[Change], list[str]]:
        table = gateway.router.table
        if args.provider is not None and args.provider not in table.providers:
            raise Invalid(f"--provider: no provider {args.provider!r} in the routes")
        routed = [r for r in _routed(table) if args.provider in (None, r.provider)]
        notes: list[str] = []
        changes = plan_sync(await _proposed(routed, table, notes), await service.prices())
        if not args.dry_run:
            for change in changes:
                await service.sync_price(change.after, change.before)
        return changes, notes

    status, found = _with_routes(args, "prices sync", work)
    if found is None:
        return status
    changes, notes = found
    for change in changes:
        _print_change(change)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    done = "would change (--dry-run: nothing written)" if args.dry_run else "written"
    print(f"{len(changes)} price{'' if len(changes) == 1 else 's'} {done}")
    return 0


def _rate(value: Decimal | None) -> str:
    return "-" if value is None else format(value.normalize(), "f")


def _print_change(change: Change) -> None:
    """One model's change, old → new per rate (its long-context rates after)."""
    after, before = change.after, change.before
    print(f"{after.provider}/{after.model} ({after.source.value}, from "
          f"{when(after.effective_from)}){'' if before else ': new'}")
    tiers = [("", after, before)]
    if after.long_context is not None or (before and before.long_context is not None):
        above = after.long_context_above or (before.long_context_above if before else None)
        tiers.append((f" above {above}", after.long_context,
                      before.long_context if before else None))
    for label, new, old in tiers:
        for name in RATE_FIELDS:
            was = getattr(old, name) if old else None
            now = getattr(new, name) if new else None
            if was != now:
                print(f"  {name}{label}: {_rate(was)} → {_rate(now)}")


def _budget_changes(args: argparse.Namespace) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for name in (*_USD_OPTIONS, *_COUNT_OPTIONS):
        raw = getattr(args, name)
        if raw is None:
            continue
        if raw.strip().lower() == _NO_LIMIT:
            changes[name] = None
        elif name in _USD_OPTIONS:
            changes[name] = raw  # parsed as Decimal by the service
        else:
            try:
                changes[name] = int(raw)
            except ValueError:
                raise ValueError(f"--{name.replace('_', '-')}: expected a whole number or "
                                 f"'{_NO_LIMIT}', got {raw!r}") from None
    if args.over_cap is not None:
        changes["over_cap"] = args.over_cap
    if args.stop_streams_at_budget is not None:
        changes["stop_streams_at_budget"] = args.stop_streams_at_budget
    return changes


def cmd_budgets_set(args: argparse.Namespace) -> int:
    try:
        changes = _budget_changes(args)
    except ValueError as exc:
        print(f"llm-gateway budgets set: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    scope, ref = _scope(args)
    status, budget = run_admin(args, "budgets set",
                               lambda service: service.set_budget(scope, ref, changes))
    if budget is not None:
        _print_budgets([budget_fields(budget)], args.json, one=True)
    return status


def cmd_budgets_show(args: argparse.Namespace) -> int:
    if args.key is None and args.subject is None:
        status, rows = run_admin(args, "budgets show",
                                 lambda service: service.budgets_with_spend())
    else:
        scope, ref = _scope(args)

        async def one(service: AdminService) -> list[dict[str, Any]]:
            return [budget_fields(await service.budget(scope, ref))]

        status, rows = run_admin(args, "budgets show", one)
    if rows is not None:
        _print_budgets(rows, args.json, one=args.key is not None or args.subject is not None)
    return status


def _print_budgets(rows: list[dict[str, Any]], as_json: bool, *, one: bool) -> None:
    if as_json:
        print(json.dumps(rows[0] if one else rows))
        return
    for row in rows:
        print(f"{row['scope']} {row.get('label') or row['scope_id']}")
        for name in ("daily_usd", "monthly_usd", "daily_tokens", "monthly_tokens",
                     "tokens_per_minute", "max_output_tokens", "over_cap",
                     "stop_streams_at_budget"):
            value = row[name]
            print(f"  {name:<24} {'no limit' if value is None else value}")
        if "spent_today_usd" in row:
            print(f"  {'spent today (USD)':<24} {row['spent_today_usd']}")
            print(f"  {'spent this month (USD)':<24} {row['spent_month_usd']}")
        for name, rate in (row.get("burn") or {}).items():
            print(f"  {'burn rate ' + name:<24} {_burn_text(name, rate)}")


def _burn_text(limit: str, rate: Mapping[str, Any]) -> str:
    """``0.12 USD/h, runs out 2026-12-03 18:40:00Z``: a limit's rate now and when it is
    used up at that rate."""
    unit = "USD" if limit.endswith("_usd") else "tokens"
    if rate["exhausted"]:
        ends = "spent"
    elif rate["runs_out_at"] is None:
        ends = "does not run out this " + ("day" if limit.startswith("daily") else "month")
    else:
        ends = f"runs out {when(rate['runs_out_at'])}"
    return f"{rate['per_hour']} {unit}/h, {ends}"
