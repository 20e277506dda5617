"""How long the fuzzers run, one rule for all of them (tests/test_http_fuzz.py,
tests/test_protocol_fuzz.py, tests/test_fuzz.py, tests/test_admin_fuzz.py).

In CI each runs a fixed number of examples, derandomized (the same inputs on every run, so
a failure in CI fails again on a laptop) and without Hypothesis's example database (a run
never depends on an earlier one). Locally they can run longer and on fresh inputs:

- ``FUZZ_EXAMPLES=5000``: that many examples per fuzzer (per operation and mode for the
  admin API) instead of each one's CI budget;
- ``FUZZ_RANDOM=1``: new random inputs on every run instead of the fixed ones; a failure
  prints the seed to repeat it with (``pytest --hypothesis-seed=N``).

An input that found a bug stays as a regression case beside the fuzzer that found it
(``@example(...)`` or a plain test), so it is tried on every run whatever is generated.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

__all__ = ["examples", "fuzz_settings"]


def examples(budget: int) -> int:
    """``budget`` (the fuzzer's share of CI's time), or ``FUZZ_EXAMPLES`` when set."""
    return int(os.environ.get("FUZZ_EXAMPLES") or budget)


def fuzz_settings(budget: int, *, shrink: bool = True) -> settings:
    """Bounded, reproducible Hypothesis settings: ``examples(budget)`` examples, no
    deadline (a loaded CI core is slow, never wrong), no example database, derandomized
    unless ``FUZZ_RANDOM`` is set. ``shrink=False``: a failure is reported as found (a
    failing run stays bounded too, for fuzzers whose examples are slow)."""
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    return settings(
        max_examples=examples(budget), deadline=None, database=None,
        derandomize=not os.environ.get("FUZZ_RANDOM"), phases=phases,
        suppress_health_check=list(HealthCheck), print_blob=True)
