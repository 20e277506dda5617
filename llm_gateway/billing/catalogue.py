"""The maintained price catalogue: the installed genai-prices dataset's prices, and a
provider's own published list (Venice's ``model_spec.pricing`` in ``/models``), as dated
price rows for ``prices sync``. Pure: it reads data and returns rows; the command writes
them. No price is written here: every rate comes from the dataset or the provider.

A dataset model's prices become one row per dated change (its ``StartDateConstraint``s; the
first, unconditional one in force since always). Its token rates map to a Price's: input,
output, cache reads, 5-minute cache writes (``cache_write_5m_mtok``, else
``cache_write_mtok``) and 1-hour ones. A rate tiered by prompt size becomes the row's
long-context rates; a rate of anything else (audio, images, web searches, requests) is not
the gateway's to bill and is left out, as are time-of-day prices (an off-peak discount is
never assumed).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from llm_gateway.billing.model import RATE_FIELDS, Price, PriceSource

# The dataset's provider for a gateway profile that names one; other profiles (venice,
# generic) are matched by their base URL against the dataset's API patterns.
DATASET_PROVIDER_OF_PROFILE = {"openai": "openai", "anthropic": "anthropic", "gemini": "google"}
# The dataset's price keys for each of a Price's rates, first found wins.
_DATASET_KEYS: dict[str, tuple[str, ...]] = {
    "input_per_mtok": ("input_mtok",),
    "output_per_mtok": ("output_mtok",),
    "cached_input_per_mtok": ("cache_read_mtok",),
    "cache_write_per_mtok": ("cache_write_5m_mtok", "cache_write_mtok"),
    "cache_write_1h_per_mtok": ("cache_write_1h_mtok",),
}
# Venice's model_spec.pricing names, by a Price's rate.
_LIST_KEYS = {"input_per_mtok": "input", "output_per_mtok": "output",
              "cached_input_per_mtok": "cache_input", "cache_write_per_mtok": "cache_write"}


@dataclass(frozen=True, slots=True)
class Routed:
    """One upstream model the routes send requests to: its provider (as the gateway names
    it, with the profile and base URL that say which dataset provider it is) and the
    aliases using it."""

    provider: str
    profile: str
    base_url: str
    model: str
    aliases: tuple[str, ...] = ()


def _providers() -> list[Any]:
    from genai_prices.data import providers

    return list(providers)


def dataset_provider(profile: str, base_url: str) -> str | None:
    """The dataset's id of the provider this profile and base URL reach (None: not in it)."""
    if profile in DATASET_PROVIDER_OF_PROFILE:
        return DATASET_PROVIDER_OF_PROFILE[profile]
    root = f"{urlsplit(base_url).scheme}://{urlsplit(base_url).netloc}"
    return next((provider.id for provider in _providers()
                 if re.match(provider.api_pattern, root)), None)


def catalogue_prices(routed: Routed) -> list[Price] | None:
    """The dataset's dated prices of a routed model (None: the dataset does not know its
    provider or model; a model is matched as the dataset matches names)."""
    provider_id = dataset_provider(routed.profile, routed.base_url)
    if provider_id is None:
        return None
    providers = _providers()
    provider = next((p for p in providers if p.id == provider_id), None)
    model = provider.find_model(routed.model, all_providers=providers) if provider else None
    if model is None:
        return None
    rows = [row for moment, prices in _dated(model.prices)
            if (row := _row(routed, moment, prices)) is not None]
    return rows or None


def _dated(prices: Any) -> Iterable[tuple[float, Any]]:
    from genai_prices.types import ModelPrice, StartDateConstraint

    if isinstance(prices, ModelPrice):
        yield 0.0, prices
        return
    for conditional in prices:
        constraint = conditional.constraint
        if constraint is None:
            yield 0.0, conditional.prices
        elif isinstance(constraint, StartDateConstraint):
            start = constraint.start_date
            yield (dt.datetime(start.year, start.month, start.day, tzinfo=dt.UTC).timestamp(),
                   conditional.prices)


def _row(routed: Routed, moment: float, prices: Any) -> Price | None:
    from genai_prices.types import TieredPrices

    base: dict[str, Decimal] = {}
    long: dict[str, Decimal] = {}
    thresholds: set[int] = set()
    for name, keys in _DATASET_KEYS.items():
        value = next((v for key in keys if (v := getattr(prices, key, None)) is not None), None)
        if isinstance(value, TieredPrices):
            base[name] = value.base
            tier = value.tiers[-1] if value.tiers else None
            if tier is not None:
                thresholds.add(tier.start)
                long[name] = tier.price
        elif value is not None:
            base[name] = value
            long[name] = value  # not tiered: the same rate above the threshold
    if "input_per_mtok" not in base:
        return None  # priced by something other than tokens (images, audio, requests)
    base.setdefault("output_per_mtok", Decimal(0))  # embeddings: no output tokens
    long.setdefault("output_per_mtok", Decimal(0))
    price = Price(provider=routed.provider, model=routed.model, effective_from=moment,
                  source=PriceSource.CATALOGUE, **base)  # type: ignore[arg-type]
    if len(thresholds) != 1:
        return price  # no tier (several thresholds: none of the dataset's models has them)
    return replace(price, long_context_above=thresholds.pop(),
                   long_context=replace(price, **long))


def listed_prices(routed: Routed, models_list: Mapping[str, Any], at: float) -> Price | None:
    """A provider's own price of a routed model from its model list (Venice's ``/models``:
    ``model_spec.pricing``, USD per million tokens), in force from ``at`` (None: the list
    carries no price for it)."""
    data = models_list.get("data")
    entry = next((m for m in data if isinstance(m, Mapping) and m.get("id") == routed.model),
                 None) if isinstance(data, list) else None
    spec = entry.get("model_spec") if entry else None
    pricing = spec.get("pricing") if isinstance(spec, Mapping) else None
    if not isinstance(pricing, Mapping):
        return None
    rates = {}
    for name, key in _LIST_KEYS.items():
        quoted = pricing.get(key)
        usd = quoted.get("usd") if isinstance(quoted, Mapping) else None
        if isinstance(usd, int | float) and not isinstance(usd, bool) and usd >= 0:
            rates[name] = Decimal(str(usd))  # as written: the JSON's decimal text
    if not {"input_per_mtok", "output_per_mtok"} <= set(rates):
        return None
    return Price(provider=routed.provider, model=routed.model, effective_from=at,
                 source=PriceSource.PROVIDER, **rates)  # type: ignore[arg-type]


def same_rates(a: Price | None, b: Price | None) -> bool:
    """Whether two prices bill alike (the moment and source aside)."""
    if a is None or b is None:
        return a is b
    return (tuple(getattr(a, n) for n in RATE_FIELDS) == tuple(getattr(b, n) for n in RATE_FIELDS)
            and a.long_context_above == b.long_context_above
            and same_rates(a.long_context, b.long_context))


@dataclass(frozen=True, slots=True)
class Change:
    """A row ``prices sync`` would write, with the row it replaces or follows (None: the
    model's first price of that source)."""

    before: Price | None
    after: Price


def plan_sync(proposed: Iterable[Price], stored: Iterable[Price]) -> list[Change]:
    """The rows of ``proposed`` that change the table: a catalogue row where the table has
    none or other rates at its moment (never where an operator's row is: operator prices
    always win), a provider row where its rates differ from the provider's latest."""
    stored = list(stored)
    at_moment = {(p.provider, p.model, p.effective_from): p for p in stored}
    latest: dict[tuple[str, str], Price] = {}
    for price in sorted(stored, key=lambda p: p.effective_from):
        if price.source is PriceSource.PROVIDER:
            latest[(price.provider, price.model)] = price
    changes = []
    for price in proposed:
        if price.source is PriceSource.PROVIDER:
            before = latest.get((price.provider, price.model))
        else:
            before = at_moment.get((price.provider, price.model, price.effective_from))
            if before is not None and before.source is PriceSource.OPERATOR:
                continue
        if not same_rates(before, price):
            changes.append(Change(before, price))
    return changes
