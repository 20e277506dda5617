"""The in-process phase of ``python -m bench.run``: the openai SDK through
``llm_gateway.httpx.GatewayTransport`` against the SDK straight to the upstream, and through a
`serve` process (its hop), at concurrency 1, in one child process of the harness.

    python -m bench.inprocess_phase --fake-url URL --serve-url URL --serve-pid PID --key KEY
                                    [--model chat-fast] [--requests 300] [--round 20]

The measurement is ``bench.inprocess``'s (its ``Leg`` and ``measure``: interleaved rounds, the
leg's latency per request, this process's CPU per leg and, for `serve`, its process's CPU from
/proc); this module only names the alias the run measures (``--model``) on the gateway legs and
prints the figures as one JSON line. The engine is configured from the environment exactly as
`serve`'s is (the harness passes the same settings file, database and ``ACCESS_LOG``).
It runs in a child process so that the harness's own process never hosts an engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx
import openai

from bench.inprocess import WARMUP_REQUESTS, Leg, measure
from bench.targets import FAKE_API_KEY, FAST_MODEL
from llm_gateway.adapters.inprocess import stop_engine
from llm_gateway.config import load_settings
from llm_gateway.httpx import BASE_HOST, GatewayTransport
from llm_gateway.wiring import build_gateway

MESSAGES = [{"role": "user", "content": "Say hello."}]


def _sync(client: openai.OpenAI, model: str) -> Callable[[], Awaitable[Any]]:
    async def call() -> Any:
        # Blocking on purpose: the sync SDK as an application calls it.
        return client.chat.completions.create(model=model, messages=MESSAGES,  # type: ignore[arg-type]
                                              max_tokens=64)

    return call


def _async(client: openai.AsyncOpenAI, model: str) -> Callable[[], Awaitable[Any]]:
    async def call() -> Any:
        return await client.chat.completions.create(model=model, messages=MESSAGES,  # type: ignore[arg-type]
                                                    max_tokens=64)

    return call


def make_legs(args: argparse.Namespace, sync_engine: Any, async_engine: Any) -> list[Leg]:
    base = BASE_HOST + "/v1"

    def sync_client(url: str, api_key: str, **http: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=url, api_key=api_key, max_retries=0,
                             http_client=httpx.Client(**http))

    def async_client(url: str, api_key: str, **http: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=url, api_key=api_key, max_retries=0,
                                  http_client=httpx.AsyncClient(**http))

    return [
        Leg("direct, sync SDK", _sync(sync_client(args.fake_url, FAKE_API_KEY), FAST_MODEL)),
        Leg("transport, sync SDK", _sync(sync_client(
            base, "unused", transport=GatewayTransport(sync_engine, key=args.key)), args.model),
            baseline="direct, sync SDK"),
        Leg("serve, sync SDK", _sync(sync_client(args.serve_url + "/v1", args.key), args.model),
            baseline="direct, sync SDK", process_pid=args.serve_pid),
        Leg("direct, async SDK", _async(async_client(args.fake_url, FAKE_API_KEY), FAST_MODEL)),
        Leg("transport, async SDK", _async(async_client(
            base, "unused", transport=GatewayTransport(async_engine, key=args.key)),
            args.model), baseline="direct, async SDK"),
    ]


def figures(legs: Sequence[Leg], requests: int) -> dict[str, Any]:
    by_name = {leg.name: leg for leg in legs}
    out: dict[str, Any] = {"requests_per_leg": requests, "warmup_per_leg": WARMUP_REQUESTS,
                           "legs": {}}
    for leg in legs:
        entry: dict[str, Any] = {
            "ms": {f"p{p}": round(leg.ms(p), 4) for p in (50, 90, 99)},
            "cpu_here_us": round(leg.cpu_here / requests * 1e6, 1),
        }
        if leg.process_pid:
            entry["cpu_serve_us"] = round(leg.cpu_there / requests * 1e6, 1)
        if leg.baseline is not None:
            floor = by_name[leg.baseline]
            entry["baseline"] = leg.baseline
            entry["added_ms"] = {f"p{p}": round(leg.ms(p) - floor.ms(p), 4) for p in (50, 90, 99)}
            # What the path costs over the direct call: this process's CPU beyond the direct
            # leg's, plus the serve process's own.
            entry["added_cpu_us"] = round(
                (leg.cpu_here - floor.cpu_here + leg.cpu_there) / requests * 1e6, 1)
        out["legs"][leg.name] = entry
    return out


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.inprocess_phase", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fake-url", required=True, help="the upstream's API root")
    parser.add_argument("--serve-url", required=True, help="a running serve, without /v1")
    parser.add_argument("--serve-pid", type=int, required=True)
    parser.add_argument("--key", required=True, help="the gateway key")
    parser.add_argument("--model", default="chat-fast", help="what the gateway legs name")
    parser.add_argument("--requests", type=int, default=300, help="per leg")
    parser.add_argument("--round", type=int, default=20, help="requests per leg per round")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    settings = load_settings()
    sync_engine, async_engine = build_gateway(settings), build_gateway(settings)
    legs = make_legs(args, sync_engine, async_engine)

    async def run() -> None:
        try:
            await measure(legs, args.requests, args.round)
        finally:
            await async_engine.close()

    try:
        asyncio.run(run())
    finally:
        stop_engine(sync_engine)
    print(json.dumps(figures(legs, args.requests)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
