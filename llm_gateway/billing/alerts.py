"""Budget alerts, the pure part: which thresholds a budget's spend has reached, what an alert
says (its JSON payload), how it is signed, and how fast a budget burns.

A budget's counter in the ledger is named ``<unit>:<scope>:<id>:<window>`` (``usd:key:<key
id>:d20261203``, ``tok:subject:team-a:m202612``; llm_gateway.billing.quotas names them), in
whole units: 1e-10 USD, or tokens. A threshold (a fraction of the limit: 0.5, 0.8, 1.0 by
default) is *reached* once what the counter has spent is at least that fraction of its
limit. An alert is sent once per counter (so per budget and window start) and threshold:
``dedup_key`` is what the replicas agree on.

The signature is Stripe's scheme (a documented, well-known form that also stops replays):

    x-llm-gateway-signature: t=<Unix seconds>,v1=<hex HMAC-SHA256>

where the HMAC, keyed with the webhook's secret, is over ``<t>.<raw body>`` (the timestamp,
a full stop, and the body's bytes exactly as sent). A receiver recomputes it over the bytes
it received, compares in constant time, and refuses a timestamp more than a few minutes
from its clock (``SIGNATURE_TOLERANCE_SECONDS``); each attempt is signed anew, so a retry
carries a fresh timestamp. The payload's ``id`` is the same in every attempt: a receiver
drops repeats by it.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from llm_gateway.billing.model import Budget, BudgetScope
from llm_gateway.billing.quotas import windows

DEFAULT_THRESHOLDS = (Decimal("0.5"), Decimal("0.8"), Decimal("1"))
SIGNATURE_HEADER = "x-llm-gateway-signature"
SIGNATURE_SCHEME = "v1"
SIGNATURE_TOLERANCE_SECONDS = 300  # what a receiver should accept (Stripe's default)
EVENT = "budget_alert"
UNITS_PER_USD = Decimal(10) ** 10  # the ledger's USD unit (llm_gateway.billing.quotas)
_UNITS = {"usd": "usd", "tok": "tokens"}
_WINDOWS = {"d": "daily", "m": "monthly"}


@dataclass(frozen=True, slots=True)
class BudgetWindow:
    """One budget's counter in one window: whose, of what, from when to when, its limit."""

    counter: str  # the ledger's name of it
    unit: str  # "usd" or "tokens"
    scope: BudgetScope
    scope_id: str
    window: str  # "daily" or "monthly"
    window_id: str  # "2026-12-03", "2026-12"
    start: float  # Unix seconds, UTC
    end: float
    limit: int  # in the counter's units (1e-10 USD, or tokens)

    @property
    def budget(self) -> str:
        """The budget's field this counter holds requests to: daily_usd, monthly_tokens..."""
        return f"{self.window}_{self.unit}"


def budget_window(counter: str, limit: int) -> BudgetWindow | None:
    """The window of a budget counter's name (None: not a USD or token budget's, such as a
    token bucket's ``tpm:``)."""
    unit, _, rest = counter.partition(":")
    scope, _, rest = rest.partition(":")
    owner, _, window_id = rest.rpartition(":")  # an id may hold a colon; a window none
    if unit not in _UNITS or scope not in ("key", "subject") or not owner:
        return None
    bounds = window_bounds(window_id)
    if bounds is None:
        return None
    start, end = bounds
    kind = _WINDOWS[window_id[0]]
    shown = f"{window_id[1:5]}-{window_id[5:7]}" + (f"-{window_id[7:9]}" if kind == "daily" else "")
    return BudgetWindow(counter, _UNITS[unit], BudgetScope(scope), owner, kind, shown,
                        start, end, limit)


def window_bounds(window_id: str) -> tuple[float, float] | None:
    """(start, end) in Unix seconds of a counter's window, ``d20261203`` or ``m202612``."""
    try:
        if window_id[:1] == "d" and len(window_id) == 9:
            moment = datetime.strptime(window_id[1:], "%Y%m%d").replace(tzinfo=UTC)
            start = moment.timestamp()
            return start, start + 86400.0
        if window_id[:1] == "m" and len(window_id) == 7:
            year, month = int(window_id[1:5]), int(window_id[5:7])
            start = float(calendar.timegm((year, month, 1, 0, 0, 0)))
            days = calendar.monthrange(year, month)[1]
            return start, start + days * 86400.0
    except ValueError:
        return None
    return None


def limit_of(budget: Budget, window: BudgetWindow) -> int | None:
    """The budget's limit on this counter, in its units (None: it has no such limit)."""
    value = getattr(budget, window.budget, None)
    if value is None:
        return None
    return int((Decimal(value) * UNITS_PER_USD).to_integral_value()) if window.unit == "usd" \
        else int(value)


def reached(spent: int, limit: int, thresholds: Iterable[Decimal]) -> list[Decimal]:
    """The thresholds that ``spent`` of ``limit`` has reached (a limit of 0 reaches none by
    spending: nothing is ever spent under it)."""
    if limit <= 0:
        return []
    return [t for t in thresholds if spent >= t * limit]


def crossed(before: int, after: int, limit: int,
            thresholds: Iterable[Decimal]) -> list[Decimal]:
    """The thresholds that spending from ``before`` to ``after`` reached: each once, however
    many one step jumps past."""
    thresholds = list(thresholds)
    already = set(reached(before, limit, thresholds))
    return [t for t in reached(after, limit, thresholds) if t not in already]


def dedup_key(window: BudgetWindow, threshold: Decimal) -> str:
    """What an alert is sent once for: the counter (a budget and its window's start) and
    the threshold."""
    return f"{window.counter}@{threshold.normalize()}"


@dataclass(frozen=True, slots=True)
class Burn:
    """How fast a budget is spent: its rate over the part of the window gone by, and when
    it runs out at that rate (None: not within this window, or nothing spent yet)."""

    per_hour: Decimal
    runs_out_at: float | None
    exhausted: bool = False


def burn(spent: Decimal, limit: Decimal, start: float, end: float, now: float) -> Burn:
    """Spent over the elapsed part of the window, per hour; the moment the rest of the limit
    is gone at that rate, if that is before the window ends (and the budget starts over)."""
    elapsed_hours = Decimal(max(0.0, min(now, end) - start)) / 3600
    if elapsed_hours <= 0 or spent <= 0:
        return Burn(Decimal(0), None, limit <= spent)
    rate = spent / elapsed_hours
    if spent >= limit:
        return Burn(rate, None, True)
    runs_out_at = now + float((limit - spent) / rate) * 3600
    return Burn(rate, runs_out_at if runs_out_at < end else None)


def usd_text(units: int | Decimal) -> str:
    """1e-10 USD units as an exact decimal text with at least two decimals."""
    whole, _, fraction = format((Decimal(units) / UNITS_PER_USD).normalize(), "f").partition(".")
    return f"{whole}.{fraction.ljust(2, '0')}"


def amount(window: BudgetWindow, units: int) -> str | int:
    """A counter's amount as the alert says it: USD as decimal text, tokens as a number."""
    return usd_text(units) if window.unit == "usd" else units


@dataclass(frozen=True, slots=True)
class Alert:
    """A threshold reached: by whom and when (``at``, Unix seconds), with what spent."""

    id: str
    window: BudgetWindow
    threshold: Decimal
    spent: int
    at: float
    refused: bool = False  # reached by a refusal: the budget could not pay for a request


def alert_payload(alert: Alert) -> dict[str, Any]:
    """The JSON object a webhook receives and the log event carries."""
    window = alert.window
    spent_units, limit_units = Decimal(alert.spent), Decimal(window.limit)
    rate = burn(spent_units, limit_units, window.start, window.end, alert.at)
    per_hour = (usd_text(rate.per_hour) if window.unit == "usd"
                else format(rate.per_hour.quantize(Decimal("0.01")), "f"))
    who = "key_id" if window.scope is BudgetScope.KEY else "subject_id"
    return {
        "id": alert.id, "type": "budget.threshold", "created_at": round(alert.at, 3),
        "scope": window.scope.value, who: window.scope_id, "budget": window.budget,
        "unit": window.unit,
        "window": {"kind": window.window, "id": window.window_id, "start": window.start,
                   "end": window.end},
        "spent": amount(window, alert.spent), "limit": amount(window, window.limit),
        "threshold": float(alert.threshold), "percent": float(alert.threshold * 100),
        "ratio": round(alert.spent / window.limit, 6) if window.limit else 1.0,
        "exhausted": alert.refused or alert.spent >= window.limit,
        "burn_rate_per_hour": per_hour, "runs_out_at": rate.runs_out_at,
    }


def signature(secret: bytes, body: bytes, timestamp: int) -> str:
    """The ``x-llm-gateway-signature`` value of ``body`` sent at ``timestamp``."""
    digest = hmac.new(secret, b"%d." % timestamp + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},{SIGNATURE_SCHEME}={digest}"


def backoff(attempt: int, base: float = 1.0, cap: float = 60.0) -> float:
    """Seconds before retry ``attempt`` (1: the first retry): doubling from ``base``, at
    most ``cap``."""
    return min(cap, base * math.pow(2, max(0, attempt - 1)))


def parse_thresholds(raw: Any) -> tuple[Decimal, ...]:
    """``alerts.thresholds``: fractions of a budget above 0 and at most 1 (``[0.5, 0.8,
    1.0]``), in any order; [] turns alerts off. Raises ValueError."""
    if raw is None:
        return DEFAULT_THRESHOLDS
    if not isinstance(raw, list | tuple):
        raise ValueError(f"thresholds: expected a list of fractions such as [0.5, 0.8, 1.0], "
                         f"got {raw!r}")
    found: set[Decimal] = set()
    for value in raw:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(f"thresholds: {value!r} is not a number")
        try:
            fraction = Decimal(str(value).strip())
        except ArithmeticError:
            raise ValueError(f"thresholds: {value!r} is not a number") from None
        if not fraction.is_finite() or not 0 < fraction <= 1:
            raise ValueError(f"thresholds: {value!r} is not a fraction above 0 and at most 1 "
                             "(0.8 is 80 %)")
        found.add(fraction.normalize())
    return tuple(sorted(found))


def thresholds_text(thresholds: Sequence[Decimal]) -> str:
    return ", ".join(f"{float(t * 100):g} %" for t in thresholds)


@dataclass(frozen=True, slots=True)
class Webhook:
    """Where alerts are POSTed, and the secret they are signed with (never shown)."""

    url: str
    secret: bytes = b""

    def __repr__(self) -> str:
        return f"Webhook({self.origin!r})"

    @property
    def origin(self) -> str:
        """What logs name it by: scheme, host and port only (a webhook's path or query may
        be a credential itself, as a chat service's incoming-webhook URL is)."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


@dataclass(frozen=True, slots=True)
class AlertSettings:
    thresholds: tuple[Decimal, ...] = DEFAULT_THRESHOLDS
    webhooks: tuple[Webhook, ...] = ()


_ALERT_KEYS = {"webhooks", "thresholds"}
_WEBHOOK_KEYS = {"url", "secret", "secret_env"}
MAX_URL_CHARS = 2048


def parse_alert_settings(raw: Any, environ: Mapping[str, str]) -> AlertSettings:
    """The settings file's ``alerts:`` section (None: the defaults, no webhooks). Raises
    ValueError with the problem; a secret is never part of it."""
    if raw is None:
        return AlertSettings()
    if not isinstance(raw, Mapping):
        raise ValueError("expected a mapping with webhooks: and thresholds:")
    if unknown := sorted(str(key) for key in raw if key not in _ALERT_KEYS):
        raise ValueError(f"unknown key {unknown[0]!r} (expected webhooks, thresholds)")
    hooks = raw.get("webhooks") or []
    if not isinstance(hooks, list):
        raise ValueError("webhooks: expected a list of {url, secret} (or {url, secret_env})")
    return AlertSettings(parse_thresholds(raw.get("thresholds")),
                         tuple(_webhook(n, hook, environ) for n, hook in enumerate(hooks, 1)))


def _webhook(number: int, raw: Any, environ: Mapping[str, str]) -> Webhook:
    where = f"webhooks[{number}]"
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a mapping with url and secret (or secret_env)")
    if unknown := sorted(str(key) for key in raw if key not in _WEBHOOK_KEYS):
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (expected url, secret, "
                         "secret_env)")
    url = raw.get("url")
    if not isinstance(url, str) or not _is_http_url(url):
        shown = url if isinstance(url, str) and len(url) <= 80 and url.isprintable() else "it"
        raise ValueError(f"{where}: url: expected an http:// or https:// URL with a host, "
                         f"got {shown!r}")
    if ("secret" in raw) == ("secret_env" in raw):
        raise ValueError(f"{where}: give the signing secret as secret or secret_env (one)")
    if "secret_env" in raw:
        name = raw["secret_env"]
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: secret_env: expected an environment variable's name")
        secret = environ.get(name, "")
        if not secret:
            raise ValueError(f"{where}: secret_env: {name} is not set (or empty)")
    else:
        secret = raw["secret"]
        if not isinstance(secret, str) or not secret:
            raise ValueError(f"{where}: secret: expected a non-empty string")
    return Webhook(url, secret.encode())


def _is_http_url(url: str) -> bool:
    if len(url) > MAX_URL_CHARS or not url.isprintable() or any(c.isspace() for c in url):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


BURN_LIMITS = (("daily_usd", "d"), ("monthly_usd", "m"), ("daily_tokens", "d"),
               ("monthly_tokens", "m"))


def budget_burn(budget: Budget, spent: Mapping[str, Decimal | int], now: float,
                ) -> dict[str, dict[str, Any]]:
    """Each limit the budget sets, with how fast it burns now: ``spent`` holds what was
    spent in the window of each limit (``daily_usd``: USD today, ``monthly_tokens``: tokens
    this month...). USD rates are decimal text, token rates too (tokens an hour)."""
    day, _, month, _ = windows(now)
    found: dict[str, dict[str, Any]] = {}
    for name, kind in BURN_LIMITS:
        limit = getattr(budget, name)
        bounds = window_bounds(day if kind == "d" else month)
        if limit is None or bounds is None:
            continue
        rate = burn(Decimal(spent.get(name, 0)), Decimal(limit), *bounds, now)
        per_hour = rate.per_hour.quantize(Decimal("0.0000000001") if name.endswith("usd")
                                          else Decimal("0.01"))
        found[name] = {"per_hour": format(per_hour.normalize(), "f"),
                       "runs_out_at": rate.runs_out_at, "exhausted": rate.exhausted}
    return found
