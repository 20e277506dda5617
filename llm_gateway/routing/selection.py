"""Choosing targets, sans-IO: the order in which an admitted request tries its targets.

Lowest priority first; within a priority a weighted random order, so the first choice
follows the weights (a DEGRADED target keeps a tenth of its weight, by default); targets
that are DOWN, or whose context window the prompt does not fit, are left out. Targets in a
429's cooldown come after all the others, in the same order among themselves: the last
resort, never left out (back-pressure is not ill health). Whether a provider's bulkhead
has room is asked at each attempt, since it changes meanwhile.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from itertools import groupby

from llm_gateway.routing.health import State
from llm_gateway.routing.table import HealthPolicy, ModelRoute, Target


def fitting_targets(route: ModelRoute, prompt_tokens: int) -> list[Target]:
    """The targets whose context window holds the prompt (estimated); all of them when no
    window is known."""
    fitting = []
    for target in route.targets:
        window = target.context_window or route.context_window
        if window is None or prompt_tokens <= window:
            fitting.append(target)
    return fitting


def attempt_order(
    targets: Sequence[Target], states: Mapping[str, State], policy: HealthPolicy,
    rng: random.Random, rate_limited: frozenset[str] = frozenset(),
) -> list[Target]:
    order: list[Target] = []
    by_priority = sorted(targets, key=lambda target: target.priority)
    for _, group in groupby(by_priority, key=lambda target: target.priority):
        weighted = []
        for target in group:
            state = states.get(target.key, State.HEALTHY)
            if state is State.DOWN:
                continue
            weight = target.weight * (policy.degraded_weight if state is State.DEGRADED else 1)
            # Efraimidis-Spirakis: sorting by u ** (1 / w) is a weighted sample without
            # replacement, so the first of the order is chosen in proportion to its weight.
            weighted.append((rng.random() ** (1.0 / weight), target))
        weighted.sort(key=lambda pair: pair[0], reverse=True)
        order.extend(target for _, target in weighted)
    return ([target for target in order if target.key not in rate_limited]
            + [target for target in order if target.key in rate_limited])
