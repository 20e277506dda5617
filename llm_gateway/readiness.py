"""What /readyz says: each shared backend asked now, and what the failure policies make of
an outage: "ready", "degraded" (serving on a substitute: fail-open) or "unavailable"
(refusing: fail-closed), with each check and, when refusing, the request-level error."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from llm_gateway import errors
from llm_gateway.billing.quotas import Quotas
from llm_gateway.limits import RateLimiter
from llm_gateway.outage import Outage
from llm_gateway.routing.router import Router
from llm_gateway.stores import Store

# What requests get while a check fails (a check not named here: not_ready).
_REFUSAL_CODES = {"key_store": "key_store_unavailable",
                  "rate_limiter": "rate_limiter_unavailable",
                  "budget_ledger": "rate_limiter_unavailable"}


@dataclass(frozen=True, slots=True)
class Readiness:
    """What /readyz says: "ready", "degraded" (serving, on a substitute for a backend
    that is down: fail-open) or "unavailable" (refusing: fail-closed); and why."""

    status: str
    checks: dict[str, dict[str, str]]
    # Each routing target's passive health: information, not readiness (a restart does
    # not bring a provider back).
    targets: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.status != "unavailable"

    def body(self) -> bytes:
        payload: dict[str, object] = {"status": self.status, "checks": self.checks,
                                      "targets": self.targets}
        failing = [name for name, check in self.checks.items() if check["state"] == "unavailable"]
        if failing:
            # The code of the request-level answer the first one causes (503
            # key_store_unavailable, rate_limiter_unavailable).
            names = " and ".join(f"the {name.replace('_', ' ')}" for name in failing)
            payload["error"] = json.loads(errors.error_body_for(
                _REFUSAL_CODES.get(failing[0], "not_ready"),
                self.checks[failing[0]].get("error") or f"{names.capitalize()} is not reachable."
            ))["error"]
        return json.dumps(payload).encode()


async def probe(store: Store, store_outage: Outage, limiter: RateLimiter, quotas: Quotas,
                router: Router) -> Readiness:
    """Ask each backend now; the failure policies say what an outage means."""
    try:
        await store.ping()
    except Exception as exc:  # whatever keeps the store from answering
        store_outage.failed(exc)
    else:
        store_outage.recovered()
    await limiter.check()
    limiter_outage = limiter.outage
    checks = {
        "key_store": store_outage.check(),
        "rate_limiter": (limiter_outage.check() if limiter_outage is not None
                         else {"backend": limiter.backend, "state": "ok"}),
    }
    if quotas.outage.is_down:
        # Asked again here, so that a replica out of rotation (fail-closed) sees it back;
        # listed only while down (its backend is the limiter's or the key store's, which
        # are always listed).
        await quotas.check()
        if quotas.outage.is_down:
            checks["budget_ledger"] = quotas.outage.check()
    states = {check["state"] for check in checks.values()}
    targets = {key: state.value for key, state in router.states().items()}
    for status in ("unavailable", "degraded"):
        if status in states:
            return Readiness(status, checks, targets)
    return Readiness("ready", checks, targets)
