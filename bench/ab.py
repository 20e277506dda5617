"""``python -m bench.ab OLD NEW``: one gateway from two source trees, side by side, to judge
a change worth a few microseconds, which a full run cannot tell from the host's drift.

    python -m bench.ab /tmp/before . [--target serve|serve-redis|serve-budget] [--pairs 3000]
                                     [--rounds 10] [--old-env K=V ...] [--new-env K=V ...]
                                     [--old-target T] [--new-target T]

OLD and NEW are checkouts of the project (``git worktree add /tmp/before HEAD~1``); each
gateway runs with its tree first on ``PYTHONPATH``, so both use this environment's
packages. Both are started as the benchmark starts ``--target`` (the routed alias; Redis,
prices and a budget for serve-budget; the rate limit in Redis for serve-redis), pinned to
the target CPU, against one fake upstream. Then, at concurrency 1, one request to each in
turn (which goes first alternates), each on its own keep-alive connection: percentiles per
tree and the difference of the p50s, with the CPU per request. Then CPU per request at
concurrency 8 in ``--rounds`` rounds, which tree goes first alternating: the median per
tree. ``--old-env`` and ``--new-env`` set variables on one side only (the same tree twice
with ``--new-env ACCESS_LOG=off`` measures a setting). The same tree on both sides measures the
harness's own noise: 2 us at the c=1 p50 on a quiet host.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.measure import FULL_PLAN, Tools, cpu_per_request
from bench.phases import KeepAlive, started
from bench.procstat import cpu_seconds
from bench.run import assign_cpus
from bench.stats import summarize_latencies
from bench.targets import (
    Environment,
    Target,
    start_environment,
    start_serve,
    start_serve_budget,
    start_serve_redis,
)

SIDES = ("old", "new")
TARGETS = ("serve", "serve-redis", "serve-budget")


def _environment_of(items: Sequence[str]) -> dict[str, str]:
    pairs = dict(item.split("=", 1) for item in items)
    return {name.strip(): value for name, value in pairs.items()}


def _starter(environment: Environment, target: str, side: str, tree: Path,
             extra: dict[str, str]) -> Callable[[], Target]:
    env = {"PYTHONPATH": str(tree.resolve()), **extra}
    if target == "serve-budget":
        return lambda: start_serve_budget(environment, name=side, extra_env=env)
    if target == "serve-redis":
        return lambda: start_serve_redis(environment, name=side, extra_env=env)
    return lambda: start_serve(environment, name=side, routed=True, extra_env=env)


def compare(trees: dict[str, Path], *, targets: dict[str, str], pairs: int, rounds: int,
            extra_env: dict[str, dict[str, str]]) -> dict[str, dict[str, float]]:
    """Per side: c=1 p50/p90/p99 ms, CPU per request at c=1 and the median at c=8 (us)."""
    target_cpus, load_cpus = assign_cpus(True)
    if load_cpus:
        os.sched_setaffinity(0, set(load_cpus))
    workdir = Path(tempfile.mkdtemp(prefix="llm-gateway-ab-"))
    environment = start_environment(workdir, target_cpus=target_cpus, load_cpus=load_cpus,
                                    stream_shapes=[])
    figures: dict[str, dict[str, float]] = {side: {} for side in SIDES}
    try:
        starters = [_starter(environment, targets[side], side, trees[side], extra_env[side])
                    for side in SIDES]
        with started(*starters) as gateways:
            by_side = dict(zip(SIDES, gateways, strict=True))
            clients = {side: KeepAlive(gateway) for side, gateway in by_side.items()}
            for _ in range(300):  # warm: connections, caches, scripts loaded
                for client in clients.values():
                    client.send()
            latencies: dict[str, list[float]] = {side: [] for side in SIDES}
            before = {side: cpu_seconds(g.process.pid) for side, g in by_side.items()
                      if g.process is not None}
            for turn in range(pairs):
                for side in SIDES if turn % 2 else reversed(SIDES):
                    latencies[side].append(clients[side].send())
            after = {side: cpu_seconds(g.process.pid) for side, g in by_side.items()
                     if g.process is not None}
            tools = Tools(allow_external=True, wrk_threads=max(1, len(load_cpus or [0])))
            cpu: dict[str, list[float]] = {side: [] for side in SIDES}
            for turn in range(rounds):
                for side in SIDES if turn % 2 else reversed(SIDES):
                    measured = cpu_per_request(by_side[side], FULL_PLAN, tools)
                    if measured.get("cpu_per_request_us") is not None:
                        cpu[side].append(float(measured["cpu_per_request_us"]))  # type: ignore[arg-type]
        for side in SIDES:
            summary = summarize_latencies(latencies[side])
            figures[side] = {
                "p50_ms": summary.p50, "p90_ms": summary.p90, "p99_ms": summary.p99,
                "cpu_c1_us": 1e6 * (after[side] - before[side]) / pairs if side in after
                else float("nan"),
                "cpu_c8_us": statistics.median(cpu[side]) if cpu[side] else float("nan"),
            }
    finally:
        environment.fake_process.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return figures


def report(figures: dict[str, dict[str, float]], trees: dict[str, Path]) -> str:
    lines = [f"{'side':5}  {'c=1 p50/p90/p99 ms':22}  {'CPU us c=1':>10}  {'CPU us c=8':>10}"
             "  tree"]
    for side in SIDES:
        f = figures[side]
        lines.append(f"{side:5}  {f['p50_ms']:.3f}/{f['p90_ms']:.3f}/{f['p99_ms']:.3f}"
                     f"{'':4}  {f['cpu_c1_us']:10.0f}  {f['cpu_c8_us']:10.1f}  {trees[side]}")
    old, new = figures["old"], figures["new"]
    lines.append(f"new - old: c=1 p50 {1000 * (new['p50_ms'] - old['p50_ms']):+.0f} us, "
                 f"CPU c=1 {new['cpu_c1_us'] - old['cpu_c1_us']:+.0f} us, "
                 f"CPU c=8 {new['cpu_c8_us'] - old['cpu_c8_us']:+.1f} us")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--target", choices=TARGETS, default="serve")
    parser.add_argument("--old-target", choices=TARGETS,
                        help="this side's target instead of --target (serve against "
                        "serve-budget on one tree: what a budget costs, request by request)")
    parser.add_argument("--new-target", choices=TARGETS)
    parser.add_argument("--pairs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--old-env", nargs="*", default=[], metavar="K=V")
    parser.add_argument("--new-env", nargs="*", default=[], metavar="K=V")
    args = parser.parse_args(argv)
    trees = {"old": args.old, "new": args.new}
    for side, tree in trees.items():
        if not (tree / "llm_gateway" / "__init__.py").is_file():
            parser.error(f"{side}: {tree} is not a checkout of the project")
    targets = {"old": args.old_target or args.target, "new": args.new_target or args.target}
    figures = compare(trees, targets=targets, pairs=args.pairs, rounds=args.rounds,
                      extra_env={"old": _environment_of(args.old_env),
                                 "new": _environment_of(args.new_env)})
    print(report(figures, trees))


if __name__ == "__main__":
    main()
