"""What accounting talks about: prices and budgets. Money is Decimal, never float.

Shared vocabulary of the billing package, the stores that keep it and the admin plane
that edits it. Times are Unix seconds (float), as everywhere in the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum

MILLION = Decimal(1_000_000)
# Money is kept to 10 decimal places (a token of a cheap model costs ~1e-8 USD).
MONEY_PLACES = Decimal("0.0000000001")


def money(value: Decimal | str | int) -> Decimal:
    """A USD amount, exact, at the stored precision."""
    return Decimal(value).quantize(MONEY_PLACES)


class PriceSource(StrEnum):
    """Who set a price, in order of rank: at lookup an operator's price in force outranks
    the provider's published one, which outranks the catalogue's, whatever their dates."""

    OPERATOR = "operator"  # prices set, the admin API, the settings file's prices:
    PROVIDER = "provider"  # the provider's own model list (prices sync: Venice's /models)
    CATALOGUE = "catalogue"  # the genai-prices dataset (prices sync)


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens for one provider's model, in force from ``effective_from``
    until the next price of the same model and source. A rate left None falls back: cache
    reads and cache writes to the input rate, 1-hour cache writes to the (5-minute)
    cache-write rate, else to the input rate (the ``*_rate`` properties say which applies).

    ``long_context``: the rates of a prompt of more than ``long_context_above`` tokens
    (cache reads and writes included), which apply to all of its tokens, as the providers
    bill a long context (a cliff, not a marginal rate)."""

    provider: str
    model: str  # the upstream model, as the provider names it
    input_per_mtok: Decimal
    output_per_mtok: Decimal
    effective_from: float
    cached_input_per_mtok: Decimal | None = None  # prompt tokens read from the cache
    cache_write_per_mtok: Decimal | None = None  # prompt tokens written to the cache
    cache_write_1h_per_mtok: Decimal | None = None  # of them, those kept for an hour
    source: PriceSource = PriceSource.OPERATOR
    long_context_above: int | None = None  # prompt tokens
    long_context: Price | None = None  # its rates (provider, model, moment: this one's)

    def rates_for(self, prompt_tokens: int) -> Price:
        """The price whose rates bill a prompt of this many tokens."""
        if (self.long_context is not None and self.long_context_above is not None
                and prompt_tokens > self.long_context_above):
            return self.long_context
        return self

    @property
    def cache_read_rate(self) -> Decimal:
        return _first(self.cached_input_per_mtok, self.input_per_mtok)

    @property
    def cache_write_rate(self) -> Decimal:
        return _first(self.cache_write_per_mtok, self.input_per_mtok)

    @property
    def cache_write_1h_rate(self) -> Decimal:
        return _first(self.cache_write_1h_per_mtok, self.cache_write_rate)


# A price's rates in the order the stores keep them (the long-context ones likewise).
RATE_FIELDS = ("input_per_mtok", "output_per_mtok", "cached_input_per_mtok",
               "cache_write_per_mtok", "cache_write_1h_per_mtok")


def rates_of(price: Price | None) -> tuple[Decimal | None, ...]:
    """A price's rates in RATE_FIELDS' order (None: all None)."""
    return tuple(None if price is None else getattr(price, name) for name in RATE_FIELDS)


def with_long_context(price: Price, above: int | None,
                      rates: tuple[Decimal | None, ...]) -> Price:
    """``price`` with the long-context rates a store row holds (none: as it is)."""
    if above is None or rates[0] is None or rates[1] is None:
        return price
    from dataclasses import replace

    tier = replace(price, **dict(zip(RATE_FIELDS, rates, strict=True)))
    return replace(price, long_context_above=above, long_context=tier)


def _first(rate: Decimal | None, otherwise: Decimal) -> Decimal:
    return otherwise if rate is None else rate


class BudgetScope(StrEnum):
    KEY = "key"  # a gateway key, by its id
    SUBJECT = "subject"  # a team or user owning keys (and JWT callers)


class OverCap(StrEnum):
    """What a max_tokens above the cap gets."""

    CLAMP = "clamp"  # lowered to the cap, said in x-llm-gateway-max-tokens-clamped
    REJECT = "reject"  # 400


@dataclass(frozen=True, slots=True)
class Budget:
    """The limits of one key or subject. None: no limit of that kind. A request is held to
    its key's budget and to its subject's, both."""

    scope: BudgetScope
    scope_id: str
    daily_usd: Decimal | None = None
    monthly_usd: Decimal | None = None
    daily_tokens: int | None = None
    monthly_tokens: int | None = None
    tokens_per_minute: int | None = None  # a token bucket: this refill rate and capacity
    max_output_tokens: int | None = None
    over_cap: OverCap = OverCap.CLAMP
    stop_streams_at_budget: bool = False
