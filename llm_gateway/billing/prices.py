"""Prices: what a model's tokens cost, in force from a moment on. A record is priced with
the price in force at its start, so a change at T prices requests before and after T
differently, whenever they finish.

The table lives in the store (``prices set``, the admin API) and is seeded from the
settings file's ``prices:``; each process keeps a copy, refreshed every
``REFRESH_SECONDS``, so pricing costs no query on the request path.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from llm_gateway.billing.model import MILLION, Price, PriceSource, money

log = logging.getLogger("llm_gateway.billing")

REFRESH_SECONDS = 5.0


class PriceError(ValueError):
    """A ``prices:`` entry that cannot be read; str() names it."""


def cost_of(price: Price, *, prompt_tokens: int, completion_tokens: int,
            cache_read_tokens: int = 0, cache_write_tokens: int = 0,
            cache_write_1h_tokens: int = 0) -> Decimal:
    """USD for a record's tokens at this price, exactly: the prompt's cache reads, its
    5-minute and 1-hour cache writes each at its own rate (``Price`` says which rate one
    left unset falls back to), the rest of the prompt at input, and every completion
    token, reasoning included, at output. A count the prompt cannot hold (a provider's
    inconsistent report) is cut to what it can, so no token is billed twice. A prompt
    above the price's long-context threshold is billed, all of it, at those rates."""
    price = price.rates_for(prompt_tokens)
    read = min(cache_read_tokens, prompt_tokens)
    written = min(cache_write_tokens, prompt_tokens - read)
    written_1h = min(cache_write_1h_tokens, written)
    total = ((prompt_tokens - read - written) * price.input_per_mtok
             + read * price.cache_read_rate
             + (written - written_1h) * price.cache_write_rate
             + written_1h * price.cache_write_1h_rate
             + completion_tokens * price.output_per_mtok)
    return money(total / MILLION)


# The order in which price_at asks each source (PriceSource says why).
RANK = (PriceSource.OPERATOR, PriceSource.PROVIDER, PriceSource.CATALOGUE)
_Key = tuple[str, str, PriceSource]


def merge_prices(seeded: Iterable[Price], stored: Iterable[Price]) -> list[Price]:
    """The settings file's seed and the store's table as one: a stored operator price of
    the same model and moment replaces the seed's (the table was edited since); a
    catalogue or provider row never does (operator prices always win)."""
    stored = list(stored)
    edited = {(p.provider, p.model, p.effective_from) for p in stored
              if p.source is PriceSource.OPERATOR}
    return [*(p for p in seeded if (p.provider, p.model, p.effective_from) not in edited),
            *stored]


class PriceBook:
    """Every price this process knows, by (provider, model, source), in order of effect."""

    def __init__(self, prices: Iterable[Price] = ()) -> None:
        self._by_model: dict[_Key, tuple[list[Price], list[float]]] = {}
        self.replace(prices)

    def replace(self, prices: Iterable[Price]) -> None:
        by_model: dict[_Key, list[Price]] = {}
        for price in prices:
            by_model.setdefault((price.provider, price.model, price.source), []).append(price)
        for history in by_model.values():
            history.sort(key=lambda price: price.effective_from)
        # With each history, its moments: price_at bisects them (every request asks).
        self._by_model = {model: (history, [price.effective_from for price in history])
                          for model, history in by_model.items()}

    def price_at(self, provider: str, model: str, at: float) -> Price | None:
        """The price in force at ``at``: the latest of the best-ranked source that has one
        in force (an operator's, else the provider's, else the catalogue's)."""
        for source in RANK:
            found = self._by_model.get((provider, model, source))
            if found is None:
                continue
            history, moments = found
            index = bisect.bisect_right(moments, at) - 1
            if index >= 0:
                return history[index]
        return None

    def highest_output_price(self, targets: Iterable[tuple[str, str]], at: float) -> Price | None:
        """The dearest of these (provider, model) targets' prices: what a reservation must
        assume before it knows which one will answer."""
        known = [p for target in targets if (p := self.price_at(*target, at)) is not None]
        return max(known, key=lambda p: (p.output_per_mtok, p.input_per_mtok), default=None)


def prices_from_settings(raw: Any) -> list[Price]:
    """The settings file's ``prices:`` (a seed for the table):

        prices:
          venice:
            llama-3.3-70b: {input: 0.70, output: 2.80}     # USD per million tokens
            qwen3-4b: {input: 0.05, output: 0.15, cached_input: 0.01, from: 2026-01-01}
          anthropic:
            claude-sonnet-4-5: {input: 3, output: 15, cached_input: 0.30,
                                cache_write: 3.75, cache_write_1h: 6}
    """
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        raise PriceError("prices: expected a mapping of provider to models")
    seeded = []
    for provider, models in raw.items():
        if not isinstance(models, Mapping):
            raise PriceError(f"prices.{provider}: expected a mapping of model to prices")
        for model, entry in models.items():
            seeded.append(_price(f"prices.{provider}.{model}", str(provider), str(model), entry))
    return seeded


# A ``prices:`` entry's rates, by the Price field each sets; input and output are required.
_RATES = {"input": "input_per_mtok", "output": "output_per_mtok",
          "cached_input": "cached_input_per_mtok", "cache_write": "cache_write_per_mtok",
          "cache_write_1h": "cache_write_1h_per_mtok"}
# What each key of a ``prices:`` entry means (the configuration reference shows them).
PRICE_KEYS = {
    "input": "USD per million input tokens (required)",
    "output": "USD per million output tokens, reasoning included (required)",
    "cached_input": "USD per million prompt tokens read from the provider's cache",
    "cache_write": "USD per million prompt tokens written to the cache (Anthropic's 5-minute "
                   "writes: 1.25 x input)",
    "cache_write_1h": "USD per million prompt tokens written to the cache for an hour (2 x input)",
    "from": "when the price comes into force: an ISO 8601 date or time, UTC unless it says; "
            "unset: since always",
}


def _price(where: str, provider: str, model: str, entry: Any) -> Price:
    if not isinstance(entry, Mapping) or not {"input", "output"} <= set(entry):
        raise PriceError(f"{where}: expected {{input: USD, output: USD}} per million tokens")
    if unknown := sorted(set(map(str, entry)) - set(_RATES) - {"from"}):
        raise PriceError(f"{where}: unknown rate {unknown[0]!r}; rates are "
                         f"{', '.join(_RATES)} (and from)")
    try:
        rates = {field: Decimal(str(entry[name])) for name, field in _RATES.items()
                 if entry.get(name) is not None}
    except ArithmeticError:
        raise PriceError(f"{where}: prices must be numbers") from None
    if any(not rate.is_finite() or rate < 0 for rate in rates.values()):
        raise PriceError(f"{where}: prices must be finite and not negative")
    return Price(provider=provider, model=model, effective_from=_moment(where, entry.get("from")),
                 **rates)


def _moment(where: str, raw: Any) -> float:
    import datetime as dt

    if raw is None:
        return 0.0  # in force since always
    if isinstance(raw, dt.datetime):
        return raw.replace(tzinfo=raw.tzinfo or dt.UTC).timestamp()
    if isinstance(raw, dt.date):
        return dt.datetime(raw.year, raw.month, raw.day, tzinfo=dt.UTC).timestamp()
    try:
        parsed = dt.datetime.fromisoformat(str(raw))
    except ValueError:
        raise PriceError(f"{where}.from: expected an ISO 8601 time, got {raw!r}") from None
    return parsed.replace(tzinfo=parsed.tzinfo or dt.UTC).timestamp()
