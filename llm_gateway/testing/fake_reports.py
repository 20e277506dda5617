"""The providers' usage and cost report APIs, served by the fake upstream from its ledger
of what it actually served (``fake_ledger``), skewed when told to over- or under-bill.

As the real ones, they take the admin key only (``FakeUpstream(admin_key=...)``; the
inference key gets a 401), and validate their queries strictly:

* openai mode: ``GET /organization/usage/completions`` and ``GET /organization/costs``:
  ``start_time`` (required) and ``end_time`` Unix seconds, ``bucket_width=1d`` (the fake's
  only width), ``group_by`` (``model``; costs: ``line_item``), ``limit``, ``page``.
* anthropic mode: ``GET /organizations/usage_report/messages`` and
  ``GET /organizations/cost_report``: ``starting_at`` (required) and ``ending_at`` RFC 3339,
  ``group_by[]`` (``model``; costs: ``description``), ``limit``, ``page``; costs in cents,
  as decimal strings.
* venice mode: ``GET /billing/usage-history`` (``startTimestamp``, ``endTimestamp``,
  ``currency``, ``pageSize``; or ``cursor`` alone), one entry per request and SKU, in
  ascending time; ``GET /billing/usage`` answers 410, as Venice's has since its sunset.

Day buckets are UTC days. Pages carry opaque cursors (the offset, base64).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from urllib.parse import parse_qs

from llm_gateway.testing.fake_exchange import Exchange, send_json
from llm_gateway.testing.fake_faults import Fault
from llm_gateway.testing.fake_ledger import DIEM_RATES, RATES, Served, ServedLedger

DAY = 86400
_MILLION = Decimal(1_000_000)
type Params = dict[str, list[str]]
Handler = Callable[[Exchange, Fault | None], Awaitable[None]]


class BadQuery(ValueError):
    """A query the real API refuses with a 400: str() is its message."""


def _cursor(state: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(state).encode()).decode().rstrip("=")


def _uncursor(text: str) -> dict[str, object]:
    try:
        state = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise BadQuery("Invalid or expired cursor; restart from the first page") from None
    if not isinstance(state, dict):
        raise BadQuery("Invalid or expired cursor; restart from the first page")
    return state


def _one(params: Params, name: str) -> str | None:
    values = params.get(name)
    return values[-1] if values else None


def _integer(params: Params, name: str, default: int | None, low: int, high: int) -> int:
    raw = _one(params, name)
    if raw is None:
        if default is None:
            raise BadQuery(f"{name}: Field required")
        return default
    if not raw.lstrip("-").isdigit() or not low <= int(raw) <= high:
        raise BadQuery(f"{name}: expected an integer from {low} to {high}, got {raw!r}")
    return int(raw)


def _moment(params: Params, name: str, default: float | None) -> float:
    raw = _one(params, name)
    if raw is None:
        if default is None:
            raise BadQuery(f"{name}: Field required")
        return default
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise BadQuery(f"{name}: invalid RFC 3339 timestamp {raw!r}") from None
    if parsed.tzinfo is None:
        raise BadQuery(f"{name}: a timestamp needs its offset (Z)")
    return parsed.timestamp()


def _groups(params: Params, allowed: set[str]) -> set[str]:
    asked = set(params.get("group_by", []) + params.get("group_by[]", []))
    unknown = sorted(asked - allowed)
    if unknown:
        raise BadQuery(f"group_by: unsupported value {unknown[0]!r}")
    return asked


def _windows(start: float, end: float) -> list[tuple[float, float]]:
    """The UTC day buckets from ``start``'s day up to ``end``."""
    day = datetime.fromtimestamp(start, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    windows = []
    while day.timestamp() < end:
        windows.append((day.timestamp(), (day + timedelta(days=1)).timestamp()))
        day += timedelta(days=1)
    return windows


def _page(params: Params, windows: list[tuple[float, float]],
          limit: int) -> tuple[list[tuple[float, float]], str | None]:
    """The buckets of this page, and the next page's cursor."""
    raw = _one(params, "page")
    offset = 0
    if raw is not None:
        state = _uncursor(raw.removeprefix("page_"))
        offset = state.get("offset") if isinstance(state.get("offset"), int) else -1
        if not 0 <= offset <= len(windows):  # type: ignore[operator]
            raise BadQuery("page: invalid page token")
    chosen = windows[offset:offset + limit]  # type: ignore[misc]
    more = offset + limit < len(windows)  # type: ignore[operator]
    return chosen, ("page_" + _cursor({"offset": offset + limit})) if more else None


def _by_model(served: list[Served], start: float, end: float,
              grouped: bool) -> dict[str | None, list[Served]]:
    found: dict[str | None, list[Served]] = {}
    for entry in served:
        if start <= entry.at < end:
            found.setdefault(entry.model if grouped else None, []).append(entry)
    return found


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- OpenAI ---------------------------------------------------------------------------------


def _openai_usage(params: Params, ledger: ServedLedger) -> dict[str, object]:
    served = ledger.billed()
    grouped = "model" in _groups(params, {"project_id", "user_id", "api_key_id", "model",
                                          "batch", "service_tier"})
    return _openai_page(params, 31, lambda start, end: [
        {"object": "organization.usage.completions.result",
         "input_tokens": sum(e.input_tokens for e in group),
         "input_cached_tokens": sum(e.cache_read_tokens for e in group),
         "input_cache_write_tokens": sum(e.cache_write_5m_tokens + e.cache_write_1h_tokens
                                         for e in group),
         "input_uncached_tokens": sum(e.uncached_input_tokens for e in group),
         "output_tokens": sum(e.output_tokens for e in group),
         "num_model_requests": len(group), "project_id": None, "user_id": None,
         "api_key_id": None, "model": model, "batch": None, "service_tier": None}
        for model, group in _by_model(served, start, end, grouped).items()])


# A costs line item per kind of token, named as OpenAI's are ("gpt-4o, cached input").
_OPENAI_ITEMS = (("input", ("input", "cache_write_5m", "cache_write_1h")),
                 ("cached input", ("cached_input",)), ("output", ("output",)))


def _openai_costs(params: Params, ledger: ServedLedger) -> dict[str, object]:
    served = ledger.billed()
    items = "line_item" in _groups(params, {"project_id", "line_item", "api_key_id"})

    def results(start: float, end: float) -> list[dict[str, object]]:
        found = []
        for model, group in _by_model(served, start, end, items).items():
            parts = [entry.cost_parts("openai") for entry in group]
            for label, kinds in (_OPENAI_ITEMS if items else (("", tuple(RATES["openai"])),)):
                value = sum((part[kind] for part in parts for kind in kinds), Decimal(0))
                if value or not items:
                    found.append({"object": "organization.costs.result",
                                  "amount": {"value": float(value), "currency": "usd"},
                                  "line_item": f"{model}, {label}" if items else None,
                                  "project_id": None, "api_key_id": None,
                                  "quantity": None, "quantity_unit": None})
        return found

    return _openai_page(params, 180, results)


def _openai_page(params: Params, most: int,
                 results: Callable[[float, float], list[dict[str, object]]]
                 ) -> dict[str, object]:
    start = _integer(params, "start_time", None, 0, 2**40)
    end = _integer(params, "end_time", int(time.time()) + 1, start + 1, 2**40)
    if (_one(params, "bucket_width") or "1d") != "1d":
        raise BadQuery("bucket_width: the fake serves 1d buckets only")
    windows, cursor = _page(params, _windows(start, end),
                            _integer(params, "limit", 7, 1, most))
    return {"object": "page", "data": [
        {"object": "bucket", "start_time": int(first), "end_time": int(last),
         "results": results(first, last)} for first, last in windows],
        "has_more": cursor is not None, "next_page": cursor}


# -- Anthropic ------------------------------------------------------------------------------


def _anthropic_usage(params: Params, ledger: ServedLedger) -> dict[str, object]:
    served = ledger.billed()
    grouped = "model" in _groups(params, {"api_key_id", "workspace_id", "model",
                                          "service_tier", "context_window", "inference_geo",
                                          "speed", "account_id", "service_account_id"})
    return _anthropic_page(params, lambda start, end: [
        {"uncached_input_tokens": sum(e.uncached_input_tokens for e in group),
         "cache_read_input_tokens": sum(e.cache_read_tokens for e in group),
         "cache_creation": {
             "ephemeral_5m_input_tokens": sum(e.cache_write_5m_tokens for e in group),
             "ephemeral_1h_input_tokens": sum(e.cache_write_1h_tokens for e in group)},
         "output_tokens": sum(e.output_tokens for e in group),
         "server_tool_use": {"web_search_requests": 0}, "model": model,
         "api_key_id": None, "workspace_id": None,
         "service_tier": "standard" if grouped else None, "context_window": None}
        for model, group in _by_model(served, start, end, grouped).items()])


_ANTHROPIC_TOKENS = (("uncached_input_tokens", "input", "Input Tokens"),
                     ("cache_read_input_tokens", "cached_input", "Cache Read"),
                     ("cache_creation.ephemeral_5m_input_tokens", "cache_write_5m",
                      "Cache Write (5m)"),
                     ("cache_creation.ephemeral_1h_input_tokens", "cache_write_1h",
                      "Cache Write (1h)"),
                     ("output_tokens", "output", "Output Tokens"))


def _anthropic_costs(params: Params, ledger: ServedLedger) -> dict[str, object]:
    served = ledger.billed()
    described = "description" in _groups(params, {"workspace_id", "description"})

    def results(start: float, end: float) -> list[dict[str, object]]:
        found = []
        for model, group in _by_model(served, start, end, described).items():
            parts = [entry.cost_parts("anthropic") for entry in group]
            kinds = _ANTHROPIC_TOKENS if described else ((None, None, None),)
            for token_type, kind, label in kinds:
                usd = sum((p[k] for p in parts for k in ((kind,) if kind else p)), Decimal(0))
                if usd or not described:
                    found.append({
                        "currency": "USD", "amount": format((usd * 100).normalize(), "f"),
                        "workspace_id": None,
                        "description": f"{model} Usage - {label}" if described else None,
                        "cost_type": "tokens" if described else None, "context_window": None,
                        "model": model, "service_tier": "standard" if described else None,
                        "token_type": token_type, "inference_geo": None})
        return found

    return _anthropic_page(params, results)


def _anthropic_page(params: Params, results: Callable[[float, float], list[dict[str, object]]]
                    ) -> dict[str, object]:
    start = _moment(params, "starting_at", None)
    end = _moment(params, "ending_at", time.time() + 1)
    if (_one(params, "bucket_width") or "1d") != "1d":
        raise BadQuery("bucket_width: the fake serves 1d buckets only")
    windows, cursor = _page(params, _windows(start, end), _integer(params, "limit", 7, 1, 31))
    return {"data": [{"starting_at": _stamp(first), "ending_at": _stamp(last),
                      "results": results(first, last)} for first, last in windows],
            "has_more": cursor is not None, "next_page": cursor}


# -- Venice ---------------------------------------------------------------------------------

_VENICE_PARAMS = {"startTimestamp", "endTimestamp", "currency", "pageSize", "cursor"}
_VENICE_CURRENCIES = {"USD", "DIEM", "BUNDLED_CREDITS", "EARNED_CREDITS"}


def _venice_history(params: Params, ledger: ServedLedger) -> dict[str, object]:
    served, currency = ledger.billed(), ledger.currency
    unknown = sorted(set(params) - _VENICE_PARAMS)
    if unknown:
        raise BadQuery(f"Unrecognized key(s) in object: '{unknown[0]}'")
    if "cursor" in params:
        if len(params) > 1:
            raise BadQuery("A cursor carries its walk's filters: send it alone")
        state = _uncursor(_one(params, "cursor") or "")
        start, end = float(state.get("s", 0)), float(state.get("e", 0))  # type: ignore[arg-type]
        size, offset = int(state.get("n", 0)), int(state.get("o", -1))  # type: ignore[call-overload]
        wanted = state.get("c")
    else:
        start = _moment(params, "startTimestamp", 0.0)
        end = _moment(params, "endTimestamp", time.time() + 1)
        if end <= start:
            raise BadQuery("endTimestamp must be later than startTimestamp")
        size, offset = _integer(params, "pageSize", 1000, 10, 1000), 0
        wanted = _one(params, "currency")
        if wanted is not None and wanted not in _VENICE_CURRENCIES:
            raise BadQuery(f"currency: invalid enum value {wanted!r}")
    entries = [entry for request in sorted(served, key=lambda e: e.at)
               if start <= request.at < end for entry in _venice_entries(request, currency)
               if wanted in (None, entry["currency"])]
    if not 0 <= offset <= len(entries):
        raise BadQuery("Invalid or expired cursor; restart from the first page")
    more = offset + size < len(entries)
    cursor = _cursor({"s": start, "e": end, "n": size, "o": offset + size, "c": wanted})
    return {"data": entries[offset:offset + size], "nextCursor": cursor if more else None}


def _venice_entries(request: Served, currency: str) -> list[dict[str, object]]:
    """Its input and output entries: ``units`` in millions of tokens, ``amount`` negative in
    the currency charged."""
    entries = []
    for kind, tokens in (("input", request.input_tokens), ("output", request.output_tokens)):
        units = Decimal(tokens) / _MILLION
        rate = RATES["venice"][kind]
        charged = tokens * (DIEM_RATES[kind] if currency == "DIEM" else rate)
        entries.append({
            "timestamp": datetime.fromtimestamp(request.at, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "sku": f"{request.model}-llm-{kind}-mtoken", "units": float(units),
            "pricePerUnitUsd": float(rate * _MILLION), "amount": -float(charged),
            "currency": currency, "notes": "API Inference",
            "inferenceDetails": {"requestId": request.request_id,
                                 "promptTokens": request.input_tokens,
                                 "completionTokens": request.output_tokens,
                                 "inferenceExecutionTime": 1}})
    return entries


async def _venice_gone(exchange: Exchange, fault: Fault | None) -> None:
    """Venice's answer to its retired ledger endpoint, since 2026-09-16."""
    await send_json(exchange.send, 410, {
        "error": "GET /billing/usage has been retired; use GET /billing/usage-history "
                 "(page and limit are now pageSize and cursor; startDate and endDate are "
                 "startTimestamp and endTimestamp)"}, [
        ("deprecation", "@1783555200"), ("sunset", "Wed, 16 Sep 2026 00:00:00 GMT"),
        ("link", '</api/v1/billing/usage-history>; rel="successor-version"')])


# -- routing --------------------------------------------------------------------------------

type Report = Callable[[Params, ServedLedger], dict[str, object]]
_REPORTS: dict[str, dict[str, Report]] = {
    "openai": {"/organization/usage/completions": _openai_usage,
               "/organization/costs": _openai_costs},
    "anthropic": {"/organizations/usage_report/messages": _anthropic_usage,
                  "/organizations/cost_report": _anthropic_costs},
    "venice": {"/billing/usage-history": _venice_history},
}


def is_report(mode: str, endpoint: str) -> bool:
    """Whether ``endpoint`` is one of ``mode``'s report APIs (which take the admin key)."""
    return endpoint in _REPORTS.get(mode, {}) or (mode == "venice"
                                                   and endpoint == "/billing/usage")


def handlers(mode: str, endpoint: str, ledger: ServedLedger) -> dict[str, Handler] | None:
    """The report endpoint's handlers by method, or None when ``endpoint`` is none."""
    if mode == "venice" and endpoint == "/billing/usage":
        return {"GET": _venice_gone}
    report = _REPORTS.get(mode, {}).get(endpoint)
    if report is None:
        return None
    return {"GET": functools.partial(_answer, report=report, ledger=ledger)}


async def _answer(exchange: Exchange, fault: Fault | None, *, report: Report,
                  ledger: ServedLedger) -> None:
    params = parse_qs(exchange.query, keep_blank_values=True)
    try:
        body = report(params, ledger)
    except BadQuery as problem:
        await exchange.send_error(400, str(problem))
        return
    await exchange.send_success(body, fault)
