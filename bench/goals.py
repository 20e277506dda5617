"""The issue's performance targets, checked against a run's figures.

Each goal reads one figure from the results; a goal whose figure was not measured in this
run (target skipped or unavailable, soak not run) is reported as such, never as met.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Results = Mapping[str, Mapping[str, Any]]


def _dig(results: Results, target: str, *path: str) -> float | None:
    value: Any = results.get(target)
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    if isinstance(value, int | float) and not (isinstance(value, float) and math.isnan(value)):
        return float(value)
    return None


def _ratio_to_litellm(target: str) -> Callable[[Results], float | None]:
    def ratio(results: Results) -> float | None:
        ours = _dig(results, target, "max_throughput_rps")
        theirs = _dig(results, "litellm", "max_throughput_rps")
        return ours / theirs if ours is not None and theirs else None

    return ratio


def _streams_held(target: str, goal: int) -> Callable[[Results], float | None]:
    """The most streams held; None when every level tried held and none reached the goal
    (a quick run tries few streams: that proves nothing either way)."""

    def held(results: Results) -> float | None:
        max_held = _dig(results, target, "held_streams", "max_held")
        levels = ((results.get(target) or {}).get("held_streams") or {}).get("levels") or []
        if max_held is None or not levels:
            return None
        every_level_held = all(level.get("failed") == 0 for level in levels)
        return None if every_level_held and max_held < goal else max_held

    return held


def _direct_headroom(results: Results) -> float | None:
    direct = _dig(results, "direct", "max_throughput_rps")
    gateways = [
        value for name in results if name != "direct"
        if (value := _dig(results, name, "max_throughput_rps")) is not None
    ]
    return direct / max(gateways) if direct is not None and gateways and max(gateways) else None


@dataclass(frozen=True)
class Goal:
    name: str
    unit: str
    limit: float
    at_most: bool  # True: measured <= limit; False: measured >= limit
    read: Callable[[Results], float | None]

    def check(self, results: Results) -> dict[str, object]:
        measured = self.read(results)
        verdict: dict[str, object] = {
            "goal": self.name,
            "limit": self.limit,
            "unit": self.unit,
            "comparison": "<=" if self.at_most else ">=",
            "measured": None if measured is None else round(measured, 3),
        }
        if measured is None:
            verdict.update(met=None, missed_by=None)
            return verdict
        met = measured <= self.limit if self.at_most else measured >= self.limit
        gap = measured - self.limit if self.at_most else self.limit - measured
        verdict.update(met=met, missed_by=None if met else round(gap, 3))
        return verdict


def _figure(target: str, *path: str) -> Callable[[Results], float | None]:
    return lambda results: _dig(results, target, *path)


GOALS: tuple[Goal, ...] = (
    Goal("serve: added latency c=1 p50", "ms", 1.0, True,
         _figure("serve", "latency_c1", "added_ms", "p50")),
    Goal("serve: added latency c=1 p99", "ms", 2.0, True,
         _figure("serve", "latency_c1", "added_ms", "p99")),
    Goal("sidecar-reverse: added latency c=1 p50", "ms", 3.0, True,
         _figure("sidecar-reverse", "latency_c1", "added_ms", "p50")),
    Goal("sidecar-reverse: added latency c=1 p99", "ms", 6.0, True,
         _figure("sidecar-reverse", "latency_c1", "added_ms", "p99")),
    Goal("serve: CPU per request at c=8", "us", 500.0, True,
         _figure("serve", "cpu", "cpu_per_request_us")),
    Goal("sidecar-reverse: CPU per request at c=8", "us", 2000.0, True,
         _figure("sidecar-reverse", "cpu", "cpu_per_request_us")),
    Goal("serve: max zero-error throughput / LiteLLM's", "x", 5.0, False,
         _ratio_to_litellm("serve")),
    Goal("sidecar-reverse: max zero-error throughput / LiteLLM's", "x", 1.0, False,
         _ratio_to_litellm("sidecar-reverse")),
    Goal("serve: streaming added TTFB p50", "ms", 1.0, True,
         _figure("serve", "streaming", "added_ttfb_ms", "p50")),
    Goal("sidecar-reverse: streaming added TTFB p50", "ms", 5.0, True,
         _figure("sidecar-reverse", "streaming", "added_ttfb_ms", "p50")),
    Goal("sidecar-regular: streaming added TTFB p50", "ms", 5.0, True,
         _figure("sidecar-regular", "streaming", "added_ttfb_ms", "p50")),
    Goal("serve: paced streams held at once", "streams", 128, False,
         _streams_held("serve", 128)),
    Goal("sidecar-reverse: paced streams held at once", "streams", 32, False,
         _streams_held("sidecar-reverse", 32)),
    Goal("sidecar-regular: paced streams held at once", "streams", 32, False,
         _streams_held("sidecar-regular", 32)),
    Goal("serve: RSS idle", "MiB", 80, True, _figure("serve", "rss_mib", "idle")),
    Goal("serve: RSS under load (peak)", "MiB", 150, True,
         _figure("serve", "rss_mib", "peak_under_load")),
    Goal("serve: RSS growth over the soak", "MiB/min", 1.0, True,
         _figure("serve", "soak", "growth_mib_per_min")),
    Goal("sidecar-reverse: RSS idle", "MiB", 150, True,
         _figure("sidecar-reverse", "rss_mib", "idle")),
    Goal("sidecar-reverse: RSS under load (peak)", "MiB", 250, True,
         _figure("sidecar-reverse", "rss_mib", "peak_under_load")),
    Goal("sidecar-regular: RSS idle", "MiB", 150, True,
         _figure("sidecar-regular", "rss_mib", "idle")),
    Goal("sidecar-regular: RSS under load (peak)", "MiB", 250, True,
         _figure("sidecar-regular", "rss_mib", "peak_under_load")),
    # Not a product goal: the run is valid only if the floor is far above every gateway.
    Goal("harness: direct throughput / best gateway's", "x", 3.0, False, _direct_headroom),
)


def check_goals(results: Results) -> list[dict[str, object]]:
    return [goal.check(results) for goal in GOALS]
