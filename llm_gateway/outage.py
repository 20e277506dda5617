"""Outages of shared backends (Postgres, Redis) as one process sees them.

An ``Outage`` is the state behind three promises: the log says a backend is down at
most once a minute (a dead Redis must not flood the logs at thousands of requests per
second), ``/readyz`` can say what is degraded, and ``/metrics`` counts it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from llm_gateway.config import FailurePolicy

log = logging.getLogger("llm_gateway.outage")

LOG_INTERVAL_SECONDS = 60.0


class Outage:
    """Whether one backend of one component answers, and what was done without it."""

    def __init__(
        self,
        component: str,
        backend: str,
        *,
        policy: FailurePolicy,
        substitute: str,
        log_interval: float = LOG_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.component = component  # what depends on it: "rate_limiter", "key_store"
        self.backend = backend  # "redis", "postgres", "sqlite"
        self.policy = policy
        self.substitute = substitute  # what serves while it is down, for the log line
        self._log_interval = log_interval
        self._clock = clock
        self.down_since: float | None = None
        self.last_error = ""
        self.failures = 0  # calls to the backend that failed
        self.substitutions = 0  # answers given without the backend (fail-open)
        self._last_logged: float | None = None
        self._unlogged_failures = 0

    @property
    def is_down(self) -> bool:
        return self.down_since is not None

    @property
    def state(self) -> str:
        """What the outage means for serving: "ok", "degraded" (fail-open serves on a
        substitute) or "unavailable" (fail-closed refuses)."""
        if not self.is_down:
            return "ok"
        return "degraded" if self.policy is FailurePolicy.FAIL_OPEN else "unavailable"

    def check(self) -> dict[str, str]:
        """This backend's entry in /readyz."""
        if not self.is_down:
            return {"backend": self.backend, "state": "ok"}
        return {"backend": self.backend, "state": self.state, "policy": self.policy.value,
                "error": self.last_error}

    def failed(self, error: BaseException) -> None:
        now = self._clock()
        self.failures += 1
        self._unlogged_failures += 1
        self.last_error = f"{type(error).__name__}: {error}".strip().rstrip(":")[:200]
        if self.down_since is None:
            self.down_since = now
        if self._last_logged is None or now - self._last_logged >= self._log_interval:
            log.warning(
                "%s backend %s unavailable (%d failures since last report, last: %s); %s",
                self.component, self.backend, self._unlogged_failures, self.last_error,
                self.substitute,
            )
            self._last_logged = now
            self._unlogged_failures = 0

    def recovered(self) -> None:
        if self.down_since is None:
            return
        log.warning("%s backend %s is back after %.1fs", self.component, self.backend,
                    self._clock() - self.down_since)
        self.down_since = None
        self._last_logged = None
        self._unlogged_failures = 0

    def substituted(self) -> None:
        self.substitutions += 1


class OutageCollector:
    """Prometheus view of outages: is each backend up, how often it failed, and how many
    answers were given without it."""

    def __init__(self, outages: Iterable[Outage]) -> None:
        self._outages = list(outages)

    def describe(self) -> list[Metric]:
        return []  # collected on demand; nothing to register up front

    def collect(self) -> Iterator[Metric]:
        labels = ["component", "backend"]
        up = GaugeMetricFamily(
            "llm_gateway_backend_up", "1 while the backend answers, 0 while it is down",
            labels=labels,
        )
        failures = CounterMetricFamily(
            "llm_gateway_backend_failures", "Calls to the backend that failed", labels=labels
        )
        substitutions = CounterMetricFamily(
            "llm_gateway_backend_substitutions",
            "Answers given without the backend (fail-open: in-process limits, cached keys)",
            labels=labels,
        )
        for outage in self._outages:
            names = [outage.component, outage.backend]
            up.add_metric(names, 0.0 if outage.is_down else 1.0)
            failures.add_metric(names, outage.failures)
            substitutions.add_metric(names, outage.substitutions)
        yield from (up, failures, substitutions)
