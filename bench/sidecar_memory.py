"""Does the sidecar keep anything per request? Its RSS before and after many requests.

    .venv/bin/python -m bench.sidecar_memory [--requests 10000] [--concurrency 16]
                                             [--mode reverse|regular] [--stream-share 0.25]

Starts the fake upstream (in this process) and a real ``llm-gateway sidecar`` process,
warms the sidecar up, then sends ``--requests`` chat completions (a share of them
streamed) and prints the sidecar's resident memory along the way. Memory that grows with
the number of requests is a leak: mitmproxy flows, exchanges or records kept after a
request finished.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from llm_gateway.keys import new_key_record
from llm_gateway.stores import open_store
from llm_gateway.testing.fake_upstream import FakeUpstream, running_fake_upstream

BIN = Path(sys.executable).parent
CHAT = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hello"}]}
WARM_UP_REQUESTS = 500
REPORTS = 5  # RSS lines printed during the run


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def create_key(database_url: str) -> str:
    store = open_store(database_url)
    try:
        await store.migrate()
        record, key = new_key_record(name="bench", subject_id=None, now=time.time(),
                                     rate_limit_requests=1_000_000_000)
        await store.insert_key(record)
        return key
    finally:
        await store.close()


async def send(client: httpx.AsyncClient, base_url: str, key: str, count: int,
               concurrency: int, stream_share: float, offset: int) -> int:
    """Send ``count`` requests, ``concurrency`` at a time; returns how many failed."""
    failures = 0
    next_index = 0
    headers = {"authorization": f"Bearer {key}"}
    stream_every = round(1 / stream_share) if stream_share > 0 else 0

    async def worker() -> None:
        nonlocal failures, next_index
        while next_index < count:
            index = offset + next_index
            next_index += 1
            streamed = bool(stream_every) and index % stream_every == 0
            try:
                if streamed:
                    async with client.stream("POST", base_url + "/chat/completions",
                                             json={**CHAT, "stream": True},
                                             headers=headers) as response:
                        body = b"".join([chunk async for chunk in response.aiter_bytes()])
                        ok = response.status_code == 200 and b"[DONE]" in body
                else:
                    response = await client.post(base_url + "/chat/completions", json=CHAT,
                                                 headers=headers)
                    ok = response.status_code == 200
            except httpx.HTTPError:
                ok = False
            failures += not ok

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return failures


async def run(arguments: argparse.Namespace, workdir: Path, fake_url: str) -> None:
    database_url = f"sqlite:///{workdir / 'gateway.db'}"
    key = await create_key(database_url)
    port, admin_port = free_port(), free_port()
    bundle = workdir / "ca-bundle.pem"
    command = [str(BIN / "llm-gateway"), "sidecar", "--listen", f"127.0.0.1:{port}",
               "--admin", f"127.0.0.1:{admin_port}", "--mode", arguments.mode,
               "--ca-dir", str(workdir / "ca"), "--ca-bundle-out", str(bundle)]
    env = {**os.environ, "DATABASE_URL": database_url, "VENICE_API_KEY": "sk-fake-upstream",
           "VENICE_BASE_URL": fake_url}
    log = (workdir / "sidecar.log").open("wb")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        async with httpx.AsyncClient() as probe:
            for _ in range(400):
                try:
                    if (await probe.get(f"http://127.0.0.1:{admin_port}/readyz")).is_success:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError((workdir / "sidecar.log").read_text())
        limits = httpx.Limits(max_connections=arguments.concurrency,
                              max_keepalive_connections=arguments.concurrency)
        if arguments.mode == "reverse":
            client = httpx.AsyncClient(limits=limits, timeout=30)
            base_url = f"http://127.0.0.1:{port}/v1"
        else:
            client = httpx.AsyncClient(limits=limits, timeout=30,
                                       proxy=f"http://127.0.0.1:{port}",
                                       verify=ssl.create_default_context(cafile=str(bundle)))
            base_url = "https://api.venice.ai/api/v1"
        async with client:
            print(f"sidecar ({arguments.mode} mode), pid {process.pid}: "
                  f"RSS at start {rss_mib(process.pid):.1f} MiB")
            failures = await send(client, base_url, key, WARM_UP_REQUESTS,
                                  arguments.concurrency, arguments.stream_share, 0)
            before = rss_mib(process.pid)
            print(f"after {WARM_UP_REQUESTS} warm-up requests: RSS {before:.1f} MiB  (before)")
            started = time.monotonic()
            batch = max(1, arguments.requests // REPORTS)
            sent = 0
            while sent < arguments.requests:
                size = min(batch, arguments.requests - sent)
                failures += await send(client, base_url, key, size, arguments.concurrency,
                                       arguments.stream_share, WARM_UP_REQUESTS + sent)
                sent += size
                print(f"  +{sent:>6} requests: RSS {rss_mib(process.pid):.1f} MiB")
            elapsed = time.monotonic() - started
        await asyncio.sleep(1.0)  # let the usage writer flush its last batch
        after = rss_mib(process.pid)
        print(f"after {arguments.requests} requests: RSS {after:.1f} MiB  (after)")
        print(f"growth {after - before:+.1f} MiB; {arguments.requests / elapsed:.0f} req/s "
              f"at concurrency {arguments.concurrency}; {failures} failed")
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--mode", choices=("reverse", "regular"), default="reverse")
    parser.add_argument("--stream-share", type=float, default=0.25,
                        help="share of the requests that are streamed (default 0.25)")
    arguments = parser.parse_args()
    # Recording would keep every request in this process: the point is the sidecar's.
    with (tempfile.TemporaryDirectory(prefix="sidecar-memory-") as workdir,
          running_fake_upstream(FakeUpstream(record=False)) as (_, fake_url)):
        asyncio.run(run(arguments, Path(workdir), fake_url))


if __name__ == "__main__":
    main()
