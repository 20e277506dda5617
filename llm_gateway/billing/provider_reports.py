"""The providers' own usage and cost reports, as their APIs document them, read into
reconciliation rows (``reconcile.Billed``). Pure: what to ask for (paths and queries) and
how to read each page; the HTTP is ``report_client``'s.

* OpenAI (``openai`` profile): ``GET /organization/usage/completions`` (daily buckets of
  ``results`` grouped by model: ``num_model_requests``, ``input_tokens`` (cache reads and
  writes included), ``output_tokens``, ``input_cached_tokens``,
  ``input_cache_write_tokens``) and ``GET /organization/costs`` (``amount.value`` in USD,
  grouped by ``line_item``, which names the model: ``gpt-4o-2024-08-06, cached input``).
  ``start_time``/``end_time`` in Unix seconds, pages by ``has_more``/``next_page``.
* Anthropic (``anthropic``): ``GET /organizations/usage_report/messages`` (grouped by model:
  ``uncached_input_tokens``, ``cache_read_input_tokens``, ``cache_creation``'s 5-minute and
  1-hour tokens, ``output_tokens``; no request count) and ``GET /organizations/cost_report``
  (grouped by description, which names the model; ``amount`` a decimal string in cents).
  ``starting_at``/``ending_at`` in RFC 3339, ``x-api-key`` the admin key, pages alike.
* Venice (``venice``): ``GET /billing/usage-history``, the per-request ledger (its
  ``/billing/usage`` answers 410 since 2026-09-16): one entry per request and SKU
  (``<model>-llm-input-mtoken``), ``amount`` negative in the currency charged (USD, DIEM,
  bundled or earned credits), ``units`` x ``pricePerUnitUsd`` its USD value, the request's
  id and tokens in ``inferenceDetails``; ``startTimestamp``/``endTimestamp``, then
  ``cursor`` alone from ``nextCursor``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol

from llm_gateway.billing.reconcile import FIGURES, Billed, Figures

type Query = tuple[tuple[str, str], ...]
ANTHROPIC_VERSION = "2023-06-01"
# Daily buckets per page: the most both OpenAI's and Anthropic's reports return.
DAYS_PER_PAGE = 31
VENICE_PAGE_SIZE = 1000
# Venice's currencies denominated in USD; DIEM is valued at the entry's USD list price.
_USD_CURRENCIES = {"USD", "BUNDLED_CREDITS", "EARNED_CREDITS"}
_VENICE_SKU_MODEL = re.compile(r"^(?P<model>.+?)-llm-[a-z0-9-]+$")


class ReportFormatError(ValueError):
    """A report page not as the provider documents it; str() says where."""


@dataclass(frozen=True, slots=True)
class Stream:
    """One report to read, page after page: its name, path under the API root, first query."""

    name: str
    path: str
    query: Query


class Ledger(Protocol):
    """One provider kind's report API."""

    kind: str
    compared: tuple[str, ...]  # the figures its report carries

    def streams(self, since: date, until: date) -> list[Stream]: ...
    def headers(self, admin_key: str) -> list[tuple[str, str]]: ...
    def page(self, stream: Stream, body: Any) -> tuple[list[Any], Query | None]: ...
    def rows(self, stream: Stream, items: list[Any]) -> list[Billed]: ...


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def _rfc3339(day: date) -> str:
    return _midnight(day).strftime("%Y-%m-%dT%H:%M:%SZ")


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ReportFormatError(f"{where}: expected an object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ReportFormatError(f"{where}: expected a list")
    return value


def _count(value: Any, where: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ReportFormatError(f"{where}: expected a count, got {value!r}")
    return value


def _decimal(value: Any, where: str) -> Decimal:
    try:
        amount = Decimal(str(value)) if isinstance(value, int | float | str) else None
    except InvalidOperation:
        amount = None
    if amount is None or not amount.is_finite() or isinstance(value, bool):
        raise ReportFormatError(f"{where}: expected a number, got {value!r}")
    return amount


def _paged(body: Any, stream: Stream) -> tuple[list[Any], Query | None]:
    """OpenAI's and Anthropic's page: ``data`` buckets, and the next page's cursor."""
    page = _mapping(body, stream.name)
    buckets = _list(page.get("data"), f"{stream.name}.data")
    cursor = page.get("next_page")
    if page.get("has_more") is True and isinstance(cursor, str) and cursor:
        return buckets, (*[p for p in stream.query if p[0] != "page"], ("page", cursor))
    return buckets, None


def _results(bucket: Any, where: str, start: str) -> tuple[str, list[Mapping[str, Any]]]:
    """A bucket's UTC day (from its ``start`` field) and its results."""
    found = _mapping(bucket, where)
    moment = found.get(start)
    if isinstance(moment, int) and not isinstance(moment, bool):
        day = datetime.fromtimestamp(moment, UTC).date().isoformat()
    elif isinstance(moment, str):
        try:
            day = datetime.fromisoformat(moment).astimezone(UTC).date().isoformat()
        except ValueError:
            raise ReportFormatError(f"{where}.{start}: not a time: {moment!r}") from None
    else:
        raise ReportFormatError(f"{where}.{start}: missing")
    results = _list(found.get("results"), f"{where}.results")
    return day, [_mapping(r, f"{where}.results[]") for r in results]


def openai_line_item_model(line_item: str) -> str:
    """The model a costs line item names (``priority | gpt-4o-2024-08-06, cached input``);
    an item naming none (``web search tool calls``) as it is."""
    named = line_item.rpartition(" | ")[2]
    model, comma, _ = named.partition(", ")
    return model.strip() if comma else line_item.strip()


class OpenAILedger:
    kind = "openai"
    compared = FIGURES

    def streams(self, since: date, until: date) -> list[Stream]:
        window = (("start_time", str(int(_midnight(since).timestamp()))),
                  ("end_time", str(int(_midnight(until).timestamp()))),
                  ("bucket_width", "1d"), ("limit", str(DAYS_PER_PAGE)))
        return [Stream("usage", "/organization/usage/completions",
                       (*window, ("group_by", "model"))),
                Stream("costs", "/organization/costs", (*window, ("group_by", "line_item")))]

    def headers(self, admin_key: str) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {admin_key}")]

    def page(self, stream: Stream, body: Any) -> tuple[list[Any], Query | None]:
        return _paged(body, stream)

    def rows(self, stream: Stream, items: list[Any]) -> list[Billed]:
        return _daily_rows(self, "openai", "start_time", stream, items)

    @staticmethod
    def _usage(day: str, result: Mapping[str, Any], where: str) -> Billed:
        write = result.get("input_cache_write_tokens")
        return Billed(day, str(result.get("model") or "unknown"), Figures(
            requests=_count(result.get("num_model_requests"), f"{where}.num_model_requests"),
            input_tokens=_count(result.get("input_tokens"), f"{where}.input_tokens"),
            output_tokens=_count(result.get("output_tokens"), f"{where}.output_tokens"),
            cache_read_tokens=_count(result.get("input_cached_tokens"),
                                     f"{where}.input_cached_tokens"),
            cache_write_tokens=None if write is None else _count(write, where)))

    @staticmethod
    def _cost(day: str, result: Mapping[str, Any], where: str) -> Billed:
        amount = _mapping(result.get("amount"), f"{where}.amount")
        currency = str(amount.get("currency") or "").lower()
        if currency != "usd":
            raise ReportFormatError(f"{where}.amount.currency: {currency!r}, not usd")
        item = result.get("line_item")
        return Billed(day, openai_line_item_model(item) if isinstance(item, str) else "unknown",
                      Figures(usd=_decimal(amount.get("value"), f"{where}.amount.value")))


def _daily_rows(ledger: Any, provider: str, start: str, stream: Stream,
                items: list[Any]) -> list[Billed]:
    """The rows of a report of daily buckets (OpenAI's and Anthropic's alike: each bucket
    has its start under ``start`` and its ``results``), read by ``ledger``'s _usage or
    _cost as the stream is the usage or the cost report."""
    rows = []
    for index, bucket in enumerate(items):
        where = f"{provider} {stream.name}.data[{index}]"
        day, results = _results(bucket, where, start)
        read = ledger._usage if stream.name == "usage" else ledger._cost
        rows += [read(day, result, where) for result in results]
    return rows


class AnthropicLedger:
    kind = "anthropic"
    compared = tuple(name for name in FIGURES if name != "requests")

    def streams(self, since: date, until: date) -> list[Stream]:
        window = (("starting_at", _rfc3339(since)), ("ending_at", _rfc3339(until)),
                  ("bucket_width", "1d"), ("limit", str(DAYS_PER_PAGE)))
        return [Stream("usage", "/organizations/usage_report/messages",
                       (*window, ("group_by[]", "model"))),
                Stream("costs", "/organizations/cost_report",
                       (*window, ("group_by[]", "description")))]

    def headers(self, admin_key: str) -> list[tuple[str, str]]:
        return [("x-api-key", admin_key), ("anthropic-version", ANTHROPIC_VERSION)]

    def page(self, stream: Stream, body: Any) -> tuple[list[Any], Query | None]:
        return _paged(body, stream)

    def rows(self, stream: Stream, items: list[Any]) -> list[Billed]:
        return _daily_rows(self, "anthropic", "starting_at", stream, items)

    @staticmethod
    def _usage(day: str, result: Mapping[str, Any], where: str) -> Billed:
        creation = _mapping(result.get("cache_creation") or {}, f"{where}.cache_creation")
        written = sum(_count(creation.get(name), f"{where}.cache_creation.{name}")
                      for name in ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens"))
        read = _count(result.get("cache_read_input_tokens"), f"{where}.cache_read_input_tokens")
        uncached = _count(result.get("uncached_input_tokens"), f"{where}.uncached_input_tokens")
        return Billed(day, str(result.get("model") or "unknown"), Figures(
            input_tokens=uncached + read + written,
            output_tokens=_count(result.get("output_tokens"), f"{where}.output_tokens"),
            cache_read_tokens=read, cache_write_tokens=written))

    @staticmethod
    def _cost(day: str, result: Mapping[str, Any], where: str) -> Billed:
        currency = str(result.get("currency") or "")
        if currency.upper() != "USD":
            raise ReportFormatError(f"{where}.currency: {currency!r}, not USD")
        cents = _decimal(result.get("amount"), f"{where}.amount")
        model = result.get("model") or result.get("description") or "unknown"
        return Billed(day, str(model), Figures(usd=cents / 100))


class VeniceLedger:
    kind = "venice"
    compared = ("requests", "input_tokens", "output_tokens", "usd")

    def streams(self, since: date, until: date) -> list[Stream]:
        return [Stream("usage-history", "/billing/usage-history", (
            ("startTimestamp", _rfc3339(since)), ("endTimestamp", _rfc3339(until)),
            ("pageSize", str(VENICE_PAGE_SIZE))))]

    def headers(self, admin_key: str) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {admin_key}")]

    def page(self, stream: Stream, body: Any) -> tuple[list[Any], Query | None]:
        page = _mapping(body, "venice usage-history")
        entries = _list(page.get("data"), "venice usage-history.data")
        cursor = page.get("nextCursor")
        return entries, ((("cursor", cursor),) if isinstance(cursor, str) and cursor else None)

    def rows(self, stream: Stream, items: list[Any]) -> list[Billed]:
        """One row per request (its SKUs' amounts summed, its tokens once), and one per
        entry that is no inference (no request id)."""
        requests: dict[str, tuple[str, str, Figures]] = {}
        rows = []
        for index, item in enumerate(items):
            where = f"venice usage-history.data[{index}]"
            entry = _mapping(item, where)
            day, model, usd = self._entry(entry, where)
            details = entry.get("inferenceDetails")
            request = details.get("requestId") if isinstance(details, Mapping) else None
            if not isinstance(request, str) or not request:
                rows.append(Billed(day, model, Figures(usd=usd)))
                continue
            tokens = Figures(requests=1,
                             input_tokens=_count(details.get("promptTokens"), where),
                             output_tokens=_count(details.get("completionTokens"), where))
            known = requests.get(request)
            requests[request] = (day, model, (tokens if known is None else known[2])
                                 .plus(Figures(usd=usd)))
        rows += [Billed(day, model, figures) for day, model, figures in requests.values()]
        return rows

    @staticmethod
    def _entry(entry: Mapping[str, Any], where: str) -> tuple[str, str, Decimal]:
        """An entry's UTC day, model (from its SKU) and USD value."""
        stamp = entry.get("timestamp")
        try:
            day = datetime.fromisoformat(str(stamp)).astimezone(UTC).date().isoformat()
        except ValueError:
            raise ReportFormatError(f"{where}.timestamp: not a time: {stamp!r}") from None
        sku = str(entry.get("sku") or "unknown")
        named = _VENICE_SKU_MODEL.match(sku)
        currency = str(entry.get("currency") or "")
        if currency in _USD_CURRENCIES:
            usd = -_decimal(entry.get("amount"), f"{where}.amount")
        else:  # DIEM: charged in its own unit, worth its USD list price
            usd = (_decimal(entry.get("units"), f"{where}.units")
                   * _decimal(entry.get("pricePerUnitUsd"), f"{where}.pricePerUnitUsd"))
        return day, named.group("model") if named else sku, usd


LEDGERS: dict[str, Ledger] = {ledger.kind: ledger for ledger in (
    OpenAILedger(), AnthropicLedger(), VeniceLedger())}


def ledger_for(profile: str) -> Ledger | None:
    """The report API of a provider of this profile; None: it publishes none we read."""
    return LEDGERS.get(profile)


def query_text(query: Sequence[tuple[str, str]]) -> str:
    """The query as a URL's, each value escaped."""
    from urllib.parse import urlencode

    return urlencode(list(query))
