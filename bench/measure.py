"""The measurements, one target at a time, each against the direct call it is compared with.

Order for a gateway target: idle memory; warm-up; memory after warm-up; concurrency-1
latency in interleaved rounds (direct, target, direct, target, ...); CPU per request at
concurrency 8; the closed-loop ladder (memory sampled meanwhile); streaming time to first and
last byte in interleaved rounds; paced streams held at once; memory after the run; optionally
a soak. Every figure lands in a JSON-ready dict.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.client import (
    HttpConnection,
    StreamCheck,
    first_problems,
    held_streams,
    stream_on,
)
from bench.loadgen import (
    Budget,
    LoadGenerator,
    LoadResult,
    PythonGenerator,
    WrkGenerator,
    choose_generator,
)
from bench.procstat import CpuSample, rss_bytes
from bench.stats import (
    PERCENTILES,
    LatencySummary,
    median_summary,
    rounded,
    summarize_latencies,
)
from bench.targets import ROUTED_MODEL, ROUTED_TARGETS, Target

MIB = 2**20
ROUTED_WEIGHTS = {f"{provider}/{model}": weight for provider, model, weight in ROUTED_TARGETS}


@dataclass(frozen=True)
class Plan:
    """How much of everything a run does: ``full`` for the published figures, ``quick`` for
    the test suite (a few hundred requests, seconds per target)."""

    name: str
    warmup: Budget
    latency_rounds: int
    latency_leg: Budget  # per target per round
    ladder: tuple[int, ...]
    ladder_step: Budget
    cpu_budget: Budget
    stream_shape: tuple[int, int]  # (chunks, milliseconds between chunks)
    stream_rounds: int
    streams_per_round: int
    held_shape: tuple[int, int]
    held_levels: tuple[int, ...]
    # Access log json vs off (bench.phases.observability): rounds of a CPU measurement each.
    observability_rounds: int
    budget_pairs: int  # the budget phase: requests to each of serve, serve-redis, serve-budget
    observability_budget: Budget
    # The in-process transport (bench.phases.inprocess): requests per leg, per round.
    inprocess_requests: int
    inprocess_round: int
    # serve --workers 2 against one worker (bench.phases.workers): ladder steps.
    workers_ladder: tuple[int, ...]
    workers_step: Budget
    # Long-lived streams (bench.phases.streams): how many at once, how long, chunk interval.
    streams: int
    stream_seconds: float
    stream_delay_ms: int = 100
    # Chat, Messages and Responses streams through serve (bench.phases.protocols): how many
    # streams of each protocol at once, how long they last, rounds of all three.
    protocol_streams: int = 200
    protocol_seconds: float = 20.0
    protocol_rounds: int = 5
    # The translation phase (bench.phases.translation): streams per leg at once (six legs,
    # a translated event costing more: 100 keeps the target CPU as busy as the protocols
    # phase's four legs of 200); its streams last protocol_seconds, protocol_rounds rounds.
    translation_streams: int = 100
    warmup_concurrency: int = 8
    cpu_concurrency: int = 8
    soak_seconds: float = 0.0
    soak_concurrency: int = 8

    @property
    def stream_shapes(self) -> list[tuple[int, int]]:
        return sorted({self.stream_shape, self.held_shape})


FULL_PLAN = Plan(
    name="full",
    warmup=Budget(seconds=2),
    latency_rounds=5,
    latency_leg=Budget(seconds=2),
    ladder=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    ladder_step=Budget(seconds=3),
    cpu_budget=Budget(seconds=5),
    stream_shape=(16, 10),
    stream_rounds=5,
    streams_per_round=10,
    held_shape=(64, 20),
    held_levels=(32, 64, 128, 256),
    # The difference sought (tens of us) is within one round's noise (~100 us): many rounds.
    observability_rounds=11,
    budget_pairs=5000,
    observability_budget=Budget(seconds=3),
    inprocess_requests=300,
    inprocess_round=20,
    workers_ladder=(8, 16, 32, 64, 128),
    workers_step=Budget(seconds=3),
    streams=5000,
    stream_seconds=30.0,
)

QUICK_PLAN = Plan(
    name="quick",
    warmup=Budget(requests=50),
    latency_rounds=2,
    latency_leg=Budget(requests=100),
    ladder=(1, 16),
    ladder_step=Budget(seconds=1),
    cpu_budget=Budget(requests=300),
    stream_shape=(4, 5),
    stream_rounds=2,
    streams_per_round=5,
    held_shape=(8, 20),
    held_levels=(8,),
    observability_rounds=2,
    budget_pairs=600,
    observability_budget=Budget(requests=300),
    inprocess_requests=60,
    inprocess_round=20,
    workers_ladder=(16,),
    workers_step=Budget(seconds=1),
    streams=200,
    stream_seconds=3.0,
    protocol_streams=40,
    protocol_seconds=3.0,
    protocol_rounds=1,
    translation_streams=40,
)


@dataclass
class Tools:
    """Which load generators this run may use."""

    allow_external: bool  # wrk/hey when installed; False forces the Python client
    wrk_threads: int

    def for_budget(self, target: Target, budget: Budget) -> LoadGenerator:
        return choose_generator(target.endpoint, budget, allow_tools=self.allow_external,
                                wrk_threads=self.wrk_threads)

    def for_comparison(self, target: Target, budget: Budget) -> LoadGenerator:
        """One generator for both legs of a comparison: wrk when both are plain HTTP (the
        direct target always is), else the Python client (hey's 0.1 ms steps are too coarse
        for concurrency-1 latency)."""
        plain = target.endpoint.proxy is None and not target.endpoint.tls
        if (self.allow_external and plain and budget.seconds is not None
                and WrkGenerator.available()):
            return WrkGenerator(1)
        return PythonGenerator()


def say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / MIB, 1)


def _load_figures(result: LoadResult) -> dict[str, object]:
    return {
        "generator": result.generator,
        "concurrency": result.concurrency,
        "requests": result.requests,
        "errors": result.errors,
        "error_rate": round(result.error_rate, 5),
        "duration_s": round(result.duration_s, 3),
        "throughput_rps": round(result.throughput_rps, 1),
        "latency_ms": result.latency.as_dict(),
        "error_samples": result.error_samples,
    }


def _added(target: LatencySummary, direct: LatencySummary) -> dict[str, float | None]:
    return {f"p{p}": rounded(getattr(target, f"p{p}") - getattr(direct, f"p{p}"))
            for p in PERCENTILES}


class RssSampler:
    """Samples a process tree's RSS in the background; keeps the peak."""

    def __init__(self, pid: int, interval_s: float = 0.25) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak = 0
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            value = rss_bytes(self.pid)
            self.samples.append((time.monotonic(), value))
            self.peak = max(self.peak, value)
            self._stop.wait(self.interval_s)


def _require_alive(target: Target) -> None:
    if target.process is not None and not target.process.alive():
        raise RuntimeError(f"{target.name} exited: {target.process.log_tail(8)}")


# ---- the phases ---------------------------------------------------------------------------------


def warm_up(target: Target, plan: Plan, tools: Tools) -> dict[str, object]:
    spec = target.chat_request()
    result = tools.for_budget(target, plan.warmup).run(
        target.endpoint, spec, plan.warmup_concurrency, plan.warmup
    )
    # A few streams too, so stream code paths are loaded before anything is measured.
    shape = plan.stream_shape
    asyncio.run(held_streams(target.endpoint, target.chat_request(stream_shape=shape), 2,
                             shape[0]))
    if result.requests and result.errors == result.requests:
        raise RuntimeError(f"every warm-up request failed: {result.error_samples[:2]}")
    return _load_figures(result)


def routing_split(target: Target, requests: int = 200) -> dict[str, object] | None:
    """Where the alias's requests went, from each answer's ``x-llm-gateway-upstream``: proof
    that routing is on the measured path (None for a target not called with the alias)."""
    if target.fast_model != ROUTED_MODEL:
        return None
    spec = target.chat_request()

    async def tally() -> dict[str, int]:
        counts: dict[str, int] = {}
        connection = HttpConnection(target.endpoint)
        try:
            for _ in range(requests):
                reply = await connection.request(spec)
                where = (reply.header("x-llm-gateway-upstream") or "(no header)"
                         if reply.status == 200 else f"HTTP {reply.status}")
                counts[where] = counts.get(where, 0) + 1
        finally:
            connection.close()
        return counts

    counts = asyncio.run(tally())
    total = sum(ROUTED_WEIGHTS.values())
    return {
        "model": ROUTED_MODEL, "requests": requests,
        "configured_percent": {name: round(100 * weight / total, 1)
                               for name, weight in ROUTED_WEIGHTS.items()},
        "observed_percent": {name: round(100 * count / requests, 1)
                             for name, count in sorted(counts.items())},
    }


def latency_at_concurrency_1(
    target: Target, direct: Target, plan: Plan, tools: Tools
) -> dict[str, object]:
    """Interleaved rounds: each round runs direct then the target; the figure for each
    percentile is the median of its per-round values, so drift hits both alike."""
    generator = tools.for_comparison(target, plan.latency_leg)
    direct_spec, target_spec = direct.chat_request(), target.chat_request()
    direct_rounds: list[LatencySummary] = []
    target_rounds: list[LatencySummary] = []
    errors = 0
    for _ in range(plan.latency_rounds):
        direct_result = generator.run(direct.endpoint, direct_spec, 1, plan.latency_leg)
        target_result = generator.run(target.endpoint, target_spec, 1, plan.latency_leg)
        _require_alive(target)
        direct_rounds.append(direct_result.latency)
        target_rounds.append(target_result.latency)
        errors += target_result.errors
    direct_ms, target_ms = median_summary(direct_rounds), median_summary(target_rounds)
    return {
        "generator": generator.name,
        "rounds": plan.latency_rounds,
        "target_ms": target_ms.as_dict(),
        "direct_ms": direct_ms.as_dict(),
        "added_ms": _added(target_ms, direct_ms),
        "errors": errors,
        "per_round_p50_ms": [[rounded(d.p50), rounded(t.p50)]
                             for d, t in zip(direct_rounds, target_rounds, strict=True)],
    }


def cpu_per_request(target: Target, plan: Plan, tools: Tools) -> dict[str, object]:
    if target.process is None:
        return {}
    generator = tools.for_budget(target, plan.cpu_budget)
    before = CpuSample.take(target.process.pid)
    result = generator.run(target.endpoint, target.chat_request(), plan.cpu_concurrency,
                           plan.cpu_budget)
    cpu_s = before.elapsed()
    answered = result.requests - result.errors
    return {
        "concurrency": plan.cpu_concurrency,
        "generator": generator.name,
        "requests": answered,
        "errors": result.errors,
        "cpu_seconds": round(cpu_s, 3),
        "cpu_per_request_us": round(cpu_s / answered * 1e6, 1) if answered else None,
        "wall_seconds": round(result.duration_s, 3),
        # CPU seconds per wall second: above ~0.95 the target's one CPU is saturated.
        "cpu_utilisation": round(cpu_s / result.duration_s, 3) if result.duration_s else None,
    }


def ladder(
    target: Target, plan: Plan, tools: Tools, direct_ladder: list[dict[str, object]] | None
) -> list[dict[str, object]]:
    spec = target.chat_request()
    direct_p50 = {step["concurrency"]: step["latency_ms"]["p50"]  # type: ignore[index]
                  for step in direct_ladder or ()}
    steps = []
    for concurrency in plan.ladder:
        generator = tools.for_budget(target, plan.ladder_step)
        result = generator.run(target.endpoint, spec, concurrency, plan.ladder_step)
        figures = _load_figures(result)
        if concurrency in direct_p50 and direct_p50[concurrency] is not None:
            figures["added_p50_ms"] = rounded(result.latency.p50 - direct_p50[concurrency])
        steps.append(figures)
        say(f"  {target.name} c={concurrency}: {result.throughput_rps:.0f} req/s, "
            f"p50 {result.latency.p50:.2f} ms, errors {result.errors}/{result.requests}")
        _require_alive(target)
    return steps


def best_zero_error_step(steps: list[dict[str, object]]) -> dict[str, object] | None:
    clean = [step for step in steps if step["errors"] == 0 and step["requests"]]
    return max(clean, key=lambda step: step["throughput_rps"], default=None)  # type: ignore[arg-type,return-value]


def _stream_summaries(checks: list[StreamCheck]) -> tuple[LatencySummary, LatencySummary]:
    good = [check for check in checks if check.ok]
    ttfb = summarize_latencies([c.ttfb_s for c in good if c.ttfb_s is not None])
    ttlb = summarize_latencies([c.ttlb_s for c in good])
    return ttfb, ttlb


async def _stream_round(target: Target, count: int, shape: tuple[int, int]) -> list[StreamCheck]:
    spec = target.chat_request(stream_shape=shape)
    connection = HttpConnection(target.endpoint)
    try:
        await stream_on(connection, spec, shape[0])  # opens the connection: not measured
        return [await stream_on(connection, spec, shape[0]) for _ in range(count)]
    finally:
        connection.close()


def streaming(target: Target, direct: Target, plan: Plan) -> dict[str, object]:
    """Time to first byte (the first SSE frame) and to last byte, one stream at a time, in
    interleaved rounds like the concurrency-1 latency."""
    shape = plan.stream_shape
    direct_ttfb: list[LatencySummary] = []
    direct_ttlb: list[LatencySummary] = []
    target_ttfb: list[LatencySummary] = []
    target_ttlb: list[LatencySummary] = []
    failures: list[StreamCheck] = []
    for _ in range(plan.stream_rounds):
        for who, ttfbs, ttlbs in ((direct, direct_ttfb, direct_ttlb),
                                  (target, target_ttfb, target_ttlb)):
            checks = asyncio.run(_stream_round(who, plan.streams_per_round, shape))
            if who is target:
                failures += [check for check in checks if not check.ok]
            ttfb, ttlb = _stream_summaries(checks)
            ttfbs.append(ttfb)
            ttlbs.append(ttlb)
        _require_alive(target)
    results: dict[str, object] = {
        "chunks": shape[0], "delay_ms": shape[1],
        "streams": plan.stream_rounds * plan.streams_per_round,
        "failed": len(failures), "problems": first_problems(failures),
        "generator": "python",
    }
    for name, direct_rounds, target_rounds in (("ttfb", direct_ttfb, target_ttfb),
                                               ("ttlb", direct_ttlb, target_ttlb)):
        direct_ms, target_ms = median_summary(direct_rounds), median_summary(target_rounds)
        results[f"{name}_ms"] = target_ms.as_dict()
        results[f"direct_{name}_ms"] = direct_ms.as_dict()
        results[f"added_{name}_ms"] = _added(target_ms, direct_ms)
    return results


def streams_held(target: Target, plan: Plan) -> dict[str, object]:
    """Paced streams opened at once; a level holds when every stream delivered every frame,
    in order, ending with [DONE]. Stops at the first level that does not hold."""
    chunks, delay_ms = plan.held_shape
    spec = target.chat_request(stream_shape=plan.held_shape)
    nominal_s = (chunks - 1) * delay_ms / 1000
    levels = []
    max_held = 0
    for streams in plan.held_levels:
        started = time.perf_counter()
        checks = asyncio.run(held_streams(target.endpoint, spec, streams, chunks))
        elapsed = time.perf_counter() - started
        ok = sum(check.ok for check in checks)
        ttlbs = sorted(check.ttlb_s for check in checks if check.ok)
        level = {
            "streams": streams, "ok": ok, "failed": streams - ok,
            "problems": first_problems(checks),
            "ttlb_p50_ms": rounded(statistics.median(ttlbs) * 1000) if ttlbs else None,
            "ttlb_max_ms": rounded(ttlbs[-1] * 1000) if ttlbs else None,
            "nominal_ms": round(nominal_s * 1000, 1),
            "wall_s": round(elapsed, 3),
        }
        levels.append(level)
        say(f"  {target.name} held {streams} streams: {ok} complete"
            + (f" ({level['problems']})" if ok < streams else ""))
        if ok < streams:
            break
        max_held = streams
        _require_alive(target)
    return {"chunks": chunks, "delay_ms": delay_ms, "levels": levels, "max_held": max_held,
            "generator": "python"}


def soak(target: Target, plan: Plan, tools: Tools) -> dict[str, object]:
    """Closed-loop load for ``soak_seconds``; RSS after every slice; growth as a slope
    (least squares over the slices after the first fifth, once caches have filled)."""
    assert target.process is not None
    slice_budget = Budget(seconds=10)
    generator = tools.for_budget(target, slice_budget)
    spec = target.chat_request()
    started = time.monotonic()
    samples: list[tuple[float, int]] = [(0.0, rss_bytes(target.process.pid))]
    requests = errors = 0
    while time.monotonic() - started < plan.soak_seconds:
        result = generator.run(target.endpoint, spec, plan.soak_concurrency, slice_budget)
        requests += result.requests
        errors += result.errors
        samples.append((time.monotonic() - started, rss_bytes(target.process.pid)))
        _require_alive(target)
    settled = [s for s in samples if s[0] >= plan.soak_seconds / 5] or samples
    slope = _slope_per_minute(settled)
    return {
        "seconds": round(time.monotonic() - started, 1),
        "concurrency": plan.soak_concurrency,
        "requests": requests, "errors": errors,
        "rss_mib": [[round(t, 1), _mib(value)] for t, value in samples],
        "growth_mib_per_min": rounded(slope / MIB if not math.isnan(slope) else math.nan),
    }


def _slope_per_minute(samples: list[tuple[float, int]]) -> float:
    if len(samples) < 2:
        return math.nan
    times = [t / 60 for t, _ in samples]
    values = [float(v) for _, v in samples]
    mean_t, mean_v = statistics.fmean(times), statistics.fmean(values)
    spread = sum((t - mean_t) ** 2 for t in times)
    if spread == 0:
        return math.nan
    return sum((t - mean_t) * (v - mean_v) for t, v in zip(times, values, strict=True)) / spread


# ---- a whole target ----------------------------------------------------------------------------


def measure_direct(direct: Target, plan: Plan, tools: Tools) -> dict[str, object]:
    """The floor: the fake upstream called directly. Its concurrency-1 and streaming figures
    are measured inside every target's interleaved rounds (see ``report.direct_figures``)."""
    say("direct: ladder")
    steps = ladder(direct, plan, tools, None)
    say("direct: streams held at once")
    held = streams_held(direct, plan)
    best = best_zero_error_step(steps)
    return {
        "name": "direct", "status": "ok", "version": None,
        "notes": ["the fake upstream itself: the floor every gateway adds to"],
        "ladder": steps,
        "max_throughput_rps": best["throughput_rps"] if best else None,
        "max_throughput_concurrency": best["concurrency"] if best else None,
        "held_streams": held,
    }


def measure_target(
    target: Target, direct: Target, plan: Plan, tools: Tools,
    direct_ladder: list[dict[str, object]] | None,
) -> dict[str, object]:
    assert target.process is not None
    pid = target.process.pid
    figures: dict[str, object] = {
        "name": target.name, "status": "ok", "version": target.version, "notes": target.notes,
    }
    rss: dict[str, float | None] = {"idle": _mib(rss_bytes(pid))}
    figures["rss_mib"] = rss

    def phase(name: str, work: Callable[[], object]) -> object:
        say(f"{target.name}: {name}")
        value = work()
        _require_alive(target)
        return value

    figures["warmup"] = phase("warm-up", lambda: warm_up(target, plan, tools))
    rss["after_warmup"] = _mib(rss_bytes(pid))
    if target.fast_model == ROUTED_MODEL:
        figures["routing"] = phase("routing check", lambda: routing_split(target))
    figures["latency_c1"] = phase(
        "latency at concurrency 1", lambda: latency_at_concurrency_1(target, direct, plan, tools)
    )
    figures["cpu"] = phase("CPU per request", lambda: cpu_per_request(target, plan, tools))
    with RssSampler(pid) as sampler:
        steps = phase("ladder", lambda: ladder(target, plan, tools, direct_ladder))
    rss["peak_under_load"] = _mib(sampler.peak)
    figures["ladder"] = steps
    best = best_zero_error_step(steps)  # type: ignore[arg-type]
    figures["max_throughput_rps"] = best["throughput_rps"] if best else None
    figures["max_throughput_concurrency"] = best["concurrency"] if best else None
    figures["streaming"] = phase("streaming TTFB/TTLB", lambda: streaming(target, direct, plan))
    figures["held_streams"] = phase("streams held at once", lambda: streams_held(target, plan))
    rss["after_run"] = _mib(rss_bytes(pid))
    if plan.soak_seconds > 0:
        figures["soak"] = phase(f"soak {plan.soak_seconds:.0f}s",
                                lambda: soak(target, plan, tools))
    return figures
