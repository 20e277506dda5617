"""``python -m bench.profile``: where a gateway spends its CPU under load, per function.

    python -m bench.profile [--target serve|serve-budget|serve-legacy|sidecar-reverse|
                                      sidecar-regular] [--seconds 15]
                            [--concurrency 8] [--stream] [--out bench/results]
    python -m bench.profile --protocols chat,messages,responses [--streams 300]
                            [--seconds 20] [--rate 1000]
    python -m bench.profile --protocols messages,messages->chat [--streams 100]

Starts the fake upstream and the target exactly as the benchmark does (serve, serve-budget and
the sidecars called with the routed alias; serve-budget needs Redis), drives it at a fixed
concurrency, and samples it with py-spy (``pip install py-spy``). Writes the collapsed stacks
(``profile-<target>.txt``, for flamegraph tools or speedscope) and prints the functions with
the most samples: by self time, and inclusive (the function and everything it called).

With ``--protocols``, a `serve` per protocol as the protocols phase starts them
(``bench.phases.protocol_serves``) holds ``--streams`` paced streams of its protocol, every
protocol at once, and each is sampled over the same ``--seconds`` of steady streaming. Writes
``profile-protocol-<name>.txt`` per protocol and prints, per function (its lines merged), the
microseconds per content event of each protocol, self and inclusive, and each one's difference
from the first protocol's, largest first: where a protocol spends more per event than chat.
A name may be a translation phase's leg (``messages->chat``: a Messages caller on a chat-only
target, ``bench.protocols.TRANSLATION_LEGS``): where translating spends, beside the
untranslated leg named first.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.loadgen import Budget
from bench.measure import FULL_PLAN, Tools
from bench.phases import protocol_serves
from bench.protocols import (
    TRANSLATION_LEGS,
    WARM_SHAPE,
    leg_figures,
    leg_model,
    leg_protocol,
    protocol_leg,
)
from bench.run import DEFAULT_OUT, assign_cpus
from bench.streams import PROTOCOLS, StreamShape, hold_together
from bench.targets import (
    GATEWAY_TARGETS,
    Environment,
    TargetUnavailable,
    start_environment,
    start_target,
)

# What --protocols takes: a protocol (its own alias) or a translation phase's leg.
KNOWN_LEGS = [*PROTOCOLS, *(name for name in TRANSLATION_LEGS if name not in PROTOCOLS)]
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


_LINE = re.compile(r":\d+\)$")


def per_function(collapsed: Path) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """(self, inclusive) samples per function, its lines merged: ``name (file)``."""
    self_samples: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_LINE.sub(")", frame) for frame in stack.split(";")]
        self_samples[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    return self_samples, inclusive


def compare_protocols(profiles: dict[str, Path], events: dict[str, int], rate: int,
                      top: int = 25) -> str:
    """Per function: us per content event of each protocol (samples / rate / events), self
    and inclusive, and the difference from the first protocol's, largest first."""
    names = list(profiles)
    counted = {name: per_function(path) for name, path in profiles.items()}

    def us(name: str, counter: collections.Counter[str], frame: str) -> float:
        return 1e6 * counter[frame] / rate / max(1, events[name])

    lines = ["us per content event from the samples: " + ", ".join(
        f"{name} {1e6 * sum(counted[name][0].values()) / rate / max(1, events[name]):.1f}"
        for name in names)]
    base = names[0]
    for label, which in (("self", 0), ("inclusive", 1)):
        frames = set().union(*(counted[name][which] for name in names))
        rows = []
        for frame in frames:
            values = [us(name, counted[name][which], frame) for name in names]
            rows.append((max(abs(v - values[0]) for v in values), frame, values))
        rows.sort(key=lambda row: -row[0])
        lines += ["", f"{label}, us per event ({' / '.join(names)}; then each minus {base}):"]
        for _, frame, values in rows[:top]:
            lines.append("  " + " / ".join(f"{v:6.2f}" for v in values) + "   "
                         + " ".join(f"{v - values[0]:+6.2f}" for v in values[1:])
                         + f"  {frame[:110]}")
    return "\n".join(lines)


def profile_protocols(names: Sequence[str], environment: Environment, py_spy: str,
                      args: argparse.Namespace) -> int:
    """Every protocol of ``names`` at once, each through its own serve, each sampled."""
    shape = StreamShape(args.streams, args.seconds + 6, 100, stepped=False)
    collapsed = {name: args.out / f"profile-protocol-{name.replace('->', '-to-')}.txt"
                 for name in names}
    with protocol_serves(environment, list(names)) as (targets, paced):
        hold_together([protocol_leg(targets[name], leg_protocol(name), WARM_SHAPE,
                                    measured=False, model=leg_model(name))
                       for name in names], WARM_SHAPE)
        held: dict[str, Any] = {}
        legs = [protocol_leg(targets[name], leg_protocol(name), shape, measured=True,
                             model=leg_model(name)) for name in names]
        load = threading.Thread(target=lambda: held.update(all=hold_together(
            legs, shape, paced.pid, window_s=args.seconds)), daemon=True)
        load.start()
        time.sleep(3.0)  # every stream open, past its opening events
        recorders = [subprocess.Popen(
            [py_spy, "record", "--pid", str(targets[name].process.pid),  # type: ignore[union-attr]
             "--duration", str(args.seconds), "--rate", str(args.rate), "--format", "raw",
             "--output", str(collapsed[name]), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for name in names]
        for recorder in recorders:
            recorder.wait(args.seconds + 60)
        load.join()
    measured = {name: leg_figures(figures) for name, figures in zip(names, held["all"],
                                                                    strict=True)}
    print("measured (the window's CPU / its content events): " + ", ".join(
        f"{name} {measured[name]['steady_us_per_event']} us" for name in names))
    # Every stream sends one content event per 100 ms throughout the sampled seconds.
    events = {name: round(args.streams * args.seconds * 10) for name in names}
    print(compare_protocols(collapsed, events, args.rate))
    for name, path in collapsed.items():
        print(f"collapsed stacks ({name}): {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="serve", choices=PROFILED_TARGETS)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--stream", action="store_true", help="drive streams, not JSON calls")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--protocols", default=None,
                        help=f"comma-separated, from {','.join(KNOWN_LEGS)}: profile "
                             "streams of each at once, each through its own serve")
    parser.add_argument("--streams", type=int, default=300,
                        help="with --protocols: streams of each protocol at once")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    names = [name.strip() for name in (args.protocols or "").split(",") if name.strip()]
    if unknown := [name for name in names if name not in KNOWN_LEGS]:
        parser.error(f"unknown protocols {unknown}; choose from {', '.join(KNOWN_LEGS)}")
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
    if args.protocols:
        try:
            return profile_protocols(names, environment, py_spy, args)
        finally:
            environment.fake_process.stop()
            shutil.rmtree(workdir, ignore_errors=True)
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
