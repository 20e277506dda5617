"""Reconciliation: what a provider billed against what the gateway recorded, per UTC day and
upstream model. Pure: rows of the provider's report and the gateway's aggregates in, one
comparison per (day, model) out, with each figure's drift in absolute and relative terms,
whether it is within the tolerance, and the gateway's records that explain a drift (their
tokens were estimated, or their cost is unknown).

A figure the provider's report does not carry is None on its side and is not compared
(Anthropic's usage report counts no requests; Venice's ledger no cache tokens). Drift is
the provider's figure minus the gateway's: positive when the provider billed more. The
relative drift is that over the gateway's figure; with nothing recorded and something
billed there is no ratio, and it is beyond any tolerance.

Model names are matched as the providers spell them loosely (case, and Venice's SKUs
write ``glm-5.1`` as ``glm-5-1``): ``model_key``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from decimal import Decimal, InvalidOperation
from typing import Any

# The figures compared, in the order a report shows them.
FIGURES = ("requests", "input_tokens", "output_tokens", "cache_read_tokens",
           "cache_write_tokens", "usd")
DEFAULT_TOLERANCE = Decimal("0.005")  # 0.5 %
# The records named as explaining a line, at most (their count is always given whole).
EXPLAINING_IDS = 10
_PERCENT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*")

type Amount = int | Decimal


class ToleranceError(ValueError):
    """A tolerance that is no fraction: str() says which text and why."""


def parse_tolerance(text: str) -> Decimal:
    """``0.5%`` or ``0.005``: the largest relative drift that still reconciles."""
    percent = _PERCENT.fullmatch(text)
    try:
        value = Decimal(percent.group(1)) / 100 if percent else Decimal(text.strip())
    except InvalidOperation:
        raise ToleranceError(f"--tolerance: expected a percentage (0.5%) or a fraction "
                             f"(0.005), got {text!r}") from None
    if not value.is_finite() or not 0 <= value < 1:
        raise ToleranceError(f"--tolerance: expected from 0 up to (not including) 100%, "
                             f"got {text!r}")
    return value


def model_key(name: str) -> str:
    """The name two sides are matched by."""
    return name.strip().lower().replace(".", "-").replace("_", "-")


@dataclass(frozen=True, slots=True)
class Figures:
    """One side's figures of one day and model; None: that side does not report it."""

    requests: int | None = None
    input_tokens: int | None = None  # every input token, cache reads and writes included
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    usd: Decimal | None = None

    def plus(self, other: Figures) -> Figures:
        """The sum, figure by figure; a figure neither side has stays None."""
        summed: dict[str, Any] = {}
        for name in FIGURES:
            mine, theirs = getattr(self, name), getattr(other, name)
            summed[name] = (mine if theirs is None else theirs if mine is None
                            else mine + theirs)
        return Figures(**summed)


@dataclass(frozen=True, slots=True)
class Billed:
    """A row of the provider's report (several rows of one day and model add up)."""

    day: str  # YYYY-MM-DD, UTC
    model: str  # as the provider names it
    figures: Figures


@dataclass(frozen=True, slots=True)
class Recorded:
    """The gateway's records of one day and upstream model, summed."""

    day: str
    model: str
    figures: Figures
    estimated: int = 0  # records whose tokens the gateway counted (the provider said none)
    cost_unknown: int = 0  # records with neither a gateway price nor a provider cost
    explaining: tuple[str, ...] = ()  # request ids of some of those records


@dataclass(frozen=True, slots=True)
class Drift:
    figure: str
    provider: Amount
    gateway: Amount
    within: bool

    @property
    def absolute(self) -> Amount:
        return self.provider - self.gateway

    @property
    def relative(self) -> Decimal | None:
        """The drift over the gateway's figure; None when it is 0 and the provider's not."""
        if self.gateway == 0:
            return Decimal(0) if self.provider == 0 else None
        return Decimal(self.absolute) / Decimal(self.gateway)


@dataclass(frozen=True, slots=True)
class Line:
    """One day and model: each compared figure's drift, and what explains it."""

    day: str
    model: str
    drifts: tuple[Drift, ...]
    estimated: int = 0
    cost_unknown: int = 0
    explaining: tuple[str, ...] = ()

    @property
    def within(self) -> bool:
        return all(drift.within for drift in self.drifts)

    @property
    def worst_ratio(self) -> float:
        """The largest relative drift of its figures, signed; ±1 where there is no ratio
        (billed with nothing recorded: +1; recorded with nothing billed is -1 already)."""
        worst = 0.0
        for drift in self.drifts:
            ratio = (float(drift.relative) if drift.relative is not None
                     else 1.0 if drift.absolute > 0 else -1.0)
            if abs(ratio) > abs(worst):
                worst = ratio
        return worst


@dataclass(frozen=True, slots=True)
class Reconciliation:
    provider: str
    since: str
    until: str  # exclusive
    tolerance: Decimal
    lines: tuple[Line, ...]
    compared: tuple[str, ...] = field(default=FIGURES)  # what the provider's report carries

    @property
    def within(self) -> bool:
        return all(line.within for line in self.lines)

    def model_drifts(self) -> dict[str, float]:
        """Each model's worst relative drift over the range (signed): what the metric
        llm_gateway_reconcile_drift_ratio shows."""
        worst: dict[str, float] = {}
        for line in self.lines:
            ratio = line.worst_ratio
            if abs(ratio) >= abs(worst.get(line.model, 0.0)):
                worst[line.model] = ratio
        return worst


def reconcile(provider: str, billed: Iterable[Billed], recorded: Iterable[Recorded], *,
              since: str, until: str, tolerance: Decimal = DEFAULT_TOLERANCE,
              compared: tuple[str, ...] = FIGURES) -> Reconciliation:
    """Compare per (day, model) the ``compared`` figures (those the provider's report
    carries): a day or model only one side has is compared against nothing on the other
    (zeros). Lines where both sides are all zero are left out."""
    billed_by: dict[tuple[str, str], Figures] = {}
    names: dict[tuple[str, str], str] = {}
    for row in billed:
        key = (row.day, model_key(row.model))
        billed_by[key] = billed_by.get(key, Figures()).plus(row.figures)
        names.setdefault(key, row.model)
    recorded_by: dict[tuple[str, str], Recorded] = {}
    for aggregate in recorded:
        key = (aggregate.day, model_key(aggregate.model))
        recorded_by[key] = _merged(recorded_by.get(key), aggregate)
        names[key] = aggregate.model  # the gateway's spelling wins: it is the routes'
    lines = []
    for key in sorted(set(billed_by) | set(recorded_by)):
        mine = recorded_by.get(key)
        line = _line(key[0], names[key], billed_by.get(key, Figures()), mine,
                     compared, tolerance)
        if any(drift.provider or drift.gateway for drift in line.drifts):
            lines.append(line)
    return Reconciliation(provider=provider, since=since, until=until, tolerance=tolerance,
                          lines=tuple(lines), compared=compared)


def _merged(known: Recorded | None, more: Recorded) -> Recorded:
    if known is None:
        return more
    return replace(known, figures=known.figures.plus(more.figures),
                   estimated=known.estimated + more.estimated,
                   cost_unknown=known.cost_unknown + more.cost_unknown,
                   explaining=(known.explaining + more.explaining)[:EXPLAINING_IDS])


def _line(day: str, model: str, theirs: Figures, mine: Recorded | None,
          compared: tuple[str, ...], tolerance: Decimal) -> Line:
    ours = mine.figures if mine is not None else Figures()
    drifts = []
    for name in compared:
        provider, gateway = getattr(theirs, name), getattr(ours, name)
        zero = Decimal(0) if name == "usd" else 0
        drift = Drift(name, zero if provider is None else provider,
                      zero if gateway is None else gateway, within=True)
        ratio = drift.relative
        drifts.append(replace(drift, within=ratio is not None and abs(ratio) <= tolerance))
    return Line(day=day, model=model, drifts=tuple(drifts),
                estimated=mine.estimated if mine else 0,
                cost_unknown=mine.cost_unknown if mine else 0,
                explaining=mine.explaining if mine else ())


def figures_from(values: Mapping[str, Any]) -> Figures:
    """Figures from a mapping of FIGURES' names (missing: None)."""
    known = {f.name for f in fields(Figures)}
    return Figures(**{name: value for name, value in values.items() if name in known})


# A model's name as a metric label: what a provider or a record says, so checked, and at
# most METRIC_MODELS of them per provider; the rest are one series, "other" (their worst).
METRIC_MODELS = 100
OTHER_MODELS = "other"
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")


def is_metric_label(name: str) -> bool:
    return _LABEL.fullmatch(name) is not None


def metric_drifts(result: Reconciliation) -> dict[str, tuple[float, bool]]:
    """Per model label: its worst relative drift (signed) and whether all its days were
    within the tolerance; what the drift table keeps and /metrics shows."""
    within: dict[str, bool] = {}
    for line in result.lines:
        within[line.model] = within.get(line.model, True) and line.within
    found: dict[str, tuple[float, bool]] = {}
    for model, ratio in sorted(result.model_drifts().items()):
        label = (model if is_metric_label(model) and model != OTHER_MODELS
                 and len(found) < METRIC_MODELS else OTHER_MODELS)
        known_ratio, known_within = found.get(label, (0.0, True))
        found[label] = (ratio if abs(ratio) >= abs(known_ratio) else known_ratio,
                        known_within and within[model])
    return found
