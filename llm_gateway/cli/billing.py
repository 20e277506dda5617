"""`llm-gateway prices` and `llm-gateway budgets`. Money is read as Decimal from the
argument's text, never through a float."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from llm_gateway.admin.common import parse_time
from llm_gateway.admin.service import OPTIONAL_RATES, AdminService, budget_fields, price_fields
from llm_gateway.billing.model import BudgetScope
from llm_gateway.cli.admin import run_admin, when
from llm_gateway.cli.common import EXIT_CONFIG

_USD_OPTIONS = ("daily_usd", "monthly_usd")
_COUNT_OPTIONS = ("daily_tokens", "monthly_tokens", "tokens_per_minute", "max_output_tokens")
_NO_LIMIT = "none"
# The options of a price's optional rates: (its field, what it is priced at when unset).
_OPTIONAL_RATE_OPTIONS = {
    "--cached-input": ("cached_input_per_mtok", "the input price"),
    "--cache-write": ("cache_write_per_mtok", "the input price"),
    "--cache-write-1h": ("cache_write_1h_per_mtok", "--cache-write, else the input price"),
}


def register(commands: Any) -> None:
    prices = commands.add_parser("prices", help="model prices (USD per million tokens)")
    prices_commands = prices.add_subparsers(dest="prices_command", required=True)
    set_price = prices_commands.add_parser("set", help="set a model's price from a moment on")
    set_price.add_argument("--provider", required=True)
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
    list_prices.add_argument("--json", action="store_true")
    list_prices.set_defaults(handler=cmd_prices_list)

    budgets = commands.add_parser("budgets", help="USD and token budgets of keys and subjects")
    budgets_commands = budgets.add_subparsers(dest="budgets_command", required=True)
    set_budget = budgets_commands.add_parser(
        "set", help=f"set limits (only those given change; '{_NO_LIMIT}' removes one)")
    _scope_options(set_budget, required=True)
    for name in (*_USD_OPTIONS, *_COUNT_OPTIONS):
        set_budget.add_argument(f"--{name.replace('_', '-')}", dest=name,
                                metavar="USD" if name in _USD_OPTIONS else "N")
    set_budget.add_argument("--over-cap", choices=["clamp", "reject"],
                            help="a max_tokens above the cap: lowered, or refused with 400")
    set_budget.add_argument("--stop-streams-at-budget", action=argparse.BooleanOptionalAction,
                            help="end a stream whose spend reaches the budget")
    set_budget.add_argument("--json", action="store_true")
    set_budget.set_defaults(handler=cmd_budgets_set)
    show = budgets_commands.add_parser("show", help="one budget, or all with their spend")
    _scope_options(show, required=False)
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=cmd_budgets_show)


def _scope_options(parser: argparse.ArgumentParser, *, required: bool) -> None:
    scope = parser.add_mutually_exclusive_group(required=required)
    scope.add_argument("--key", metavar="PREFIX|ID")
    scope.add_argument("--subject", metavar="ID")


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
          + "".join(f"{heading:>12} " for heading in headings) + "FROM")
    for row in rows:
        print(f"{row['provider'][:12]:<12} {row['model'][:28]:<28} "
              + "".join(f"{row[name] or '-':>12} " for name in rates)
              + when(row["effective_from"]))
    return 0


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

