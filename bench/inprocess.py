"""The in-process transport's cost: the same chat completion made by the openai SDK
straight to the fake upstream, through the transport (the engine in this process), and
through a `serve` process, at concurrency 1, in one run.

    .venv/bin/python -m bench.inprocess [--requests 300] [--round 20]

Every leg runs the same number of requests, in interleaved rounds (a round of each leg in
turn), so drift on the machine lands on every leg alike; percentiles pool each leg's
requests. *Added* is a leg minus the direct leg of the same SDK flavour (sync or async).
CPU per request: this process's ``time.process_time`` over the leg (the SDK, and for the
transport the engine with its thread), and for `serve` its process's utime+stime from
/proc besides. The access log is off in both gateways, so the figures are the path's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from bench.procstat import cpu_seconds
from bench.stats import percentile
from bench.targets import FAKE_API_KEY, FAST_MODEL, start_environment, start_serve
from llm_gateway.adapters.inprocess import stop_engine
from llm_gateway.config import load_settings
from llm_gateway.engine import Gateway
from llm_gateway.httpx import BASE_HOST, GatewayTransport
from llm_gateway.wiring import build_gateway

MESSAGES = [{"role": "user", "content": "Say hello."}]
WARMUP_REQUESTS = 20


@dataclass
class Leg:
    name: str
    call: Callable[[], Awaitable[Any]]
    baseline: str | None = None  # the direct leg it is compared with
    process_pid: int | None = None  # a gateway process whose CPU counts as well
    latencies: list[float] = field(default_factory=list)
    cpu_here: float = 0.0
    cpu_there: float = 0.0

    async def run(self, count: int) -> None:
        there = cpu_seconds(self.process_pid) if self.process_pid else 0.0
        here = time.process_time()
        for _ in range(count):
            started = time.perf_counter()
            await self.call()
            self.latencies.append(time.perf_counter() - started)
        self.cpu_here += time.process_time() - here
        if self.process_pid:
            self.cpu_there += cpu_seconds(self.process_pid) - there

    def ms(self, pct: float) -> float:
        return percentile(sorted(self.latencies), pct) * 1000


def _sync(client: openai.OpenAI) -> Callable[[], Awaitable[Any]]:
    async def call() -> Any:
        # Blocking on purpose: the sync SDK as an application calls it (the transport hands
        # the work to the engine's own loop thread and waits).
        return client.chat.completions.create(model=FAST_MODEL, messages=MESSAGES,
                                              max_tokens=64)  # type: ignore[arg-type]

    return call


def _async(client: openai.AsyncOpenAI) -> Callable[[], Awaitable[Any]]:
    async def call() -> Any:
        return await client.chat.completions.create(model=FAST_MODEL, messages=MESSAGES,
                                                    max_tokens=64)  # type: ignore[arg-type]

    return call


def make_legs(fake_url: str, serve_url: str, serve_pid: int, key: str,
              sync_engine: Gateway, async_engine: Gateway) -> list[Leg]:
    """Two engines: the sync SDK's runs on its own loop thread, the async SDK's on this
    process's loop (an engine belongs to one loop)."""
    base = BASE_HOST + "/v1"

    def sync_client(url: str, api_key: str, **http: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=url, api_key=api_key, max_retries=0,
                             http_client=httpx.Client(**http))

    def async_client(url: str, api_key: str, **http: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=url, api_key=api_key, max_retries=0,
                                  http_client=httpx.AsyncClient(**http))

    return [
        Leg("direct, sync SDK", _sync(sync_client(fake_url, FAKE_API_KEY))),
        Leg("transport, sync SDK", _sync(sync_client(
            base, "unused", transport=GatewayTransport(sync_engine, key=key))),
            baseline="direct, sync SDK"),
        Leg("serve, sync SDK", _sync(sync_client(serve_url + "/v1", key)),
            baseline="direct, sync SDK", process_pid=serve_pid),
        Leg("direct, async SDK", _async(async_client(fake_url, FAKE_API_KEY))),
        Leg("transport, async SDK", _async(async_client(
            base, "unused", transport=GatewayTransport(async_engine, key=key))),
            baseline="direct, async SDK"),
    ]


async def measure(legs: Sequence[Leg], requests: int, round_size: int) -> None:
    for leg in legs:
        await leg.run(WARMUP_REQUESTS)
        leg.latencies.clear()
        leg.cpu_here = leg.cpu_there = 0.0
    done = 0
    while done < requests:
        size = min(round_size, requests - done)
        for leg in legs:
            await leg.run(size)
        done += size


def report(legs: Sequence[Leg], requests: int) -> str:
    by_name = {leg.name: leg for leg in legs}
    lines = [f"c=1, {requests} requests per leg, interleaved rounds; ms and us per request",
             f"{'leg':<22} {'p50/p90/p99 ms':>20} {'added p50/p90/p99 ms':>22} "
             f"{'CPU/req us here':>16} {'CPU/req us serve':>17}"]
    for leg in legs:
        figures = "/".join(f"{leg.ms(p):.2f}" for p in (50, 90, 99))
        added = "(floor)"
        if leg.baseline is not None:
            floor = by_name[leg.baseline]
            added = "/".join(f"{leg.ms(p) - floor.ms(p):.2f}" for p in (50, 90, 99))
        there = f"{leg.cpu_there / requests * 1e6:.0f}" if leg.process_pid else "-"
        lines.append(f"{leg.name:<22} {figures:>20} {added:>22} "
                     f"{leg.cpu_here / requests * 1e6:>16.0f} {there:>17}")
    return "\n".join(lines)


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.inprocess", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300, help="per leg (default 300)")
    parser.add_argument("--round", type=int, default=20, help="requests per leg per round")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    os.environ["ACCESS_LOG"] = "off"  # for serve (through its environment) and in process
    with tempfile.TemporaryDirectory(prefix="llmg-bench-inprocess-") as scratch:
        environment = start_environment(Path(scratch), target_cpus=None, load_cpus=None,
                                        stream_shapes=[])
        serve = None
        try:
            serve = start_serve(environment)
            settings = load_settings(environ=environment.gateway_env())
            sync_engine, async_engine = build_gateway(settings), build_gateway(settings)
            legs = make_legs(environment.fake_base_url,
                             f"http://{serve.endpoint.host}:{serve.endpoint.port}",
                             serve.process.pid if serve.process else 0,
                             environment.gateway_key, sync_engine, async_engine)

            async def run() -> None:
                try:
                    await measure(legs, args.requests, args.round)
                finally:
                    await async_engine.close()

            asyncio.run(run())
            stop_engine(sync_engine)
            print(report(legs, args.requests))
        finally:
            if serve is not None:
                serve.stop()
            environment.fake_process.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
