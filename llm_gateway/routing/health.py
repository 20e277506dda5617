"""Passive health, sans-IO: what real traffic says about each target, fed outcomes and the
time (wall-clock seconds, so that replicas sharing the evidence agree on it).

    HEALTHY --3 failures--> DEGRADED --5 failures--> DOWN (no traffic)
    DOWN --cooldown over--> DEGRADED (its own live traffic is the probe)
    DEGRADED --3 successes--> HEALTHY

A 429 is back-pressure, not ill health: it counts as no failure and never makes a target
DOWN, but puts it in cooldown at once (``limited_until``): until then every other target
serves first, and it serves only when none other can (a lone target keeps its traffic,
and its callers get the provider's own 429 rather than nothing). A success ends it.

The thresholds are the route table's ``HealthPolicy``. ``apply`` is the one place the
transitions are written; ``HealthBook`` keeps one process's view, and a shared book
(Redis) applies the same function to the evidence every replica shares.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from llm_gateway.routing.table import HealthPolicy


class State(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    DOWN = "down"


class Outcome(StrEnum):
    SUCCESS = "success"
    CONNECT = "connect"  # refused, reset, unreachable
    TIMEOUT = "timeout"  # no first byte in time
    SERVER_ERROR = "5xx"
    RATE_LIMITED = "429"


@dataclass(frozen=True, slots=True)
class Evidence:
    """What one target's recent traffic showed; everything its state follows from."""

    failures: int = 0  # consecutive
    successes: int = 0  # consecutive, counted while DEGRADED
    degraded: bool = False
    down_until: float = 0.0  # wall-clock seconds; in the future: DOWN
    limited_until: float = 0.0  # a 429's cooldown; in the future: others serve first

    def state(self, now: float) -> State:
        if now < self.down_until:
            return State.DOWN
        return State.DEGRADED if self.degraded else State.HEALTHY

    def rate_limited(self, now: float) -> bool:
        return now < self.limited_until


CLEAN = Evidence()


def apply(evidence: Evidence, outcome: Outcome, now: float, policy: HealthPolicy,
          retry_after: float | None = None) -> Evidence:
    """The evidence after one more outcome."""
    if outcome is Outcome.RATE_LIMITED:
        until = now + cooldown(policy, retry_after)
        return replace(evidence, limited_until=max(until, evidence.limited_until))
    if outcome is Outcome.SUCCESS:
        if not evidence.degraded:
            if evidence.failures or evidence.limited_until:
                return replace(evidence, failures=0, limited_until=0.0)
            return evidence
        successes = evidence.successes + 1
        if successes >= policy.successes_to_healthy:
            return Evidence(down_until=evidence.down_until)
        return replace(evidence, failures=0, successes=successes, limited_until=0.0)
    failures = evidence.failures + 1
    if failures >= policy.failures_to_down:
        # Back as DEGRADED once the cooldown is over, one failure from DOWN again: its
        # next requests are the probe, and a failed probe closes it at once.
        until = now + cooldown(policy, retry_after)
        return Evidence(policy.failures_to_down - 1, 0, True, max(until, evidence.down_until),
                        evidence.limited_until)
    degraded = evidence.degraded or failures >= policy.failures_to_degraded
    return replace(evidence, failures=failures, successes=0, degraded=degraded)


def cooldown(policy: HealthPolicy, retry_after: float | None) -> float:
    """The default cooldown, or the provider's own wait when longer; never past the cap."""
    wanted = max(policy.cooldown_seconds, retry_after or 0.0)
    return min(wanted, policy.max_cooldown_seconds)


class HealthBook:
    """One process's evidence per target (``provider/model``)."""

    def __init__(self, policy: HealthPolicy, clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self.clock = clock
        self._evidence: dict[str, Evidence] = {}

    def state(self, target: str) -> State:
        return self._evidence.get(target, CLEAN).state(self.clock())

    def evidence(self, target: str) -> Evidence:
        return self._evidence.get(target, CLEAN)

    def rate_limited(self, targets: Iterable[str]) -> frozenset[str]:
        """Those of ``targets`` in a 429's cooldown now."""
        now = self.clock()
        return frozenset(target for target in targets
                         if self._evidence.get(target, CLEAN).rate_limited(now))

    def known(self) -> list[str]:
        """Every target this book holds evidence about."""
        return list(self._evidence)

    def record(self, target: str, outcome: Outcome, retry_after: float | None = None) -> Evidence:
        updated = apply(self.evidence(target), outcome, self.clock(), self.policy, retry_after)
        self._evidence[target] = updated
        return updated

    def replace_all(self, evidence: dict[str, Evidence]) -> None:
        """Take the shared view (a refresh from the replicas' common store). A 429's
        cooldown seen here lasts its time even where the shared view lacks it (a store
        that keeps no such field): it only orders targets, and a success here ends it."""
        now = self.clock()
        for target, mine in self._evidence.items():
            if mine.rate_limited(now):
                shared = evidence.get(target, CLEAN)
                if shared.limited_until < mine.limited_until:
                    evidence[target] = replace(shared, limited_until=mine.limited_until)
        self._evidence = evidence

    def snapshot(self, targets: Iterable[str]) -> dict[str, State]:
        now = self.clock()
        return {target: self._evidence.get(target, CLEAN).state(now) for target in targets}
