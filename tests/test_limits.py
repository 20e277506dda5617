from __future__ import annotations

import asyncio

from llm_gateway.limits import FixedWindowCounter, MemoryRateLimiter, format_reset


def test_fixed_window_counts_and_resets_on_epoch_aligned_windows() -> None:
    counter = FixedWindowCounter()
    decisions = [counter.take("k", 3, 60, 120.0 + i) for i in range(5)]
    assert [d.allowed for d in decisions] == [True, True, True, False, False]
    assert [d.remaining for d in decisions] == [2, 1, 0, 0, 0]
    assert decisions[3].reset_after == 60 - 3
    assert dict(decisions[3].headers())["retry-after"] == "57"
    assert "retry-after" not in dict(decisions[0].headers())
    assert counter.take("k", 3, 60, 180.0).allowed  # next window
    assert counter.take("other", 3, 60, 123.0).remaining == 2


def test_refused_requests_do_not_extend_the_window() -> None:
    counter = FixedWindowCounter()
    counter.take("k", 1, 10, 0.0)
    for t in range(1, 10):
        assert not counter.take("k", 1, 10, float(t)).allowed
    assert counter.take("k", 1, 10, 10.0).allowed


def test_reset_format() -> None:
    assert format_reset(0.25) == "250ms"
    assert format_reset(12.1) == "13s"
    assert format_reset(90) == "1m30s"


def test_memory_limiter_is_exact_under_concurrency() -> None:
    limiter = MemoryRateLimiter(clock=lambda: 1000.0)

    async def burst() -> list[bool]:
        results = await asyncio.gather(*(limiter.take("key", 100, 60) for _ in range(400)))
        return [d.allowed for d in results]

    allowed = asyncio.run(burst())
    assert allowed.count(True) == 100 and allowed.count(False) == 300
