"""Prices, budgets, subjects and usage through the admin service.

Spend comes from the billing package's reports (``usage_report``), the same aggregation
as ``llm-gateway usage report``: the admin plane never sums usage records itself.
Money is Decimal throughout, parsed from text, never from a float.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from llm_gateway.admin.common import (
    BIGINT_MAX,
    INTEGER_MAX,
    MONEY_MAX,
    Invalid,
    NotFound,
    ServiceBase,
    Unprocessable,
    changed,
    day_start,
    jsonable,
    key_fields,
    key_state,
    money_text,
    month_start,
    whole_number,
)
from llm_gateway.billing.alerts import budget_burn
from llm_gateway.billing.lookup import find_requests
from llm_gateway.billing.model import RATE_FIELDS, Budget, BudgetScope, OverCap, Price, money
from llm_gateway.billing.refusals import GROUPS as REFUSAL_GROUPS
from llm_gateway.billing.refusals import refusal_report
from llm_gateway.billing.reports import GROUPS as REPORT_GROUPS
from llm_gateway.billing.reports import is_group
from llm_gateway.keys import KeyRecord

# A price's rates that may be left unset (Price says what each then falls back to), with
# the name an error about each gives it.
OPTIONAL_RATES = {"cached_input_per_mtok": "cached input", "cache_write_per_mtok": "cache write",
                  "cache_write_1h_per_mtok": "1-hour cache write"}
BUDGET_FIELDS = ("daily_usd", "monthly_usd", "daily_tokens", "monthly_tokens",
                 "tokens_per_minute", "max_output_tokens", "over_cap", "stop_streams_at_budget")
_USD_FIELDS = ("daily_usd", "monthly_usd")
# Each count's (least, greatest): 0 is a limit of tokens (none may be spent) but no rate or
# cap; the greatest is what its Postgres column holds (max_output_tokens is INTEGER).
_COUNT_BOUNDS = {"daily_tokens": (0, BIGINT_MAX), "monthly_tokens": (0, BIGINT_MAX),
                 "tokens_per_minute": (1, BIGINT_MAX), "max_output_tokens": (1, INTEGER_MAX)}


def parse_money(value: Any, what: str) -> Decimal:
    """A non-negative USD amount from text (or an int); a float is refused: it is already
    rounded by the time it arrives."""
    if isinstance(value, float | bool):
        raise Unprocessable(
            f"{what}: give money as a decimal string such as \"0.15\", not {value!r}")
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise Unprocessable(f"{what}: expected a decimal amount, got {value!r}") from None
    if not amount.is_finite() or not 0 <= amount <= MONEY_MAX:
        raise Unprocessable(f"{what}: must be an amount from 0 to {MONEY_MAX}, got {value!r}")
    return money(amount)


def price_fields(price: Price) -> dict[str, Any]:
    return {
        "provider": price.provider, "model": price.model,
        "input_per_mtok": jsonable(price.input_per_mtok),
        "output_per_mtok": jsonable(price.output_per_mtok),
        **{name: jsonable(getattr(price, name)) for name in OPTIONAL_RATES},
        "effective_from": price.effective_from, "source": price.source.value,
        "long_context_above": price.long_context_above,
        "long_context": None if price.long_context is None else {
            name: jsonable(getattr(price.long_context, name)) for name in RATE_FIELDS},
    }


def budget_fields(budget: Budget) -> dict[str, Any]:
    return {"scope": budget.scope.value, "scope_id": budget.scope_id,
            **{name: jsonable(getattr(budget, name)) for name in BUDGET_FIELDS}}


def _budget_value(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name in _USD_FIELDS:
        return parse_money(value, name)
    if name in _COUNT_BOUNDS:
        least, greatest = _COUNT_BOUNDS[name]
        if type(value) is int and value == 0 < least:
            raise Invalid(f"{name}: must be > 0 (leave it unset for no limit)")
        return whole_number(value, name, least, greatest)
    if name == "over_cap":
        try:
            return OverCap(str(value))
        except ValueError:
            raise Invalid(f"over_cap: expected clamp or reject, got {value!r}") from None
    if not isinstance(value, bool):
        raise Invalid(f"{name}: expected true or false, got {value!r}")
    return value


def usage_report_function() -> Any:
    """billing.reports.usage_report, or None while the billing package has no reports."""
    try:
        return importlib.import_module("llm_gateway.billing.reports").usage_report
    except (ImportError, AttributeError):
        return None


class BillingOps(ServiceBase):
    # ---- prices ---------------------------------------------------------------------

    async def set_price(self, *, provider: str, model: str, input_per_mtok: Any,
                        output_per_mtok: Any, effective_from: float | None = None,
                        **optional_rates: Any) -> Price:
        """``optional_rates``: any of OPTIONAL_RATES (None or left out: unset)."""
        if not provider.strip() or not model.strip():
            raise Invalid("a price needs a provider and a model")
        if unknown := sorted(set(optional_rates) - set(OPTIONAL_RATES)):
            raise Invalid(f"a price has no rate {unknown[0]!r}")
        price = Price(
            provider=provider.strip(), model=model.strip(),
            input_per_mtok=parse_money(input_per_mtok, "input"),
            output_per_mtok=parse_money(output_per_mtok, "output"),
            # Stores keep a moment to the microsecond (Postgres' timestamptz): the price
            # answered is the one that will be listed.
            effective_from=round(self.clock() if effective_from is None else effective_from, 6),
            **{name: parse_money(value, OPTIONAL_RATES[name])
               for name, value in optional_rates.items() if value is not None},
        )
        same = [p for p in await self.store.prices() if (p.provider, p.model,
                p.effective_from) == (price.provider, price.model, price.effective_from)]
        before = price_fields(same[0]) if same else None
        await self.store.set_price(price, audit=self.event(
            "price.set", f"price:{price.provider}/{price.model}", before, price_fields(price)))
        return price

    async def prices(self) -> list[Price]:
        return await self.store.prices()

    async def sync_price(self, price: Price, before: Price | None) -> None:
        """Write a catalogue or provider price ``prices sync`` found (the store never lets
        one replace an operator's)."""
        await self.store.set_price(price, audit=self.event(
            "price.sync", f"price:{price.provider}/{price.model}",
            None if before is None else price_fields(before), price_fields(price)))

    # ---- budgets --------------------------------------------------------------------

    async def _scope_id(self, scope: BudgetScope, ref: str) -> tuple[str, str]:
        """(the stored scope id, the audit target) of a key (by prefix or id) or subject."""
        if scope is BudgetScope.KEY:
            record = await self.store.find_key(ref)
            if record is None:
                raise NotFound(f"no key with prefix or id {ref!r}")
            return record.id, f"budget:key:{record.prefix}"
        if not ref.strip():
            raise Invalid("a subject budget needs a subject id")
        return ref, f"budget:subject:{ref}"

    async def set_budget(self, scope: BudgetScope, ref: str,
                         fields: Mapping[str, Any]) -> Budget:
        """Change the given fields of the budget (created when there is none); a field given
        as None means no limit of that kind."""
        if unknown := sorted(set(fields) - set(BUDGET_FIELDS)):
            raise Invalid(f"a budget has no field {unknown[0]!r}")
        scope_id, target = await self._scope_id(scope, ref)
        values = {name: _budget_value(name, value) for name, value in fields.items()}
        if values.get("over_cap", "") is None:
            values["over_cap"] = OverCap.CLAMP
        if values.get("stop_streams_at_budget", False) is None:
            values["stop_streams_at_budget"] = False
        current = await self.store.budget(scope, scope_id)
        updated = dataclasses.replace(current or Budget(scope, scope_id), **values)
        before, after = changed(budget_fields(current) if current else {},
                                budget_fields(updated))
        if current is not None and not after:
            return current
        await self.store.set_budget(updated, audit=self.event(
            "budget.set", target, before if current else None, after))
        return updated

    async def budget(self, scope: BudgetScope, ref: str) -> Budget:
        scope_id, _ = await self._scope_id(scope, ref)
        budget = await self.store.budget(scope, scope_id)
        if budget is None:
            raise NotFound(f"no budget for {scope.value} {ref!r}")
        return budget

    async def delete_budget(self, scope: BudgetScope, ref: str) -> None:
        scope_id, target = await self._scope_id(scope, ref)
        current = await self.store.budget(scope, scope_id)
        if current is None:
            raise NotFound(f"no budget for {scope.value} {ref!r}")
        await self.store.delete_budget(scope, scope_id, audit=self.event(
            "budget.delete", target, budget_fields(current), None))

    async def budgets(self) -> list[Budget]:
        return await self.store.budgets()

    # ---- usage and spend ------------------------------------------------------------

    async def usage(self, by: list[str], since: float | None = None,
                    until: float | None = None, *,
                    latency: bool = True) -> list[dict[str, Any]] | None:
        """Rows of the billing report, or None while there is no report to ask
        (``latency=False``: without the percentiles, which cost most of it)."""
        if not by or not all(is_group(name) for name in by):
            raise Invalid(f"by: expected some of {', '.join(REPORT_GROUPS)}, got "
                          f"{', '.join(by) or 'nothing'}")
        if since is not None and until is not None and until < since:
            raise Invalid("until is before since")
        report = usage_report_function()
        if report is None:
            return None
        rows = report(self.store, by, since, until, latency=latency)
        return list(await rows if inspect.isawaitable(rows) else rows)

    async def usage_of(self, request_or_trace_id: str) -> list[dict[str, Any]]:
        """The records of a request id or trace id (``request_view``'s), else NotFound."""
        found = await find_requests(self.store, request_or_trace_id)
        if not found:
            raise NotFound(f"no request has the id {request_or_trace_id!r}")
        return found

    async def refusals(self, by: list[str], since: float | None = None,
                       until: float | None = None) -> list[dict[str, Any]]:
        """The requests refused before admission, per status and code (and ``by``), from
        every replica: ``billing.refusals``' report."""
        if not all(name in REFUSAL_GROUPS for name in by):
            raise Invalid(f"by: expected some of {', '.join(REFUSAL_GROUPS)}, got "
                          f"{', '.join(by)}")
        if since is not None and until is not None and until < since:
            raise Invalid("until is before since")
        return await refusal_report(self.store, by, since, until)

    async def spend(self, by: str) -> dict[str, dict[str, dict[str, Any]]]:
        """What each key id or subject spent this month and today, from one report:
        {id: {"today": totals, "month": totals}} (totals: cost_usd, total_tokens, requests)."""
        now = self.clock()
        today = datetime.fromtimestamp(day_start(now), UTC).strftime("%Y-%m-%d")
        rows = await self.usage([by, "day"], month_start(now), None, latency=False) or []
        field = "key_id" if by == "key" else "subject"
        spent: dict[str, dict[str, dict[str, Any]]] = {}
        for row in rows:
            windows = spent.setdefault(str(row.get(field)), {"today": {}, "month": {}})
            targets = ("month", "today") if str(row.get("day"))[:10] == today else ("month",)
            for window in targets:
                totals = windows[window]
                # What the ledger charged: the price, else the provider's reported cost.
                totals["cost_usd"] = Decimal(str(totals.get("cost_usd") or 0)) + Decimal(
                    str(row.get("spend_usd") or 0))
                for name in ("total_tokens", "requests"):
                    totals[name] = int(totals.get(name, 0)) + int(row.get(name) or 0)
        return spent

    async def budgets_with_spend(self, scope: BudgetScope | None = None) -> list[dict[str, Any]]:
        """Every budget (of ``scope``) with what its key or subject spent today and this
        month: one report per scope that has budgets."""
        budgets = [b for b in await self.store.budgets() if scope in (None, b.scope)]
        spent = {scope: await self.spend(scope) for scope in ("key", "subject")
                 if any(b.scope.value == scope for b in budgets)}
        # Key budgets are labelled with their key's name (a list only when there are any).
        keys = ({k.id: k for k in await self.store.list_keys()}
                if any(b.scope is BudgetScope.KEY for b in budgets) else {})
        return [_with_spend(budget, spent.get(budget.scope.value, {}), keys, self.clock())
                for budget in budgets]

    async def subjects(self, *, with_keys: bool = True) -> list[dict[str, Any]]:
        """Every subject (owning keys, or seen in usage: JWT callers) with its keys (or only
        their counts), its spend today and this month, and its budget."""
        now = self.clock()
        keys = await self.store.list_keys()
        spent = await self.spend("subject")
        budgets = {b.scope_id: b for b in await self.store.budgets()
                   if b.scope is BudgetScope.SUBJECT}
        names = sorted({k.subject_id for k in keys} | set(spent) | set(budgets))
        owned: dict[str, list[KeyRecord]] = {}
        for key in keys:
            owned.setdefault(key.subject_id, []).append(key)
        return [{
            "subject_id": name,
            "keys": ([{**key_fields(k), "state": key_state(k, now)} for k in owned.get(name, [])]
                     if with_keys else None),
            "key_count": len(owned.get(name, [])),
            "active_key_count": sum(key_state(k, now) == "active" for k in owned.get(name, [])),
            "spend_today_usd": _cost(spent.get(name, {}).get("today")),
            "spend_month_usd": _cost(spent.get(name, {}).get("month")),
            "requests_month": int(spent.get(name, {}).get("month", {}).get("requests", 0)),
            "budget": _with_spend(budgets[name], spent, {}, now) if name in budgets else None,
        } for name in names]


def _cost(row: Mapping[str, Any] | None) -> str:
    return money_text(Decimal(str(row.get("cost_usd") or "0")) if row else Decimal(0))


def _with_spend(budget: Budget, spent: Mapping[str, Mapping[str, Mapping[str, Any]]],
                keys: Mapping[str, Any], now: float) -> dict[str, Any]:
    windows = spent.get(budget.scope_id) or {}
    day, month = windows.get("today") or {}, windows.get("month") or {}
    key = keys.get(budget.scope_id) if budget.scope is BudgetScope.KEY else None
    used = {"daily_usd": Decimal(str(day.get("cost_usd") or 0)),
            "monthly_usd": Decimal(str(month.get("cost_usd") or 0)),
            "daily_tokens": int(day.get("total_tokens", 0)),
            "monthly_tokens": int(month.get("total_tokens", 0))}
    return {
        **budget_fields(budget),
        "label": f"{key.name} ({key.prefix}…)" if key else budget.scope_id,
        "spent_today_usd": _cost(day), "spent_month_usd": _cost(month),
        "tokens_today": used["daily_tokens"], "tokens_month": used["monthly_tokens"],
        "burn": budget_burn(budget, used, now),  # each limit's rate and run-out time
    }
