"""Budget alerts on /metrics, read at scrape time from llm_gateway.billing.alerts_watch:

- ``llm_gateway_budget_alerts_total{scope,budget,threshold}``: alerts this process sent
  (it won the claim: summed over the replicas, each alert counts once). Labels from fixed
  sets only: scope key|subject, budget daily_usd|monthly_usd|daily_tokens|monthly_tokens,
  threshold as configured (0.5, 0.8, 1): never a key or subject id.
- ``llm_gateway_budget_alert_deliveries_total{outcome}``: webhook deliveries, delivered,
  retried (an attempt that failed and was tried again), failed (every attempt did) or
  dropped (a full queue).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from llm_gateway.billing.alerts_watch import BudgetAlerts
from llm_gateway.billing.webhooks import OUTCOMES


class AlertCollector:
    def __init__(self, alerts: BudgetAlerts) -> None:
        self._alerts = alerts

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        sent = CounterMetricFamily("llm_gateway_budget_alerts",
                                   "Budget thresholds reached, alerted by this process",
                                   labels=["scope", "budget", "threshold"])
        for (scope, budget, threshold), count in sorted(self._alerts.sent.items()):
            sent.add_metric([scope, budget, threshold], float(count))
        yield sent
        deliveries = CounterMetricFamily("llm_gateway_budget_alert_deliveries",
                                         "Budget alert webhook deliveries, by outcome",
                                         labels=["outcome"])
        outcomes = self._alerts.sender.outcomes if self._alerts.sender is not None else {}
        for outcome in OUTCOMES:
            deliveries.add_metric([outcome], float(outcomes.get(outcome, 0)))
        yield deliveries
