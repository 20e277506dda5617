"""Budgets that hold: reserve before a request, settle after it.

A request is held to its key's budget and to its subject's (a team's budget caps all its
keys). Before it is sent, the engine reserves an estimate on every limit that applies —
daily and monthly USD and tokens, and the tokens-per-minute bucket — all or nothing:
the prompt (estimated from the body) plus the output cap (``max_tokens``, else the
budget's ``max_output_tokens``, else the model's default), priced at the dearest target's
output price. After it, the reservation is settled to what was really used. Near a USD
budget the output cap is lowered to what the budget can still pay for (the budget-aware
clamp), so a request that fits is served rather than refused.
"""

from __future__ import annotations

import asyncio
import calendar
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

from llm_gateway.billing.ledger import Draw, Hold, Ledger, LedgerAnswer
from llm_gateway.billing.model import MILLION, Budget, BudgetScope, OverCap, Price
from llm_gateway.billing.prices import PriceBook

UNITS_PER_USD = Decimal(10) ** 10  # the ledger counts USD in 1e-10 units
# The output cap assumed when neither the request, a budget nor the route gives one.
DEFAULT_OUTPUT_CAP = 4096
BUDGET_CACHE_SECONDS = 2.0


def usd_units(amount: Decimal) -> int:
    return int((amount * UNITS_PER_USD).to_integral_value())


@dataclass(frozen=True, slots=True)
class Reservation:
    holds: list[Hold]
    draws: list[Draw]
    estimated_tokens: int
    # The USD (1e-10 units) this request may spend before a budget is exhausted: what a
    # stream that stops at the budget may deliver. None: no USD budget applies.
    spend_ceiling: int | None = None
    stop_streams: bool = False
    output_price: Price | None = None


@dataclass(slots=True)
class QuotaDecision:
    """What admission learns: a reservation (None: no budget applies), the output cap to
    send (when it changed), and the token headers."""

    reservation: Reservation | None = None
    max_tokens: int | None = None  # set when the request's cap was lowered or added
    clamped_from: int | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)


@dataclass(slots=True)
class _Limits:
    budgets: list[Budget]
    cap: int | None  # the tightest max_output_tokens of the budgets
    over_cap: OverCap
    stop_streams: bool


def windows(now: float) -> tuple[str, float, str, float]:
    """(day id, its end, month id, its end), UTC."""
    moment = datetime.fromtimestamp(now, UTC)
    day_end = calendar.timegm((moment.year, moment.month, moment.day, 0, 0, 0)) + 86400
    last = calendar.monthrange(moment.year, moment.month)[1]
    month_end = calendar.timegm((moment.year, moment.month, last, 0, 0, 0)) + 86400
    return f"d{moment:%Y%m%d}", float(day_end), f"m{moment:%Y%m}", float(month_end)


class BudgetBook:
    """Budgets by scope, cached briefly per process: a budget set anywhere applies
    everywhere within ``BUDGET_CACHE_SECONDS``."""

    def __init__(self, store: object, clock: Callable[[], float] = time.monotonic) -> None:
        self._lookup = getattr(store, "budget", None)
        self._clock = clock
        self._cache: dict[tuple[BudgetScope, str], tuple[float, Budget | None]] = {}

    async def budget(self, scope: BudgetScope, scope_id: str) -> Budget | None:
        if self._lookup is None:
            return None
        now = self._clock()
        cached = self._cache.get((scope, scope_id))
        if cached is not None and now - cached[0] < BUDGET_CACHE_SECONDS:
            return cached[1]
        found = await self._lookup(scope, scope_id)
        if len(self._cache) > 50_000:
            self._cache.clear()
        self._cache[(scope, scope_id)] = (now, found)
        return found

    def forget(self) -> None:
        self._cache.clear()


class Quotas:
    def __init__(self, ledger: Ledger, budgets: BudgetBook, prices: PriceBook,
                 clock: Callable[[], float] = time.time) -> None:
        self.ledger = ledger
        self.budgets = budgets
        self.prices = prices
        self._clock = clock
        self._ratios: dict[tuple[str, str, str], float] = {}

    def used_ratios(self) -> list[tuple[str, str, str, float]]:
        """(scope, id, window, spent and reserved over the limit) of each USD budget as
        the last reservation saw it: for the budget gauge."""
        return [(*owner, ratio) for owner, ratio in self._ratios.items()]

    def _note_ratios(self, answer: LedgerAnswer, holds: list[Hold]) -> None:
        for hold in holds:
            if hold.name.startswith("usd:") and answer.left and hold.name in answer.left:
                _, scope, owner, window = hold.name.split(":", 3)
                used = hold.limit - answer.left[hold.name] + (hold.amount if answer.granted else 0)
                label = "daily" if window.startswith("d") else "monthly"
                self._ratios[(scope, owner, label)] = used / hold.limit if hold.limit else 1.0

    async def limits_for(self, key_id: str, subject_id: str) -> _Limits | None:
        found = await asyncio.gather(self.budgets.budget(BudgetScope.KEY, key_id),
                                     self.budgets.budget(BudgetScope.SUBJECT, subject_id))
        budgets = [budget for budget in found if budget is not None]
        if not budgets:
            return None
        caps = [b.max_output_tokens for b in budgets if b.max_output_tokens]
        rejecting = any(b.over_cap is OverCap.REJECT for b in budgets if b.max_output_tokens)
        return _Limits(budgets, min(caps) if caps else None,
                       OverCap.REJECT if rejecting else OverCap.CLAMP,
                       any(b.stop_streams_at_budget for b in budgets))

    async def reserve(
        self, limits: _Limits, *, prompt_tokens: int, requested_cap: int | None,
        default_cap: int | None, targets: Sequence[tuple[str, str]],
    ) -> QuotaDecision | str:
        """Reserve for one request: the decision, or the name of the limit that refused
        ("cap" when the request's max_tokens is over a rejecting cap)."""
        cap = requested_cap or limits.cap or default_cap or DEFAULT_OUTPUT_CAP
        if limits.cap and cap > limits.cap:
            if limits.over_cap is OverCap.REJECT:
                return "cap"
            cap = limits.cap
        now = self._clock()
        price = self.prices.highest_output_price(targets, now)
        answer, holds, draws = await self._try(limits, prompt_tokens, cap, price, now)
        if not answer.granted and answer.refused_by and price is not None:
            affordable = _affordable_cap(answer, prompt_tokens, price)
            if answer.refused_by.startswith("usd:") and 1 <= affordable < cap:
                cap = affordable  # the budget-aware clamp
                answer, holds, draws = await self._try(limits, prompt_tokens, cap, price, now)
        if not answer.granted:
            return answer.refused_by or "budget"
        decision = QuotaDecision(Reservation(
            holds, draws, prompt_tokens + cap, _ceiling(answer, holds), limits.stop_streams,
            price))
        if cap != requested_cap:
            decision.max_tokens, decision.clamped_from = cap, requested_cap
        decision.headers = _token_headers(answer, draws, holds, prompt_tokens + cap)
        return decision

    async def _try(self, limits: _Limits, prompt_tokens: int, cap: int, price: Price | None,
                   now: float) -> tuple[LedgerAnswer, list[Hold], list[Draw]]:
        tokens = prompt_tokens + cap
        usd = None
        if price is not None:
            usd = usd_units((prompt_tokens * price.input_per_mtok
                             + cap * price.output_per_mtok) / MILLION)
        day, day_end, month, month_end = windows(now)
        holds: list[Hold] = []
        draws: list[Draw] = []
        for budget in limits.budgets:
            owner = f"{budget.scope.value}:{budget.scope_id}"
            for limit, window, end in ((budget.daily_usd, day, day_end),
                                       (budget.monthly_usd, month, month_end)):
                if limit is not None and usd is not None:
                    holds.append(Hold(f"usd:{owner}:{window}", usd_units(limit), usd, end))
            for count, window, end in ((budget.daily_tokens, day, day_end),
                                       (budget.monthly_tokens, month, month_end)):
                if count is not None:
                    holds.append(Hold(f"tok:{owner}:{window}", count, tokens, end))
            if budget.tokens_per_minute:
                draws.append(Draw(f"tpm:{owner}", budget.tokens_per_minute, tokens))
        answer = await self.ledger.reserve(holds, draws)
        self._note_ratios(answer, holds)
        return answer, holds, draws

    async def settle(self, reservation: Reservation, tokens: int, usd: Decimal | None) -> None:
        spent_usd = usd_units(usd) if usd is not None else 0
        spent = [spent_usd if hold.name.startswith("usd:") else tokens
                 for hold in reservation.holds]
        await self.ledger.settle(reservation.holds, spent, reservation.draws,
                                 [tokens] * len(reservation.draws))


def _affordable_cap(answer: LedgerAnswer, prompt_tokens: int, price: Price) -> int:
    """The most output tokens the tightest USD budget can still pay for."""
    left = min((value for name, value in (answer.left or {}).items() if name.startswith("usd:")),
               default=0)
    prompt_units = usd_units(prompt_tokens * price.input_per_mtok / MILLION)
    per_token = usd_units(price.output_per_mtok / MILLION) or 1
    return max(0, (left - prompt_units) // per_token)


def _ceiling(answer: LedgerAnswer, holds: list[Hold]) -> int | None:
    usd_left = [answer.left[h.name] for h in holds
                if h.name.startswith("usd:") and answer.left and h.name in answer.left]
    return min(usd_left) if usd_left else None


def _token_headers(answer: LedgerAnswer, draws: list[Draw], holds: list[Hold],
                   tokens: int) -> list[tuple[str, str]]:
    """OpenAI's token rate-limit headers: the per-minute bucket when there is one, else the
    tightest token budget."""
    left = answer.left or {}
    if draws:
        draw = min(draws, key=lambda d: left.get(d.name, d.capacity))
        limit, remaining = draw.capacity, left.get(draw.name, draw.capacity) - tokens
        reset = 60.0 * max(0, tokens) / draw.capacity
    else:
        token_holds = [h for h in holds if h.name.startswith("tok:")]
        if not token_holds:
            return []
        hold = min(token_holds, key=lambda h: left.get(h.name, h.limit))
        limit, remaining = hold.limit, left.get(hold.name, hold.limit) - tokens
        reset = max(0.0, hold.expires_at - time.time())
    return [
        ("x-ratelimit-limit-tokens", str(limit)),
        ("x-ratelimit-remaining-tokens", str(max(0, remaining))),
        ("x-ratelimit-reset-tokens", _duration(reset)),
    ]


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    whole = int(seconds + 0.999)
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"
