"""``python -m bench.run``: the whole comparison in one command.

    python -m bench.run [--quick] [--targets direct,serve,serve-budget,sidecar-reverse,...]
                        [--phases observability,inprocess,workers,streams,protocols,
                                  translation,budget]
                        [--streams N] [--stream-seconds S]
                        [--protocol-streams N] [--protocol-seconds S] [--protocol-rounds R]
                        [--translation-streams N]
                        [--out bench/results] [--soak SECONDS] [--no-pin] [--python-client]

Starts the fake upstream, creates a gateway key, then starts, measures and stops each target
in turn (the table), then runs each phase (bench/phases.py). Prints the table, the phases and
every goal, and writes ``bench-<timestamp>.json``, ``.png``, ``-streams.png`` and ``.md`` (the
tables in Markdown, for docs/performance.md) plus ``latest.*`` copies into the output directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.chart import write_chart, write_streams_chart
from bench.goals import check_goals
from bench.litellm_env import DEFAULT_VENV, LITELLM_VERSION, LiteLLMUnavailable, ensure_litellm
from bench.loadgen import HeyGenerator, WrkGenerator
from bench.machine import describe_machine
from bench.measure import FULL_PLAN, QUICK_PLAN, Plan, Tools, measure_direct, measure_target, say
from bench.phases import PHASE_NAMES, PHASES, run_phase
from bench.phases import Context as PhaseContext
from bench.procstat import raise_fd_limit
from bench.report import direct_figures, render_markdown, render_text, write_json
from bench.targets import (
    DEFAULT_TARGETS,
    TARGET_NAMES,
    Target,
    TargetUnavailable,
    direct_target,
    start_environment,
    start_target,
)

DEFAULT_OUT = Path(__file__).resolve().parent / "results"

PYTHON_CLIENT_LIMITS = (
    "Streams, held streams and the regular-mode sidecar's concurrency-1 latency use the "
    "harness's asyncio client: one Python process sharing the load CPU with the fake "
    "upstream. Its own event-loop latency is in the direct leg too, so added figures are "
    "fair, but absolute figures are higher than wrk's and it saturates first under load."
)


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="a few hundred requests per target (what the test suite runs)")
    parser.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                        help=f"comma-separated, from {','.join(TARGET_NAMES)} (default: all "
                             "but serve-legacy and serve-redis)")
    parser.add_argument("--phases", default=",".join(PHASE_NAMES),
                        help=f"comma-separated, from {','.join(PHASE_NAMES)}, or none "
                             "(default: all)")
    parser.add_argument("--streams", type=int, default=None, metavar="N",
                        help="streams held at once in the streams phase (default 5000; "
                             "--quick 200)")
    parser.add_argument("--stream-seconds", type=float, default=None, metavar="S",
                        help="how long each of those streams lasts, one chunk every 100 ms "
                             "(default 30; --quick 3)")
    parser.add_argument("--protocol-streams", type=int, default=None, metavar="N",
                        help="streams of each protocol at once in the protocols phase "
                             "(default 200; --quick 40)")
    parser.add_argument("--protocol-seconds", type=float, default=None, metavar="S",
                        help="how long each of those streams lasts, one event every 100 ms "
                             "(default 20; --quick 3)")
    parser.add_argument("--protocol-rounds", type=int, default=None, metavar="R",
                        help="rounds of chat, messages and responses in the protocols phase "
                             "(default 5; --quick 1)")
    parser.add_argument("--translation-streams", type=int, default=None, metavar="N",
                        help="streams of each leg at once in the translation phase (default "
                             "100; --quick 40); it takes --protocol-seconds and -rounds")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="where the JSON, PNG and Markdown go (default bench/results)")
    parser.add_argument("--soak", type=float, default=0.0, metavar="SECONDS",
                        help="also hold concurrency 8 this long per gateway and report RSS "
                             "growth (the issue's soak is 600)")
    parser.add_argument("--no-pin", action="store_true",
                        help="do not pin targets and load generator to separate CPUs")
    parser.add_argument("--python-client", action="store_true",
                        help="use only the built-in Python client, even if wrk/hey exist")
    parser.add_argument("--litellm-venv", type=Path, default=DEFAULT_VENV,
                        help="LiteLLM's own virtual environment (created when missing)")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.targets.split(",") if name.strip()]
    unknown = [name for name in names if name not in TARGET_NAMES]
    if unknown:
        parser.error(f"unknown targets {unknown}; choose from {', '.join(TARGET_NAMES)}")
    # direct is the floor every figure is added over: always measured, always first.
    args.target_names = ["direct", *[n for n in TARGET_NAMES if n in names and n != "direct"]]
    phases = [name.strip() for name in args.phases.split(",") if name.strip()]
    if phases == ["none"]:
        phases = []
    unknown = [name for name in phases if name not in PHASE_NAMES]
    if unknown:
        parser.error(f"unknown phases {unknown}; choose from {', '.join(PHASE_NAMES)} or none")
    args.phase_names = [name for name in PHASE_NAMES if name in phases]
    if args.streams is not None and args.streams < 1:
        parser.error("--streams must be at least 1")
    if args.stream_seconds is not None and args.stream_seconds < 0.5:
        parser.error("--stream-seconds must be at least 0.5")
    for name in ("protocol_streams", "protocol_rounds", "translation_streams"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.protocol_seconds is not None and args.protocol_seconds < 3:
        parser.error("--protocol-seconds must be at least 3 (the window needs a second)")
    return args


def assign_cpus(pin: bool) -> tuple[list[int] | None, list[int] | None]:
    """(target CPUs, load CPUs): the last usable CPU for the target under test, the others
    for the load generator and the fake upstream. One CPU per target makes throughput a
    per-core figure, the same for every gateway."""
    usable = sorted(os.sched_getaffinity(0))
    if not pin or len(usable) < 2:
        return None, None
    return usable[-1:], usable[:-1]


def run_target(
    name: str, environment: Any, direct: Target, plan: Plan, tools: Tools,
    direct_ladder: list[dict[str, object]] | None, litellm_venv: Path,
) -> dict[str, Any]:
    if name == "litellm":
        try:
            ensure_litellm(litellm_venv)
        except LiteLLMUnavailable as exc:
            say(f"litellm unavailable: {exc}")
            return {"name": name, "status": "unavailable", "reason": str(exc)}
    say(f"starting {name}")
    try:
        target = start_target(name, environment, litellm_venv)
    except TargetUnavailable as exc:
        say(f"{name} unavailable: {exc}")
        return {"name": name, "status": "unavailable", "reason": str(exc)}
    try:
        return measure_target(target, direct, plan, tools, direct_ladder)
    except Exception as exc:  # one broken target must not lose the others' figures
        log_tail = target.process.log_tail(12) if target.process else ""
        say(f"{name} failed: {type(exc).__name__}: {exc}")
        traceback.print_exc(file=sys.stderr)
        return {"name": name, "status": "failed", "reason": f"{type(exc).__name__}: {exc}",
                "log_tail": log_tail}
    finally:
        target.stop()


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = QUICK_PLAN if args.quick else FULL_PLAN
    if args.soak:
        plan = dataclasses.replace(plan, soak_seconds=args.soak)
    if args.streams is not None:
        plan = dataclasses.replace(plan, streams=args.streams)
    if args.stream_seconds is not None:
        plan = dataclasses.replace(plan, stream_seconds=args.stream_seconds)
    for name in ("protocol_streams", "protocol_seconds", "protocol_rounds",
                 "translation_streams"):
        if getattr(args, name) is not None:
            plan = dataclasses.replace(plan, **{name: getattr(args, name)})
    fd_limit = raise_fd_limit()  # thousands of streams: the children inherit it too
    usable_cpus = sorted(os.sched_getaffinity(0))
    target_cpus, load_cpus = assign_cpus(not args.no_pin)
    if load_cpus:
        # wrk, hey and the Python client inherit this: they stay off the target's CPU.
        os.sched_setaffinity(0, set(load_cpus))
    # One wrk thread per load CPU: more threads than CPUs only adds contention.
    wrk_threads = len(load_cpus) if load_cpus else max(1, (os.cpu_count() or 2) // 2)
    tools = Tools(allow_external=not args.python_client, wrk_threads=wrk_threads)
    started = time.monotonic()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    workdir = Path(tempfile.mkdtemp(prefix="llm-gateway-bench-"))
    results: dict[str, dict[str, Any]] = {}
    phases: dict[str, dict[str, Any]] = {}
    environment = start_environment(workdir, target_cpus=target_cpus, load_cpus=load_cpus,
                                    stream_shapes=plan.stream_shapes)
    try:
        direct = direct_target(environment)
        results["direct"] = measure_direct(direct, plan, tools)
        for name in args.target_names[1:]:
            results[name] = run_target(name, environment, direct, plan, tools,
                                       results["direct"]["ladder"], args.litellm_venv)
        context = PhaseContext(environment, plan, tools, args.target_names, args.litellm_venv,
                               usable_cpus)
        for name in args.phase_names:
            phases[name] = run_phase(name, lambda name=name: PHASES[name](context))
    finally:
        environment.fake_process.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    direct_figures(results)
    versions = {name: figures.get("version") for name, figures in results.items()
                if figures.get("version")}
    return {
        "run": {
            "date": date,
            "plan": plan.name,
            "command": " ".join(["python -m bench.run", *sys.argv[1:]]),
            "duration_s": round(time.monotonic() - started, 1),
            "targets_requested": args.target_names,
            "phases_requested": args.phase_names,
            "fd_limit": fd_limit,
            "target_cpus": target_cpus,
            "load_cpus": load_cpus,
            "stream_shape": list(plan.stream_shape),
            "held_shape": list(plan.held_shape),
            "plan_settings": _plan_settings(plan),
            "load_generators": {
                "wrk": WrkGenerator.available() and not args.python_client,
                "hey": HeyGenerator.available() and not args.python_client,
                "python_client_limits": PYTHON_CLIENT_LIMITS,
            },
            "litellm_pinned_version": LITELLM_VERSION,
            "versions": versions,
        },
        "machine": describe_machine(),
        "targets": results,
        "phases": phases,
        "goals": check_goals(results, phases),
    }


def _plan_settings(plan: Plan) -> dict[str, Any]:
    settings = dataclasses.asdict(plan)
    for key, value in settings.items():
        if isinstance(value, tuple):
            settings[key] = list(value)
    return settings


def write_outputs(document: dict[str, Any], out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    paths = {kind: out / f"bench-{stamp}.{kind}" for kind in ("json", "png", "md")}
    paths["streams.png"] = out / f"bench-{stamp}-streams.png"
    document["run"]["chart_renderer"] = write_chart(document, paths["png"])
    write_streams_chart(document, paths["streams.png"])
    write_json(paths["json"], document)
    paths["md"].write_text(render_markdown(document))
    for kind, path in paths.items():
        shutil.copyfile(path, out / ("latest-streams.png" if kind == "streams.png"
                                     else f"latest.{kind}"))
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    document = run(args)
    paths = write_outputs(document, args.out)
    print(render_text(document))
    print()
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
