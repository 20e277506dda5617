"""Percentiles and medians, the way every figure in the results is computed."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

PERCENTILES = (50, 90, 99)


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values (what wrk and hey report too)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass(frozen=True)
class LatencySummary:
    """Latency percentiles in milliseconds."""

    p50: float
    p90: float
    p99: float
    max: float
    mean: float
    count: int

    def as_dict(self) -> dict[str, float | None]:
        return {key: rounded(value, 4) for key, value in asdict(self).items()}


def summarize_latencies(latencies_s: Sequence[float]) -> LatencySummary:
    ordered = sorted(latencies_s)
    to_ms = 1000.0
    if not ordered:
        return LatencySummary(math.nan, math.nan, math.nan, math.nan, math.nan, 0)
    return LatencySummary(
        p50=percentile(ordered, 50) * to_ms,
        p90=percentile(ordered, 90) * to_ms,
        p99=percentile(ordered, 99) * to_ms,
        max=ordered[-1] * to_ms,
        mean=statistics.fmean(ordered) * to_ms,
        count=len(ordered),
    )


def median_of(values: Sequence[float]) -> float:
    finite = [value for value in values if not math.isnan(value)]
    return statistics.median(finite) if finite else math.nan


def median_summary(rounds: Sequence[LatencySummary]) -> LatencySummary:
    """Each percentile's median over rounds: one slow round cannot move the figure."""
    return LatencySummary(
        p50=median_of([r.p50 for r in rounds]),
        p90=median_of([r.p90 for r in rounds]),
        p99=median_of([r.p99 for r in rounds]),
        max=max((r.max for r in rounds), default=math.nan),
        mean=median_of([r.mean for r in rounds]),
        count=sum(r.count for r in rounds),
    )


def rounded(value: float | None, digits: int = 3) -> float | None:
    """For JSON: NaN becomes null, everything else a short float."""
    if value is None or math.isnan(value):
        return None
    return round(value, digits)
