"""The phases of a run beyond the table's per-target measurements, each in one function that
starts what it needs, measures, stops it and returns a JSON-ready dict:

- ``observability``: the CPU that the access log (and metrics) add per request: two `serve`
  processes, ``ACCESS_LOG=json`` (the default) and ``ACCESS_LOG=off``, measured in alternating
  rounds at concurrency 8 (issue 13). Metrics cannot be switched off by a setting, so they are
  in both legs; their own cost per request is estimated by a micro-benchmark beside it.
- ``inprocess``: the openai SDK through the in-process transport against the SDK straight to
  the upstream and through `serve`, at concurrency 1 (issue 16; ``bench.inprocess_phase``).
- ``workers``: ``serve --workers 2`` against one worker, ladder steps interleaved, every
  process free to use every CPU (issue 15).
- ``streams``: thousands of paced streams at once through direct, `serve`, the reverse sidecar
  and LiteLLM, against ``bench.paced_upstream`` (issue 15; ``bench.streams``).
- ``protocols``: CPU per relayed content event through `serve` for chat completions, Anthropic
  Messages and OpenAI Responses streams of the same shape, every leg at once, and each
  one's ratio to chat's (the agents' traffic issue; ``bench.protocols``).
- ``translation``: the same, for a caller whose alias's only target speaks another protocol
  (chat -> Messages, Messages -> chat, Responses -> chat: the request and the stream
  translated) beside the same caller untranslated; each translated leg's ratio to its
  untranslated leg's (``bench.protocols.TRANSLATION_LEGS``).
- ``budget``: what holding a request to a budget (Redis limiter and ledger, prices) adds at
  concurrency 1: `serve` and serve-budget side by side, one request to each in turn, so drift
  and neighbours hit both alike (issue 11; the table's figures come minutes apart).

A phase that cannot run here says why (``status: unavailable``), as a target does.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.client import Endpoint, RequestSpec
from bench.litellm_env import LiteLLMUnavailable, ensure_litellm
from bench.loadgen import Budget, PythonGenerator
from bench.measure import (
    Plan,
    Tools,
    best_zero_error_step,
    cpu_per_request,
    say,
)
from bench.procstat import CpuSample, cpu_seconds
from bench.protocols import (
    BASELINE,
    LEGS,
    PROTOCOL_MODELS,
    TRANSLATION_LEGS,
    UNTRANSLATED,
    UPSTREAM,
    measure_protocols,
    write_protocol_routes,
)
from bench.stats import summarize_latencies
from bench.streams import StreamShape, hold_streams, stream_payload
from bench.targets import (
    FAKE_API_ROOT,
    ROUTED_MODEL,
    Environment,
    ManagedProcess,
    Target,
    TargetUnavailable,
    _wait_until_answering,
    direct_target,
    free_port,
    start_process,
    start_serve,
    start_serve_budget,
    start_serve_redis,
    start_target,
)

REPO = Path(__file__).resolve().parent.parent
PHASE_NAMES = ("observability", "inprocess", "workers", "streams", "protocols", "translation",
               "budget")
# The gateways the streams phase runs through, when the run measures them.
STREAM_TARGETS = ("serve", "sidecar-reverse", "litellm")


@dataclass
class Context:
    environment: Environment
    plan: Plan
    tools: Tools
    target_names: list[str]  # the targets this run was asked for
    litellm_venv: Path
    usable_cpus: list[int]  # every CPU the harness may use (before it pinned itself)


def run_phase(name: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    say(f"phase {name}")
    try:
        figures = work()
    except TargetUnavailable as exc:
        say(f"phase {name} unavailable: {exc}")
        return {"status": "unavailable", "reason": str(exc)}
    except Exception as exc:  # a broken phase must not lose the run's other figures
        say(f"phase {name} failed: {type(exc).__name__}: {exc}")
        traceback.print_exc(file=sys.stderr)
        return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
    figures.setdefault("status", "ok")
    return figures


@contextmanager
def started(*starters: Callable[[], Target]) -> Iterator[list[Target]]:
    """Start targets in turn; stop every one started, whatever happens."""
    targets: list[Target] = []
    try:
        for starter in starters:
            targets.append(starter())
        yield targets
    finally:
        for target in targets:
            target.stop()


def _warm(target: Target, requests: int = 200) -> None:
    PythonGenerator().run(target.endpoint, target.chat_request(), 4, Budget(requests=requests))


# ---- observability: access log json vs off ---------------------------------------------------


def observability(context: Context) -> dict[str, Any]:
    """CPU per request at concurrency 8 of serve with the access log (json, its default) and
    without it, in alternating rounds; the figure is the median of the per-round differences."""
    plan = dataclasses.replace(context.plan, cpu_budget=context.plan.observability_budget)
    environment = context.environment
    with started(
        lambda: start_serve(environment, routed=True, name="serve-access-log-json",
                            extra_env={"ACCESS_LOG": "json"}),
        lambda: start_serve(environment, routed=True, name="serve-access-log-off",
                            extra_env={"ACCESS_LOG": "off"}),
    ) as (json_on, log_off):
        for target in (json_on, log_off):
            _warm(target)
        rounds = []
        legs = [("json", json_on), ("off", log_off)]
        for _ in range(plan.observability_rounds):
            figures = {}
            legs.reverse()  # each leg goes first in every other round: no order bias
            for label, target in legs:
                measured = cpu_per_request(target, plan, context.tools)
                if measured.get("errors"):
                    raise RuntimeError(f"{target.name}: {measured['errors']} errors")
                figures[label] = measured["cpu_per_request_us"]
            rounds.append(figures)
            say(f"  access log json {figures['json']} us, off {figures['off']} us")
        generator = measured["generator"]
    differences = [r["json"] - r["off"] for r in rounds if r["json"] and r["off"]]
    result: dict[str, Any] = {
        "concurrency": plan.cpu_concurrency, "generator": generator,
        "rounds": rounds,
        "json_us": round(statistics.median(r["json"] for r in rounds), 1),
        "off_us": round(statistics.median(r["off"] for r in rounds), 1),
        "access_log_added_us": round(statistics.median(differences), 1) if differences else None,
        "metrics": "always on (no setting turns them off): in both legs",
    }
    result.update(_observability_microbenchmark())
    added = result["access_log_added_us"]
    metrics = result.get("metrics_us_per_request")
    result["observability_added_us"] = (round(added + metrics, 1)
                                        if added is not None and metrics is not None else added)
    return result


def _observability_microbenchmark(calls: int = 20000) -> dict[str, Any]:
    """What ``GatewayMetrics.finished`` and ``AccessLog.finished`` cost per call, timed in this
    process on a typical record (the access log writes to /dev/null): an estimate of the part
    the on/off comparison cannot switch off (metrics), and a cross-check of the part it can."""
    try:
        from prometheus_client import CollectorRegistry

        from llm_gateway.billing.records import UsageRecord
        from llm_gateway.keys import KeyRecord
        from llm_gateway.telemetry.access_log import AccessLog
        from llm_gateway.telemetry.metrics import GatewayMetrics, Labels

        key = KeyRecord(id="key-id", subject_id="bench", name="bench", prefix="llmg_abcdefg",
                        key_hash=b"x" * 32, created_at=time.time())
        record = UsageRecord(
            request_id="req_1", key_id=key.id, subject_id="bench", adapter="asgi",
            endpoint="chat.completions", model=ROUTED_MODEL, stream=False, status=200,
            started_at=time.time(), duration_ms=1.5, key_prefix=key.prefix, provider="fake-a",
            upstream_model="llama-3.3-70b", prompt_tokens=3, completion_tokens=64,
            total_tokens=67, response_id="chatcmpl-1", finish_reasons=["stop"], ttfb_ms=1.2,
            trace_id="0" * 32)
        metrics = GatewayMetrics(CollectorRegistry(), Labels("prefix",
                                                              lambda: frozenset({ROUTED_MODEL})))
        started_at = time.process_time()
        for _ in range(calls):
            metrics.finished(record, key)
        metrics_us = (time.process_time() - started_at) / calls * 1e6
        with open(os.devnull, "wb") as sink:
            log = AccessLog(enabled=True, sample_rate=0.0, audit_errors=False,
                            capture_content=False, fd=sink.fileno())
            body = b'{"model":"chat-fast","messages":[{"role":"user","content":"Say hello."}]}'
            started_at = time.process_time()
            for _ in range(calls):
                log.finished(record, body, 400)
            log_us = (time.process_time() - started_at) / calls * 1e6
    except Exception as exc:  # the telemetry API moved: say so rather than fail the phase
        return {"microbenchmark_error": f"{type(exc).__name__}: {exc}"}
    return {"metrics_us_per_request": round(metrics_us, 1),
            "access_log_us_per_request_microbenchmark": round(log_us, 1)}


# ---- the in-process transport ---------------------------------------------------------------


def inprocess(context: Context) -> dict[str, Any]:
    """The SDK direct, through the transport (sync and async SDK) and through serve, at
    concurrency 1 in interleaved rounds, in a child process on the load CPUs; the access log
    off in both gateways, so the figures are the path's."""
    environment = context.environment
    plan = context.plan
    with started(lambda: start_serve(environment, routed=True, name="serve-inprocess-peer",
                                     extra_env={"ACCESS_LOG": "off"})) as (serve,):
        assert serve.process is not None
        env = {**environment.gateway_env(routed=True), "ACCESS_LOG": "off",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                           os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, "-m", "bench.inprocess_phase",
                   "--fake-url", environment.fake_base_url,
                   "--serve-url", f"http://{serve.endpoint.host}:{serve.endpoint.port}",
                   "--serve-pid", str(serve.process.pid), "--key", environment.gateway_key,
                   "--model", ROUTED_MODEL, "--requests", str(plan.inprocess_requests),
                   "--round", str(plan.inprocess_round)]
        completed = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True,
                                   timeout=600, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"bench.inprocess_phase exited {completed.returncode}: "
                           f"{completed.stderr[-600:]}")
    figures: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    figures["model"] = ROUTED_MODEL
    figures["access_log"] = "off in both gateways"
    for name, leg in figures["legs"].items():
        added = leg.get("added_ms", {}).get("p50")
        say(f"  {name}: p50 {leg['ms']['p50']:.3f} ms"
            + (f", added {added:.3f} ms, added CPU {leg['added_cpu_us']} us"
               if added is not None else ""))
    return figures


# ---- serve --workers 2 ----------------------------------------------------------------------


def _set_affinity(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` (sched_setaffinity on a pid moves its main thread only)."""
    try:
        tasks = [int(task) for task in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tasks = [pid]
    for task in tasks:
        with suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(task, cpus)


@contextmanager
def every_cpu(context: Context, fake_pid: int) -> Iterator[None]:
    """The harness (so wrk) and the upstream free to use every CPU, then pinned back."""
    harness_before = os.sched_getaffinity(0)
    fake_before = os.sched_getaffinity(fake_pid)
    everything = set(context.usable_cpus)
    os.sched_setaffinity(0, everything)
    _set_affinity(fake_pid, everything)
    try:
        yield
    finally:
        os.sched_setaffinity(0, harness_before)
        _set_affinity(fake_pid, fake_before)


def workers(context: Context) -> dict[str, Any]:
    """`serve --workers 2` against `serve` (one worker), both free on every CPU with the load
    generator and the upstream (the machine as a deployment would use it), ladder steps
    interleaved (one worker, then two, at each concurrency). The upstream is the paced one
    (the fake's answers, pre-encoded): the fake on uvicorn took a third of a CPU at these
    rates, which the workers could not have, so the phase measured the machine's leftovers
    more than the workers' scaling."""
    paced, port = start_paced_upstream(context.environment)
    try:
        environment = dataclasses.replace(context.environment, fake_port=port,
                                          fake_process=paced, routes_path=None)
        return _workers(context, environment)
    finally:
        paced.stop()


def _workers(context: Context, environment: Environment) -> dict[str, Any]:
    plan = context.plan
    # Given every CPU explicitly: a child inherits the harness's affinity, which is the load
    # CPU alone until every_cpu (both gateways were once measured on that one CPU).
    cpus = sorted(context.usable_cpus)
    with started(
        lambda: start_serve(environment, routed=True, name="serve-workers-2",
                            flags=["--workers", "2"], cpus=cpus),
        lambda: start_serve(environment, routed=True, name="serve-workers-1", cpus=cpus),
    ) as (two, one), every_cpu(context, environment.fake_process.pid):
        for target in (one, two):
            _warm(target)
        steps: dict[str, list[dict[str, Any]]] = {"one": [], "two": []}
        for concurrency in plan.workers_ladder:
            for label, target in (("one", one), ("two", two)):
                generator = context.tools.for_budget(target, plan.workers_step)
                # The cores each side used: on a machine this small, what the load
                # generator and the fake upstream take is what the workers cannot have.
                fake_pid = environment.fake_process.pid
                before = (time.monotonic(), cpu_seconds(target.process.pid),  # type: ignore[union-attr]
                          cpu_seconds(fake_pid))
                held = _sample_connections(target, plan.workers_step.seconds)
                result = generator.run(target.endpoint, target.chat_request(), concurrency,
                                       plan.workers_step)
                held.join()
                elapsed = time.monotonic() - before[0]
                gateway_cores = (cpu_seconds(target.process.pid) - before[1]) / elapsed  # type: ignore[union-attr]
                upstream_cores = (cpu_seconds(fake_pid) - before[2]) / elapsed
                steps[label].append({
                    "concurrency": concurrency, "generator": result.generator,
                    "requests": result.requests, "errors": result.errors,
                    "throughput_rps": round(result.throughput_rps, 1),
                    "latency_ms": result.latency.as_dict(),
                    "error_samples": result.error_samples,
                    "gateway_cores": round(gateway_cores, 2),
                    "upstream_cores": round(upstream_cores, 2),
                    "connections_per_worker": held.counts,
                })
                say(f"  {target.name} c={concurrency}: {result.throughput_rps:.0f} req/s, "
                    f"errors {result.errors}/{result.requests}, gateway {gateway_cores:.2f} "
                    f"cores, fake upstream {upstream_cores:.2f}"
                    + (f", connections per worker {held.counts}" if held.counts else ""))
        processes = {label: len(_tree(target)) for label, target in (("one", one), ("two", two))}
    best_one = best_zero_error_step(steps["one"])  # type: ignore[arg-type]
    best_two = best_zero_error_step(steps["two"])  # type: ignore[arg-type]
    ratio = (best_two["throughput_rps"] / best_one["throughput_rps"]  # type: ignore[operator]
             if best_one and best_two and best_one["throughput_rps"] else None)
    return {
        "cpus": len(context.usable_cpus), "processes": processes,
        "one_worker": {"ladder": steps["one"],
                       "max_throughput_rps": best_one["throughput_rps"] if best_one else None},
        "two_workers": {"ladder": steps["two"],
                        "max_throughput_rps": best_two["throughput_rps"] if best_two else None,
                        "errors": sum(step["errors"] for step in steps["two"])},
        "ratio": round(ratio, 3) if ratio is not None else None,
        "per_core_ratio": _per_core_ratio(best_one, best_two),
    }


class _ConnectionSample(threading.Thread):
    """Each worker's client connections, read once halfway through a step (the load
    generator holds its connections open then); empty for one process or no /proc."""

    def __init__(self, target: Target, seconds: float | None) -> None:
        super().__init__(daemon=True)
        self.target, self.delay = target, (seconds or 1.0) / 2
        self.counts: list[int] = []

    def run(self) -> None:
        from bench.procstat import connections_per_worker

        time.sleep(self.delay)
        if self.target.process is not None:
            self.counts = connections_per_worker(self.target.process.pid,
                                                 self.target.endpoint.port)


def _sample_connections(target: Target, seconds: float | None) -> _ConnectionSample:
    sample = _ConnectionSample(target, seconds)
    sample.start()
    return sample


def _per_core_ratio(one: Mapping[str, Any] | None,
                    two: Mapping[str, Any] | None) -> float | None:
    """Requests per gateway core, two workers over one, at their best steps: how well the
    workers scale with the cores they got (1.0: perfectly), whatever the machine left them."""
    if not one or not two or not one.get("gateway_cores") or not two.get("gateway_cores"):
        return None
    per_core_one = one["throughput_rps"] / one["gateway_cores"]
    return round(two["throughput_rps"] / two["gateway_cores"] / per_core_one, 3) \
        if per_core_one else None


def _tree(target: Target) -> list[int]:
    from bench.procstat import process_tree

    return process_tree(target.process.pid) if target.process else []


# ---- thousands of streams -------------------------------------------------------------------


def start_paced_upstream(environment: Environment) -> tuple[ManagedProcess, int]:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    process = start_process("paced-upstream",
                            [sys.executable, "-m", "bench.paced_upstream", "--listen",
                             f"127.0.0.1:{port}"], env, environment.workdir,
                            environment.load_cpus)
    probe = RequestSpec("GET", f"{FAKE_API_ROOT}/models",
                        (("authorization", "Bearer sk-fake-upstream"),), b"")
    _wait_until_answering(process, Endpoint("127.0.0.1", port), probe)
    return process, port


def streams(context: Context) -> dict[str, Any]:
    """``plan.streams`` paced streams at once through direct and each gateway of the run
    among serve, sidecar-reverse and litellm, against the paced upstream."""
    plan = context.plan
    shape = StreamShape(plan.streams, plan.stream_seconds, plan.stream_delay_ms)
    shape_key = (shape.chunks, shape.delay_ms)
    paced, port = start_paced_upstream(context.environment)
    results: dict[str, Any] = {}
    try:
        environment = dataclasses.replace(
            context.environment, fake_port=port, fake_process=paced, routes_path=None,
            stream_shapes=sorted({shape_key, (4, 5)}))
        names = ["direct", *[n for n in STREAM_TARGETS if n in context.target_names]]
        for name in names:
            results[name] = _streams_through(name, environment, context, shape, shape_key,
                                             paced.pid)
    finally:
        paced.stop()
    _added_gaps(results)
    return {"streams": shape.streams, "seconds": shape.seconds, "delay_ms": shape.delay_ms,
            "chunks": shape.chunks, "steps": shape.steps(),
            "upstream": "bench.paced_upstream (the fake's frames, pre-encoded; see its doc)",
            "targets": results}


def _streams_through(name: str, environment: Environment, context: Context,
                     shape: StreamShape, shape_key: tuple[int, int],
                     upstream_pid: int) -> dict[str, Any]:
    if name == "litellm":
        try:
            ensure_litellm(context.litellm_venv)
        except LiteLLMUnavailable as exc:
            return {"status": "unavailable", "reason": str(exc)}
    say(f"  streams through {name}: {shape.streams} x {shape.seconds:.0f}s, one chunk every "
        f"{shape.delay_ms} ms")
    try:
        target = (direct_target(environment) if name == "direct"
                  else start_target(name, environment, context.litellm_venv))
    except TargetUnavailable as exc:
        return {"status": "unavailable", "reason": str(exc)}
    try:
        _warm(target, 50)
        host, port = target.endpoint.host, target.endpoint.port
        model = target.stream_models.get(shape_key, target.fast_model)
        payload = stream_payload(host, port, target.api_path, target.authorization, model,
                                 shape)
        pid = target.process.pid if target.process is not None else None
        figures = hold_streams(host, port, payload, shape, pid, say, upstream_pid)
        if target.process is not None and not target.process.alive():
            figures["exited"] = target.process.log_tail(8)
        figures["status"] = "ok"
        say(f"  {name}: {figures['ok']} of {shape.streams} streams complete"
            + (f" ({figures['problems']})" if figures["errors"] else ""))
        return figures
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}",
                "log_tail": target.process.log_tail(12) if target.process else ""}
    finally:
        target.stop()


def _added_gaps(results: dict[str, Any]) -> None:
    """Each gateway's inter-chunk gap percentiles minus direct's at the same step."""
    direct_steps = {step["streams"]: step for step in
                    (results.get("direct") or {}).get("steps") or ()}
    for name, figures in results.items():
        if name == "direct" or figures.get("status") != "ok":
            continue
        for step in figures.get("steps") or ():
            floor = direct_steps.get(step["streams"])
            if floor is None:
                continue
            step["added_gap_ms"] = {
                p: (round(step["gaps"][f"{p}_ms"] - floor["gaps"][f"{p}_ms"], 3)
                    if step["gaps"].get(f"{p}_ms") is not None
                    and floor["gaps"].get(f"{p}_ms") is not None else None)
                for p in ("p50", "p99")}
        if figures.get("steps"):
            last = figures["steps"][-1]
            figures["at_most_streams"] = {
                "streams": last["streams"], "open_in_window": last.get("open_in_window"),
                "streaming_in_window": last.get("streaming_in_window"),
                "rss_kib_per_stream": last.get("rss_kib_per_stream"),
                "added_gap_ms": last.get("added_gap_ms"),
                "target_cpu_share": last.get("target_cpu_share"),
            }


# ---- protocols: chat, Messages and Responses streams, CPU per event ----------------------------

IDLE_SECONDS = 3.0


@contextmanager
def protocol_serves(environment: Environment, legs: Sequence[str],
                    ) -> Iterator[tuple[dict[str, Target], ManagedProcess]]:
    """The paced upstream (on the load CPUs) and a `serve` per leg (on the target CPU), each
    with an openai and an anthropic provider on it (bench.protocols' routes)."""
    paced, port = start_paced_upstream(environment)
    try:
        on_paced = dataclasses.replace(environment, fake_port=port, fake_process=paced,
                                       routes_path=None)
        routes = write_protocol_routes(on_paced.workdir / f"protocol-routes-{port}.yaml",
                                       on_paced.fake_base_url)
        with started(*(
            lambda name=name: start_serve(on_paced, name=f"serve-{name}",
                                          extra_env={"LLM_GATEWAY_CONFIG": str(routes)})
            for name in legs
        )) as serves:
            yield dict(zip(legs, serves, strict=True)), paced
    finally:
        paced.stop()


def protocols(context: Context) -> dict[str, Any]:
    """``plan.protocol_streams`` paced streams per leg (chat, chat again, Messages, Responses),
    every leg at once, each through its own `serve` (an openai and an anthropic provider on
    the paced upstream; all on the target CPU), ``plan.protocol_rounds`` rounds: CPU per
    content event and each leg's ratio to chat's (bench.protocols has the definitions)."""
    plan = context.plan
    shape = StreamShape(plan.protocol_streams, plan.protocol_seconds, plan.stream_delay_ms,
                        stepped=False)
    say(f"  {shape.streams} streams x {shape.seconds:g}s per leg ({', '.join(LEGS)}), all "
        f"at once, one event every {shape.delay_ms} ms, {plan.protocol_rounds} rounds")
    with protocol_serves(context.environment, list(LEGS)) as (targets, paced):
        idle = {name: CpuSample.take(t.process.pid)  # type: ignore[union-attr]
                for name, t in targets.items()}
        time.sleep(IDLE_SECONDS)
        idle_share = {name: round(sample.elapsed() / IDLE_SECONDS, 4)
                      for name, sample in idle.items()}
        figures = measure_protocols(targets, shape, plan.protocol_rounds, paced.pid, say)
        notes = targets[BASELINE].notes[:1]
    for name, leg in figures["legs"].items():
        say(f"  {name}: {leg['steady_us_per_event']} us per event steady (x "
            f"{leg.get('steady_ratio_to_chat', 1.0)} chat's), {leg['whole_us_per_event']} us "
            f"whole (x {leg.get('whole_ratio_to_chat', 1.0)}), {leg['per_stream_us']} us per "
            "stream")
    return {"streams": shape.streams, "seconds": shape.seconds, "delay_ms": shape.delay_ms,
            "chunks": shape.chunks, "rounds_run": plan.protocol_rounds,
            "models": PROTOCOL_MODELS, "upstream": UPSTREAM, "notes": notes,
            "idle_cpu_share": idle_share, **figures}


def translation(context: Context) -> dict[str, Any]:
    """``plan.translation_streams`` paced streams per leg of TRANSLATION_LEGS (each caller
    protocol untranslated and translated), every leg at once, each through its own `serve`
    (the protocols phase's providers, and one that speaks chat only), ``plan.protocol_seconds``
    long, ``plan.protocol_rounds`` rounds: CPU per content event and each translated leg's
    ratio to its untranslated leg's."""
    plan = context.plan
    shape = StreamShape(plan.translation_streams, plan.protocol_seconds, plan.stream_delay_ms,
                        stepped=False)
    say(f"  {shape.streams} streams x {shape.seconds:g}s per leg ({', '.join(TRANSLATION_LEGS)}"
        f"), all at once, one event every {shape.delay_ms} ms, {plan.protocol_rounds} rounds")
    with protocol_serves(context.environment, list(TRANSLATION_LEGS)) as (targets, paced):
        figures = measure_protocols(targets, shape, plan.protocol_rounds, paced.pid, say,
                                    UNTRANSLATED, "untranslated")
        notes = targets[BASELINE].notes[:1]
    for name, leg in figures["legs"].items():
        ratio = (f" (x {leg['steady_ratio_to_untranslated']} {leg['baseline']}'s, range "
                 f"{leg['steady_ratio_range']})" if "baseline" in leg else "")
        say(f"  {name}: {leg['steady_us_per_event']} us per event steady{ratio}, "
            f"{leg['whole_us_per_event']} us whole, {leg['per_stream_us']} us per stream")
    return {"streams": shape.streams, "seconds": shape.seconds, "delay_ms": shape.delay_ms,
            "chunks": shape.chunks, "rounds_run": plan.protocol_rounds,
            "models": {name: alias for name, (_, alias) in TRANSLATION_LEGS.items()},
            "upstream": UPSTREAM, "notes": notes, **figures}


# ---- budget: serve-budget against serve, request by request ---------------------------------

UNLEASED = "serve-budget-unleased"  # serve-budget with LIMIT_LEASE_SECONDS=0


def budget(context: Context) -> dict[str, Any]:
    """Concurrency-1 latency of serve, serve-redis, serve-budget and serve-budget without
    leases, one request to each in turn (the order alternating), each on its own keep-alive
    connection: the difference of the medians is what the budget path adds, with the
    machine's drift in every leg alike. The goal reads serve-budget over serve; serve-redis
    (the rate limit in Redis, no budget) splits that into what the shared rate limit costs
    and what the budget adds to it; the leg without leases (``LIMIT_LEASE_SECONDS=0``) is
    what every request asking Redis would cost."""
    environment = context.environment
    pairs = context.plan.budget_pairs
    with started(lambda: start_serve(environment, routed=True),
                 lambda: start_serve_redis(environment),
                 lambda: start_target("serve-budget", environment, context.litellm_venv),
                 lambda: start_serve_budget(environment, name=UNLEASED,
                                            extra_env={"LIMIT_LEASE_SECONDS": "0"}),
                 ) as legs:
        clients = {target.name: KeepAlive(target) for target in legs}
        for _ in range(200):  # warm: connections, caches, the Redis scripts loaded
            for client in clients.values():
                client.send()
        latencies: dict[str, list[float]] = {name: [] for name in clients}
        cpu_before = {t.name: cpu_seconds(t.process.pid) for t in legs if t.process}
        for turn in range(pairs):
            order = list(clients) if turn % 2 else list(reversed(clients))
            for name in order:
                latencies[name].append(clients[name].send())
        cpu_after = {t.name: cpu_seconds(t.process.pid) for t in legs if t.process}
        notes = legs[-1].notes
    summaries = {name: summarize_latencies(values) for name, values in latencies.items()}
    figures: dict[str, Any] = {"pairs": pairs, "notes": notes}
    for name, summary in summaries.items():
        figures[name] = {"latency_ms": summary.as_dict(), "cpu_per_request_us": round(
            1e6 * (cpu_after[name] - cpu_before[name]) / pairs, 1)}

    def over(upper: str, lower: str) -> dict[str, float]:
        return {percentile: round(getattr(summaries[upper], percentile)
                                  - getattr(summaries[lower], percentile), 3)
                for percentile in ("p50", "p90", "p99")}

    figures["added_ms"] = over("serve-budget", "serve")
    figures["redis_limiter_ms"] = over("serve-redis", "serve")
    figures["budget_over_redis_ms"] = over("serve-budget", "serve-redis")
    figures["unleased_ms"] = over(UNLEASED, "serve")
    say(f"  serve-budget over serve at c=1: p50 +{figures['added_ms']['p50']} ms, of which "
        f"the Redis rate limit alone +{figures['redis_limiter_ms']['p50']} ms; without "
        f"leases +{figures['unleased_ms']['p50']} ms ({pairs} rounds)")
    return figures


class KeepAlive:
    """One keep-alive connection sending the target's chat request; each answer's time. The
    client's own cost is the same in both legs, so it cancels in the difference."""

    def __init__(self, target: Target) -> None:
        self.spec = target.chat_request()
        self.connection = http.client.HTTPConnection(target.endpoint.host,
                                                     target.endpoint.port, timeout=30)
        self.name = target.name

    def send(self) -> float:
        started_at = time.perf_counter()
        self.connection.request(self.spec.method, self.spec.path, self.spec.body,
                                dict(self.spec.headers))
        answer = self.connection.getresponse()
        answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{self.name} answered {answer.status}")
        return time.perf_counter() - started_at  # seconds, as summarize_latencies takes


PHASES: dict[str, Callable[[Context], dict[str, Any]]] = {
    "observability": observability,
    "inprocess": inprocess,
    "workers": workers,
    "streams": streams,
    "protocols": protocols,
    "translation": translation,
    "budget": budget,
}
