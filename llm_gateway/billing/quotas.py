"""Budgets that hold: reserve before a request, settle after it.

A request is held to its key's budget and to its subject's (a team's budget caps all its
keys). Before it is sent, the engine reserves an estimate on every limit that applies —
daily and monthly USD and tokens, and the tokens-per-minute bucket — all or nothing:
the prompt (estimated from the body) plus the output cap (``max_tokens``, else the
budget's ``max_output_tokens``, else the model's default), priced at the dearest target's
output price. After it, the reservation is settled to what was really used. Near a USD
budget the output cap is lowered to what the budget can still pay for (the budget-aware
clamp), so a request that fits is served rather than refused.

When the ledger does not answer (Redis or Postgres down), the rate limiter's failure policy
(``RATE_LIMIT_FAILURE_POLICY``) decides, as for the limiter, which shares its backend:
fail-open admits without a reservation, fail-closed raises ``LedgerUnavailable`` (the
engine's 503). Either way it is one ``Outage``: logged at most once a minute, counted,
shown by /readyz, and the ledger is asked again once a second.

A reservation may name its ``Owner`` (the engine's process tag and the request's id): the
ledger then keeps it as a held row of that process, settled exactly once. The engine calls
``keep_alive`` every few seconds (this process lives; the reservations of processes that
stopped being heard of are released) and, at start-up, settles what a killed process left
under way (rebuilt from the usage spool, each under its owner) with ``settle_orphan``:
booked once whether the row was still held, swept meanwhile, or in fact settled before the
kill.
"""

from __future__ import annotations

import asyncio
import calendar
import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from llm_gateway.billing.ledger import Draw, Hold, Ledger, LedgerAnswer, Owner
from llm_gateway.billing.model import MILLION, Budget, BudgetScope, OverCap, Price
from llm_gateway.billing.prices import PriceBook
from llm_gateway.config import FailurePolicy
from llm_gateway.outage import Outage

UNITS_PER_USD = Decimal(10) ** 10  # the ledger counts USD in 1e-10 units
# The output cap assumed when neither the request, a budget nor the route gives one.
DEFAULT_OUTPUT_CAP = 4096
BUDGET_CACHE_SECONDS = 2.0
# What a request without a price holds on a USD budget (1e-10 USD): see Quotas._try.
UNPRICED_HOLD_UNITS = 1
# While the ledger is down, one request per interval asks it again (as the limiter does).
RETRY_INTERVAL_SECONDS = 1.0

log = logging.getLogger("llm_gateway.billing")


class LedgerUnavailable(Exception):
    """The ledger did not answer, under fail-closed: the request cannot be held to its
    budget, so it is not sent."""


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
    ticket: object = None  # the ledger's answer's (a lease's reservation)
    owner: Owner | None = None  # whose it is in the ledger (None: the counters' only)


def reservation_json(reservation: Reservation | None) -> dict[str, object] | None:
    """What the usage spool keeps of a reservation, to settle it after a crash: its owner
    and holds. None for none, one without an owner, or one granted from a lease (the
    lease's room covers it; a bucket refills by itself)."""
    if reservation is None or reservation.owner is None or reservation.ticket is not None:
        return None
    return {"process": reservation.owner.process, "request": reservation.owner.request,
            "holds": [[h.name, h.limit, h.amount, h.expires_at] for h in reservation.holds]}


def reservation_from_json(data: dict[str, Any]) -> Reservation:
    """``reservation_json``'s reservation again (what ``settle_orphan`` needs of it)."""
    holds = [Hold(str(name), int(limit), int(amount), float(expires_at))
             for name, limit, amount, expires_at in data["holds"]]
    return Reservation(holds, [], 0, owner=Owner(str(data["process"]), str(data["request"])))


@dataclass(slots=True)
class QuotaDecision:
    """What admission learns: a reservation (None: no budget applies), the output cap to
    send (when it changed), and the token headers."""

    reservation: Reservation | None = None
    max_tokens: int | None = None  # set when the request's cap was lowered or added
    clamped_from: int | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class QuotaRefusal:
    """A limit said no: which (a counter or bucket name, or "cap" for a ``max_tokens``
    over a rejecting cap), and the headers its 429 carries (OpenAI's token headers, and
    ``retry-after`` where the limit frees up)."""

    limit: str
    headers: list[tuple[str, str]] = field(default_factory=list)


@dataclass(slots=True)
class BudgetLimits:
    """The budgets one key's requests are held to (its own and its subject's)."""

    budgets: list[Budget]
    cap: int | None  # the tightest max_output_tokens of the budgets
    over_cap: OverCap
    stop_streams: bool

    @property
    def charges_usd(self) -> bool:
        """Whether a USD limit applies: then every target must be priced, or refused."""
        return any(b.daily_usd is not None or b.monthly_usd is not None for b in self.budgets)


def windows(now: float) -> tuple[str, float, str, float]:
    """(day id, its end, month id, its end), UTC."""
    return _windows_of_day(int(now // 86400))  # a Unix day is 86 400 s: no leap seconds


@functools.lru_cache(maxsize=4)
def _windows_of_day(day: int) -> tuple[str, float, str, float]:
    """Worked out once per day (every reservation asks; datetime is not cheap)."""
    moment = datetime.fromtimestamp(day * 86400, UTC)
    day_end = calendar.timegm((moment.year, moment.month, moment.day, 0, 0, 0)) + 86400
    last = calendar.monthrange(moment.year, moment.month)[1]
    month_end = calendar.timegm((moment.year, moment.month, last, 0, 0, 0)) + 86400
    return f"d{moment:%Y%m%d}", float(day_end), f"m{moment:%Y%m}", float(month_end)


class BudgetsUnavailable(Exception):
    """The key store did not answer a budget lookup, under its fail-closed policy: the
    request cannot be held to its budgets, so it is not sent."""


class BudgetBook:
    """Budgets by scope, cached briefly per process: a budget set anywhere applies
    everywhere within ``BUDGET_CACHE_SECONDS``.

    Budgets live in the key store, so its outage rules apply (``outage``: the key store's,
    with ``AUTH_FAILURE_POLICY``; ``unavailable``: what the store raises when it does not
    answer): fail-closed raises BudgetsUnavailable, fail-open answers with the budget this
    process read last, however old (none read: none).
    """

    def __init__(self, store: object, clock: Callable[[], float] = time.monotonic, *,
                 outage: Outage | None = None,
                 unavailable: tuple[type[Exception], ...] = ()) -> None:
        self._lookup = getattr(store, "budget", None)
        self._clock = clock
        self._cache: dict[tuple[BudgetScope, str], tuple[float, Budget | None]] = {}
        self._read_after = -math.inf  # entries read before this are to be read again
        self._outage = outage
        self._unavailable = unavailable

    async def budget(self, scope: BudgetScope, scope_id: str) -> Budget | None:
        if self._lookup is None:
            return None
        now = self._clock()
        cached = self._cache.get((scope, scope_id))
        if (cached is not None and now - cached[0] < BUDGET_CACHE_SECONDS
                and cached[0] >= self._read_after):
            return cached[1]
        try:
            found = await self._lookup(scope, scope_id)
        except self._unavailable as exc:
            outage = self._outage
            if outage is None:
                raise
            outage.failed(exc)
            if outage.policy is FailurePolicy.FAIL_CLOSED:
                raise BudgetsUnavailable(str(exc)) from exc
            outage.substituted()
            return cached[1] if cached is not None else None
        if len(self._cache) > 50_000:
            self._cache.clear()
        self._cache[(scope, scope_id)] = (now, found)
        return found

    def forget(self) -> None:
        """Read every budget again at its next use (until then, under fail-open, what was
        read last still holds a request to it)."""
        self._read_after = self._clock()


class Quotas:
    def __init__(self, ledger: Ledger, budgets: BudgetBook, prices: PriceBook,
                 clock: Callable[[], float] = time.time, *,
                 failure_policy: FailurePolicy = FailurePolicy.FAIL_OPEN,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.ledger = ledger
        self.budgets = budgets
        self.prices = prices
        self._clock = clock
        self._ratios: dict[tuple[str, str, str], float] = {}
        self.failure_policy = failure_policy
        self.outage = Outage(
            "budget_ledger", ledger.backend, policy=failure_policy, clock=monotonic,
            substitute=("admitting requests without holding them to their budgets until it "
                        "is back" if failure_policy is FailurePolicy.FAIL_OPEN else
                        "refusing requests of keys with a budget with 503 until it is back"))
        self._monotonic = monotonic
        self._next_try = 0.0

    def priced_now(self, provider: str, model: str) -> bool:
        """Whether the price table has a price in force now for this target."""
        return self.prices.price_at(provider, model, self._clock()) is not None

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

    async def limits_for(self, key_id: str, subject_id: str) -> BudgetLimits | None:
        """The budgets a request of this key is held to (None: none). Raises
        BudgetsUnavailable (the key store, under fail-closed)."""
        # One after the other: both are cached nearly always, and two tasks would cost
        # more than either lookup (this runs for every request with a body).
        found = (await self.budgets.budget(BudgetScope.KEY, key_id),
                 await self.budgets.budget(BudgetScope.SUBJECT, subject_id))
        budgets = [budget for budget in found if budget is not None]
        if not budgets:
            return None
        caps = [b.max_output_tokens for b in budgets if b.max_output_tokens]
        rejecting = any(b.over_cap is OverCap.REJECT for b in budgets if b.max_output_tokens)
        return BudgetLimits(budgets, min(caps) if caps else None,
                       OverCap.REJECT if rejecting else OverCap.CLAMP,
                       any(b.stop_streams_at_budget for b in budgets))

    async def reserve(
        self, limits: BudgetLimits, *, prompt_tokens: int, requested_cap: int | None,
        default_cap: int | None, targets: Sequence[tuple[str, str]],
        owner: Owner | None = None, choices: int = 1,
    ) -> QuotaDecision | QuotaRefusal:
        """Reserve for one request (under ``owner``, when given): the decision, or the
        refusal. Raises LedgerUnavailable when the ledger does not answer under
        fail-closed. The output cap is per choice (``choices``: chat's ``n``, each billed
        as a whole answer): the reservation is for every choice, and the clamp keeps their
        total within the budget."""
        cap = requested_cap or limits.cap or default_cap or DEFAULT_OUTPUT_CAP
        if limits.cap and cap > limits.cap:
            if limits.over_cap is OverCap.REJECT:
                return QuotaRefusal("cap")
            cap = limits.cap
        now = self._clock()
        price = self.prices.highest_output_price(targets, now)
        tried = await self._try(limits, prompt_tokens, cap * choices, price, now, owner)
        if (tried is not None and not tried[0].granted and tried[0].refused_by
                and price is not None):
            affordable = _affordable_cap(tried[0], prompt_tokens, price) // choices
            if tried[0].refused_by.startswith("usd:") and 1 <= affordable < cap:
                cap = affordable  # the budget-aware clamp
                tried = await self._try(limits, prompt_tokens, cap * choices, price, now, owner)
        if tried is None:
            # The ledger did not answer. fail-open: sent without a reservation (the cap,
            # which needs no ledger, still applies); fail-closed: not sent.
            if self.failure_policy is FailurePolicy.FAIL_CLOSED:
                raise LedgerUnavailable(self.ledger.backend)
            self.outage.substituted()
            decision = QuotaDecision()
        else:
            answer, holds, draws = tried
            if not answer.granted:
                refused = answer.refused_by or "budget"
                return QuotaRefusal(refused, _refusal_headers(answer, holds, draws, refused, now))
            reserved = prompt_tokens + cap * choices
            decision = QuotaDecision(Reservation(
                holds, draws, reserved, _ceiling(answer, holds),
                limits.stop_streams, price, answer.ticket, owner))
            decision.headers = _token_headers(answer, draws, holds, reserved, now)
        if cap != requested_cap:
            decision.max_tokens, decision.clamped_from = cap, requested_cap
        return decision

    async def _ledger_reserve(self, holds: list[Hold], draws: list[Draw],
                              owner: Owner | None = None) -> LedgerAnswer | None:
        """The ledger's answer; None when it does not answer. While it is down, only one
        request per ``RETRY_INTERVAL_SECONDS`` asks it (the rest do not wait on it)."""
        now = self._monotonic()
        if self.outage.is_down and now < self._next_try:
            return None
        self._next_try = now + RETRY_INTERVAL_SECONDS  # claimed before awaiting
        try:
            answer = await self.ledger.reserve(holds, draws, owner=owner)
        except Exception as exc:  # whatever keeps the ledger from answering
            self.outage.failed(exc)
            return None
        if answer.ticket is None:  # a lease's answer says nothing of the backend now
            self.outage.recovered()
        return answer

    async def check(self) -> None:
        """Ask the ledger now (for /readyz): an empty reservation, which takes nothing."""
        try:
            await asyncio.wait_for(self.ledger.reserve([], []), timeout=2.0)
        except Exception as exc:  # any failure to answer is "not available"
            self.outage.failed(exc)
            return
        self.outage.recovered()
        self._next_try = 0.0

    async def _try(self, limits: BudgetLimits, prompt_tokens: int, cap: int,
                   price: Price | None, now: float, owner: Owner | None = None,
                   ) -> tuple[LedgerAnswer, list[Hold], list[Draw]] | None:
        """``cap``: the output tokens of every choice together."""
        tokens = prompt_tokens + cap
        # No price (a target that may go unpriced): one unit is held all the same, so a
        # spent budget refuses it and its settlement books the cost its provider reports.
        usd = UNPRICED_HOLD_UNITS
        if price is not None:
            per_token = _units_per_token(price)
            usd = (prompt_tokens * per_token[0] + cap * per_token[1] if per_token is not None
                   else usd_units((prompt_tokens * price.input_per_mtok
                                   + cap * price.output_per_mtok) / MILLION))
        holds: list[Hold] = []
        draws: list[Draw] = []
        for budget in limits.budgets:
            for kind, name, limit, end in _counters_of(budget, *windows(now)):
                if kind == "tpm":
                    draws.append(Draw(name, limit, tokens))
                elif kind == "tok":
                    holds.append(Hold(name, limit, tokens, end))
                else:
                    holds.append(Hold(name, limit, usd, end))
        answer = await self._ledger_reserve(holds, draws, owner)
        if answer is None:
            return None
        self._note_ratios(answer, holds)
        return answer, holds, draws

    async def settle(self, reservation: Reservation, tokens: int, usd: Decimal | None) -> None:
        """Book what was spent. A failure is raised (the engine logs it, off the request
        path); it does not count as the ledger being down: only reservations decide that,
        or a settlement that fails for another reason would send requests unreserved."""
        spent_usd = usd_units(usd) if usd is not None else 0
        spent = [spent_usd if hold.name.startswith("usd:") else tokens
                 for hold in reservation.holds]
        await self.ledger.settle(reservation.holds, spent, reservation.draws,
                                 [tokens] * len(reservation.draws), reservation.ticket,
                                 owner=reservation.owner)

    async def settle_orphan(self, reservation: Reservation, tokens: int,
                            usd: Decimal | None) -> None:
        """Book what a request of a dead process spent (its reservation rebuilt after a
        crash): as ``settle``, exactly once under its owner, whether its row was still
        held, was swept, or was in fact settled before the kill. Raises ValueError for a
        reservation without an owner: settled blindly, it could be booked twice."""
        if reservation.owner is None:
            raise ValueError("only a reservation with an owner can be settled after a crash")
        await self.settle(reservation, tokens, usd)

    async def keep_alive(self, process: str) -> None:
        """Housekeeping, every few seconds: ``process`` lives, and the reservations of
        processes not heard of for a while are released. Never raises (a ledger that is
        down shows on the requests it decides)."""
        try:
            await self.ledger.heartbeat(process)
            released = await self.ledger.sweep()
        except Exception as exc:
            log.debug("the budget ledger's housekeeping failed on %s: %s",
                      self.ledger.backend, type(exc).__name__)
            return
        if released:
            log.info("released %d reservations of gateway processes that are gone", released)


@functools.lru_cache(maxsize=1024)
def _units_per_token(price: Price) -> tuple[int, int] | None:
    """A price's input and output per token in ledger units (1e-10 USD), when both are whole
    numbers (a price with at most four decimals per million tokens: nearly all), so that a
    reservation is priced in integers, exactly as in Decimal; else None."""
    rates = [rate * UNITS_PER_USD / MILLION for rate in (price.input_per_mtok,
                                                         price.output_per_mtok)]
    if any(rate != rate.to_integral_value() for rate in rates):
        return None
    return int(rates[0]), int(rates[1])


@functools.lru_cache(maxsize=4096)
def _counters_of(budget: Budget, day: str, day_end: float, month: str,
                 month_end: float) -> tuple[tuple[str, str, int, float], ...]:
    """The counters a budget holds requests to in these windows: (kind, name, limit, window
    end), kind "usd" (limit in 1e-10 USD), "tok" or "tpm" (a bucket; no end). Worked out
    once per budget and day (budgets are cached objects; every reservation asks)."""
    owner = f"{budget.scope.value}:{budget.scope_id}"
    counters: list[tuple[str, str, int, float]] = []
    for amount, window, end in ((budget.daily_usd, day, day_end),
                                (budget.monthly_usd, month, month_end)):
        if amount is not None:
            counters.append(("usd", f"usd:{owner}:{window}", usd_units(amount), end))
    for count, window, end in ((budget.daily_tokens, day, day_end),
                               (budget.monthly_tokens, month, month_end)):
        if count is not None:
            counters.append(("tok", f"tok:{owner}:{window}", count, end))
    if budget.tokens_per_minute:
        counters.append(("tpm", f"tpm:{owner}", budget.tokens_per_minute, 0.0))
    return tuple(counters)


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


def _token_headers(answer: LedgerAnswer, draws: list[Draw], holds: list[Hold], taken: int,
                   now: float, limit_name: str | None = None) -> list[tuple[str, str]]:
    """OpenAI's token rate-limit headers, after ``taken`` tokens were reserved: of the
    limit ``limit_name`` when it is a token one, else of the per-minute bucket when there is
    one, else of the tightest token budget. The reset is OpenAI's: until the limit is back
    to its initial state (the bucket full; the budget's window over)."""
    left = answer.left or {}
    draw = next((d for d in draws if d.name == limit_name), None)
    hold = next((h for h in holds if h.name == limit_name and h.name.startswith("tok:")), None)
    if draw is None and hold is None:
        token_holds = [h for h in holds if h.name.startswith("tok:")]
        if draws:
            draw = min(draws, key=lambda d: left.get(d.name, d.capacity))
        elif token_holds:
            hold = min(token_holds, key=lambda h: left.get(h.name, h.limit))
        else:
            return []
    if draw is not None:
        limit, remaining = draw.capacity, left.get(draw.name, draw.capacity) - taken
        reset = 60.0 * (draw.capacity - max(0, remaining)) / draw.capacity
    else:
        assert hold is not None
        limit, remaining = hold.limit, left.get(hold.name, hold.limit) - taken
        reset = max(0.0, hold.expires_at - now)
    return [
        ("x-ratelimit-limit-tokens", str(limit)),
        ("x-ratelimit-remaining-tokens", str(max(0, remaining))),
        ("x-ratelimit-reset-tokens", _duration(reset)),
    ]


def _refusal_headers(answer: LedgerAnswer, holds: list[Hold], draws: list[Draw],
                     refused: str, now: float) -> list[tuple[str, str]]:
    """A refusal's headers: the token headers (nothing was taken), and ``retry-after``:
    when the refusing bucket holds the request's tokens again (a request larger than the
    bucket never fits: a full refill, 60 s), or when the refusing budget's window resets."""
    headers = _token_headers(answer, draws, holds, 0, now, refused)
    draw = next((d for d in draws if d.name == refused), None)
    hold = next((h for h in holds if h.name == refused), None)
    if draw is not None:
        short = min(draw.amount, draw.capacity) - (answer.left or {}).get(draw.name, 0)
        wait = 60.0 * max(0, short) / draw.capacity
    elif hold is not None:
        wait = hold.expires_at - now
    else:
        return headers
    return [*headers, ("retry-after", str(max(1, math.ceil(wait))))]


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    whole = int(seconds + 0.999)
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"
