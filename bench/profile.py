"""``python -m bench.profile``: where a gateway spends its CPU under load, per function.

    python -m bench.profile [--target serve|serve-budget|serve-legacy|sidecar-reverse|
                                      sidecar-regular] [--seconds 15]
                            [--concurrency 8] [--stream] [--out bench/results]

Starts the fake upstream and the target exactly as the benchmark does (serve, serve-budget and
the sidecars called with the routed alias; serve-budget needs Redis), drives it at a fixed
concurrency, and samples it with py-spy (``pip install py-spy``). Writes the collapsed stacks
(``profile-<target>.txt``, for flamegraph tools or speedscope) and prints the functions with
the most samples: by self time, and inclusive (the function and everything it called).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bench.loadgen import Budget
from bench.measure import FULL_PLAN, Tools
from bench.run import DEFAULT_OUT, assign_cpus
from bench.targets import GATEWAY_TARGETS, TargetUnavailable, start_environment, start_target

# Every gateway target of the run but LiteLLM (not ours to profile).
PROFILED_TARGETS = [name for name in GATEWAY_TARGETS if name != "litellm"]


def summarize(collapsed: Path, top: int = 30) -> str:
    """Self and inclusive sample shares per frame, from py-spy's raw (collapsed) output."""
    self_samples: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        self_samples[frames[-1]] += count
        for frame in set(frames):  # a recursive frame counts once per sample
            inclusive[frame] += count
    if not total:
        return "no samples"
    lines = [f"{total} samples", "", "self (the frame itself was running):"]
    lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in self_samples.most_common(top)]
    lines += ["", "inclusive (the frame or something it called):"]
    lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in inclusive.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="serve", choices=PROFILED_TARGETS)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--stream", action="store_true", help="drive streams, not JSON calls")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        print("py-spy is not installed: pip install py-spy", file=sys.stderr)
        return 2

    target_cpus, load_cpus = assign_cpus(True)
    if load_cpus:
        os.sched_setaffinity(0, set(load_cpus))
    workdir = Path(tempfile.mkdtemp(prefix="llm-gateway-profile-"))
    environment = start_environment(workdir, target_cpus=target_cpus, load_cpus=load_cpus,
                                    stream_shapes=FULL_PLAN.stream_shapes)
    args.out.mkdir(parents=True, exist_ok=True)
    collapsed = args.out / f"profile-{args.target}{'-stream' if args.stream else ''}.txt"
    try:
        try:
            target = start_target(args.target, environment, Path("unused"))
        except TargetUnavailable as exc:
            print(f"{args.target} unavailable: {exc}", file=sys.stderr)
            return 2
        assert target.process is not None
        try:
            tools = Tools(allow_external=True, wrk_threads=1)
            spec = target.chat_request(stream_shape=(16, 0) if args.stream else None)
            budget = Budget(seconds=args.seconds + 2)
            load = threading.Thread(target=lambda: tools.for_budget(target, budget).run(
                target.endpoint, spec, args.concurrency, budget), daemon=True)
            load.start()
            subprocess.run(
                [py_spy, "record", "--pid", str(target.process.pid), "--duration",
                 str(args.seconds), "--rate", str(args.rate), "--format", "raw",
                 "--output", str(collapsed), "--nonblocking"],
                check=True, capture_output=True, timeout=args.seconds + 60,
            )
            load.join()
        finally:
            target.stop()
    finally:
        environment.fake_process.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(summarize(collapsed))
    print(f"\ncollapsed stacks: {collapsed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
