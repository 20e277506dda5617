"""A token bucket's arithmetic, pure: the one refill rule of every bucket the gateway
keeps, the rate limiter's request buckets (llm_gateway.limits) and the budget ledger's
tokens-per-minute buckets (llm_gateway.billing.ledger).

A bucket is its level (tokens, fractional) and when that was written; it refills
continuously at its rate up to its capacity, so nothing needs to run between calls and
a bucket never written, or gone (expired), is full. The backends that keep buckets
elsewhere spell this same rule in their own language (a Redis script, a Postgres
statement): ``min(capacity, level + max(0, now - at) * rate)``.
"""

from __future__ import annotations


def refill(level: float, at: float, now: float, capacity: float, per_second: float) -> float:
    """A bucket's level at ``now``: ``level`` when it was written at ``at``, refilled at
    ``per_second`` since, never above ``capacity``. A clock that stepped back (``now``
    before ``at``) refills nothing, and takes nothing either."""
    return min(capacity, level + max(0.0, now - at) * per_second)


def seconds_until(level: float, wanted: float, per_second: float) -> float:
    """How long a bucket at ``level`` takes to hold ``wanted`` (0: it does already)."""
    return max(0.0, (wanted - level) / per_second)
