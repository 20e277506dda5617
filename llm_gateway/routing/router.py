"""The router: the live route table, each target's health and each provider's bulkhead,
and the plan of targets an admitted request will try."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass

from llm_gateway import errors
from llm_gateway.config import host_and_api_root
from llm_gateway.errors import Rejection
from llm_gateway.routing.bulkhead import Bulkhead
from llm_gateway.routing.health import Evidence, HealthBook, Outcome, State
from llm_gateway.routing.selection import attempt_order, fitting_targets
from llm_gateway.routing.table import ModelRoute, ProviderConfig, RouteTable, Target

# (target, outcome, retry_after, the evidence before it)
HealthListener = Callable[[str, Outcome, float | None, Evidence], None]
TableListener = Callable[[RouteTable], None]
# The provider host an intercepting adapter (the sidecar) saw the request sent to.
CalledHost = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Plan:
    """Where one request may go, in the order it tries: a snapshot of the table it was
    admitted under, so a reload meanwhile cannot mix two versions in one request."""

    table: RouteTable
    route: ModelRoute
    targets: tuple[Target, ...]

    def provider(self, target: Target) -> ProviderConfig:
        return self.table.providers[target.provider]

    def priced(self, has_price: Callable[[str, str], bool]) -> Plan | Rejection:
        """For a key held to a USD budget: the targets it can be charged for (a price, or
        ``RouteTable.may_go_unpriced``), the others skipped as an unsuitable target is;
        none left: 400 model_not_priced, before any call."""
        kept = tuple(target for target in self.targets
                     if has_price(target.provider, target.model)
                     or self.table.may_go_unpriced(target))
        if not kept:
            first = self.targets[0]
            return errors.model_not_priced(first.provider, first.model)
        return self if len(kept) == len(self.targets) else dataclasses.replace(
            self, targets=kept)


class Router:
    def __init__(self, table: RouteTable, health: HealthBook,
                 rng: random.Random | None = None) -> None:
        self._table = table
        self.health = health
        self.bulkhead = Bulkhead()
        self._rng = rng or random.Random()
        self._listeners: list[HealthListener] = []
        self._table_listeners: list[TableListener] = []
        self._host_roots: dict[str, str] = {}
        self._remember_hosts(table)

    @property
    def table(self) -> RouteTable:
        return self._table

    def replace_table(self, table: RouteTable) -> None:
        """A new version of the routes: requests admitted from now on use it; requests in
        flight keep the plan they were admitted with."""
        self._table = table
        self.health.policy = table.health
        self._remember_hosts(table)
        for listener in self._table_listeners:
            listener(table)

    def on_table(self, listener: TableListener) -> None:
        """Also tell ``listener`` each new version of the routes (the sidecar's hosts)."""
        self._table_listeners.append(listener)

    def plan(self, model: str, prompt_tokens: int, called: CalledHost | None = None,
             protocol: str | None = None) -> Plan | Rejection:
        """The targets a request of ``protocol`` for ``model`` tries: an alias's targets
        whose provider speaks the protocol; any other name goes to the provider whose host
        the request was sent to (``called``, the sidecar's), else to the default provider
        (or the first that speaks the protocol)."""
        table = self._table
        route = table.route_for(model, table.provider_for_host(*called) if called else None,
                                protocol)
        if route is None:
            return errors.model_not_found(model)
        if protocol is not None:
            # Its own protocol, or one the request is translated to (translate/).
            speaking = tuple(target for target in route.targets
                             if table.providers[target.provider].wire_for(protocol))
            if not speaking:
                return errors.unsupported_protocol(protocol, model)
            if len(speaking) < len(route.targets):
                route = dataclasses.replace(route, targets=speaking)
        fitting = fitting_targets(route, prompt_tokens)
        if not fitting:
            return errors.context_length_exceeded(model, prompt_tokens)
        keys = [target.key for target in fitting]
        order = attempt_order(fitting, self.health.snapshot(keys), table.health, self._rng,
                              self.health.rate_limited(keys))
        if not order:
            return errors.no_available_upstream(model)
        return Plan(table, route, tuple(order))

    def plan_default(self, called: CalledHost | None = None,
                     protocol: str | None = None) -> Plan:
        """A request that names no model (the model list, a stored response): the provider
        whose host it was sent to, else the default provider (or the first that speaks
        the protocol)."""
        table = self._table
        provider = (table.provider_for_host(*called) if called else None) or \
            table.provider_for(protocol)
        target = Target(provider, "", passthrough=True)
        return Plan(table, ModelRoute("", (target,)), (target,))

    def provider_host_roots(self) -> dict[str, str]:
        """Every provider's host ("host" or "host:port") with its API root, of this version
        of the routes and every earlier one: a provider removed live stays intercepted
        until a restart, so its callers' gateway keys keep reaching the gateway rather
        than that host."""
        return dict(self._host_roots)

    def _remember_hosts(self, table: RouteTable) -> None:
        for provider in table.providers.values():
            host, root = host_and_api_root(provider.base_url)
            self._host_roots.setdefault(host, root)

    def on_outcome(self, listener: HealthListener) -> None:
        """Also tell ``listener`` each outcome (shared health, metrics)."""
        self._listeners.append(listener)

    def record(self, target: Target, outcome: Outcome, retry_after: float | None = None) -> None:
        before = self.health.evidence(target.key)
        self.health.record(target.key, outcome, retry_after)
        for listener in self._listeners:
            listener(target.key, outcome, retry_after, before)

    def view(self, refused: str | None) -> dict[str, object]:
        """The routes in force (``refused``: why the latest version was not taken) and
        each target's health."""
        table = self._table
        states = self.states()
        return {
            "version": table.version, "refused": refused,
            "default_provider": table.default_provider,
            "unknown_models": table.unknown_models,
            "providers": {
                name: {"base_url": p.base_url, "profile": p.profile,
                       "protocols": sorted(p.protocols),
                       "source": table.sources.get(f"providers.{name}", "file"),
                       "max_concurrency": p.max_concurrency,
                       "in_flight": self.bulkhead.in_flight(name)}
                for name, p in table.providers.items()
            },
            "models": {
                name: {"source": table.sources.get(f"models.{name}", "file"),
                       "targets": [{"provider": t.provider, "model": t.model,
                                    "weight": t.weight, "priority": t.priority,
                                    "state": states.get(t.key, "healthy")}
                                   for t in route.targets]}
                for name, route in table.models.items()
            },
        }

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
        own when other model names pass through to it (and any other provider's that
        passthrough traffic reached: the sidecar sends names to the host called)."""
        table = self._table
        keys = [target.key for target in table.all_targets()]
        if table.unknown_models == "passthrough":
            keys.append(Target(table.default_provider, "", passthrough=True).key)
            keys += sorted(key for key in self.health.known()
                           if key.endswith("/*") and key not in keys
                           and key[:-2] in table.providers)
        return keys

    def states(self) -> dict[str, State]:
        return self.health.snapshot(self.target_keys())
