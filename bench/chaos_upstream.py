"""The bundled fake upstream, misbehaving at random: a share of its requests get an error
(429 with Retry-After, 500, 503), a stall before the headers, or a stream cut short. For
the chaos soak (bench/chaos.py), run in a process of its own:

    python -m bench.chaos_upstream --port 3002 --seed 1

The faults are the fake's own (``Fault``, pushed just before the request reaches the fake),
so they are exactly what the tests inject, drawn here with a seeded generator."""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from typing import Any

import uvicorn

from llm_gateway.testing.fake_faults import Fault
from llm_gateway.testing.fake_upstream import FakeUpstream

# Each fault's share of the requests (the rest are answered normally).
FAULT_SHARES: tuple[tuple[float, Fault], ...] = (
    (0.03, Fault(status=429, retry_after="1", message="Rate limited (injected)")),
    (0.03, Fault(status=500, message="Internal error (injected)")),
    (0.03, Fault(status=503, message="Overloaded (injected)")),
    (0.03, Fault(delay=2.0)),  # a stall the gateway waits out
    (0.01, Fault(delay=12.0)),  # a stall past REQUEST_TIMEOUT_SECONDS
    (0.03, Fault(cut_after_chunks=2)),  # a stream (or JSON body) cut short
)


def draw_fault(draw: float, shares: Sequence[tuple[float, Fault]] = FAULT_SHARES
               ) -> Fault | None:
    """The fault a request gets for ``draw`` (uniform in [0, 1)), or None."""
    edge = 0.0
    for share, fault in shares:
        edge += share
        if draw < edge:
            return fault
    return None


class FaultyUpstream:
    """ASGI: before each HTTP request, maybe one fault for it, then the fake answers."""

    def __init__(self, fake: FakeUpstream, seed: int) -> None:
        self.fake = fake
        self.random = random.Random(seed)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self.fake.api_prefix + "/"):
            fault = draw_fault(self.random.random())
            if fault is not None:
                # One event loop: nothing runs between this push and the fake taking it
                # but other requests' awaits, so the shares hold over a run.
                self.fake.push_fault(fault)  # times=1: for one request
        await self.fake(scope, receive, send)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos_upstream",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--chunk-delay", type=float, default=0.05,
                        help="seconds between stream chunks")
    arguments = parser.parse_args(argv)
    fake = FakeUpstream(record=False, ledger=False, chunk_delay=arguments.chunk_delay)
    uvicorn.run(FaultyUpstream(fake, arguments.seed), host="127.0.0.1", port=arguments.port,
                log_level="warning", access_log=False, timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
