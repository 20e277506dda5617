"""The router: the live route table, each target's health and each provider's bulkhead,
and the plan of targets an admitted request will try."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from llm_gateway import errors
from llm_gateway.errors import Rejection
from llm_gateway.routing.bulkhead import Bulkhead
from llm_gateway.routing.health import Evidence, HealthBook, Outcome, State
from llm_gateway.routing.selection import attempt_order, fitting_targets
from llm_gateway.routing.table import ModelRoute, ProviderConfig, RouteTable, Target

# (target, outcome, retry_after, the evidence before it)
HealthListener = Callable[[str, Outcome, float | None, Evidence], None]


@dataclass(frozen=True, slots=True)
class Plan:
    """Where one request may go, in the order it tries: a snapshot of the table it was
    admitted under, so a reload meanwhile cannot mix two versions in one request."""

    table: RouteTable
    route: ModelRoute
    targets: tuple[Target, ...]

    def provider(self, target: Target) -> ProviderConfig:
        return self.table.providers[target.provider]


class Router:
    def __init__(self, table: RouteTable, health: HealthBook,
                 rng: random.Random | None = None) -> None:
        self._table = table
        self.health = health
        self.bulkhead = Bulkhead()
        self._rng = rng or random.Random()
        self._listeners: list[HealthListener] = []

    @property
    def table(self) -> RouteTable:
        return self._table

    def replace_table(self, table: RouteTable) -> None:
        """A new version of the routes: requests admitted from now on use it; requests in
        flight keep the plan they were admitted with."""
        self._table = table
        self.health.policy = table.health

    def plan(self, model: str, prompt_tokens: int) -> Plan | Rejection:
        table = self._table
        route = table.route_for(model)
        if route is None:
            return errors.model_not_found(model)
        fitting = fitting_targets(route, prompt_tokens)
        if not fitting:
            return errors.context_length_exceeded(model, prompt_tokens)
        states = self.health.snapshot(target.key for target in fitting)
        order = attempt_order(fitting, states, table.health, self._rng)
        if not order:
            return errors.no_available_upstream(model)
        return Plan(table, route, tuple(order))

    def plan_default(self, provider: str) -> Plan:
        """A request that names no model (the model list): the default provider."""
        target = Target(provider, "", passthrough=True)
        return Plan(self._table, ModelRoute("", (target,)), (target,))

    def on_outcome(self, listener: HealthListener) -> None:
        """Also tell ``listener`` each outcome (shared health, metrics)."""
        self._listeners.append(listener)

    def record(self, target: Target, outcome: Outcome, retry_after: float | None = None) -> None:
        before = self.health.evidence(target.key)
        self.health.record(target.key, outcome, retry_after)
        for listener in self._listeners:
            listener(target.key, outcome, retry_after, before)

    def known_models(self) -> frozenset[str]:
        """Model names from configuration (aliases and their targets' models): the only
        model names that may become a metric label."""
        table = self._table
        if getattr(self, "_known_version", None) != id(table):
            self._known = frozenset(table.models) | frozenset(
                target.model for target in table.all_targets())
            self._known_version = id(table)
        return self._known

    def target_keys(self) -> list[str]:
        """Every target's health key: the aliases' targets, and the default provider's
        own when other model names pass through to it."""
        table = self._table
        keys = [target.key for target in table.all_targets()]
        if table.unknown_models == "passthrough":
            keys.append(Target(table.default_provider, "", passthrough=True).key)
        return keys

    def states(self) -> dict[str, State]:
        return self.health.snapshot(self.target_keys())
