"""The budget holes a key holder could use: ``n`` choices were reserved and capped as one
(``"n": 64, "max_tokens": 100`` spent $6.41 of a $1 budget in one request), and a
SIGKILLed gateway left its in-flight requests' reservations held until their window ended
(84 % of a day's budget in the probe), their replayed records carrying no tokens although
they had streamed to the client. Both failed on the tree before."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from llm_gateway.billing.model import BudgetScope
from llm_gateway.testing.fake_upstream import FakeUpstream
from tests.billing_support import set_budget, set_price
from tests.support import BIN, create_key, free_port, usage_records, wait_until_up
from tests.surfaces import SURFACES, Surface, local_surface, wait_until

# Each sets up its own backends: one pass of the suite runs it (.ci/run).
pytestmark = pytest.mark.slow_once

# $1 000 per million output tokens: a token is a tenth of a cent, a budget of $1 pays 1 000.
PRICE = ("0", "1000")


@pytest.fixture(params=SURFACES)
def on(request: pytest.FixtureRequest, tmp_path: Path, fake_url: str,
       fake: FakeUpstream) -> Iterator[Surface]:
    with local_surface(request.param, tmp_path, fake_url) as it:
        yield it


def test_n_choices_are_reserved_and_clamped_as_a_whole(on: Surface, fake: FakeUpstream) -> None:
    record, key = create_key(on.database_url, rate_limit_requests=1000)
    set_budget(on.database_url, BudgetScope.KEY, record.id, daily_usd=Decimal("1"))
    set_price(on.database_url, "venice", "llama-3.3-70b", *PRICE)
    on.gateway.refresh_from_thread()
    body = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "hi"}],
            "n": 64, "max_tokens": 100}
    answer = on.send("/chat/completions", json.dumps(body).encode(),
                     {"authorization": f"Bearer {key}"})
    assert answer.status == 200, answer.body[:300]
    # 1 000 tokens for 64 choices: 15 each, at most.
    assert answer.header("x-llm-gateway-max-tokens-clamped") == "15"
    [seen] = fake.requests
    assert json.loads(seen.body)["max_tokens"] == 15
    completion = json.loads(answer.body)
    assert len(completion["choices"]) == 64
    assert completion["usage"]["completion_tokens"] <= 1000
    on.gateway.flush_from_thread()
    [row] = usage_records(on.database_url)
    assert row.cost_usd is not None and row.cost_usd <= Decimal("1")


@pytest.mark.parametrize("n", [0, 129, "2", True, 1.5])
def test_a_bad_n_is_refused(on: Surface, fake: FakeUpstream, n: object) -> None:
    key = create_key(on.database_url)[1]
    body = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "hi"}], "n": n}
    answer = on.send("/chat/completions", json.dumps(body).encode(),
                     {"authorization": f"Bearer {key}"})
    assert answer.status == 400
    assert "'n'" in json.loads(answer.body)["error"]["message"]
    assert fake.requests == []


# ---- SIGKILL -------------------------------------------------------------------------


def counters(backend: str, url: str, namespace: str) -> dict[str, tuple[int, int]]:
    """The ledger's counters as (spent, reserved), read straight from its backend."""
    if backend == "redis":
        import redis

        client = redis.Redis.from_url(url)
        try:
            found = {}
            for name in client.scan_iter(f"{namespace}:{{budgets}}:tok:*"):
                state = client.hgetall(name)
                found[name.decode()] = (int(state.get(b"spent", 0)),
                                        int(state.get(b"reserved", 0)))
            return found
        finally:
            client.close()
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT name, spent, reserved FROM quota_counters "
                            "WHERE name LIKE 'tok:%'").fetchall()
    return {name: (int(spent), int(reserved)) for name, spent, reserved in rows}


@pytest.mark.parametrize("backend", ["redis", "postgres"])
def test_a_killed_gateway_leaves_nothing_reserved_and_its_streams_metered(
    backend: str, tmp_path: Path, fake_url: str, request: pytest.FixtureRequest,
) -> None:
    namespace = f"kill-{os.getpid()}-{time.monotonic_ns()}"
    if backend == "redis":
        ledger_url = request.getfixturevalue("redis_url")
        database_url = f"sqlite:///{tmp_path / 'gateway.db'}"
        env_backend = {"REDIS_URL": ledger_url, "REDIS_NAMESPACE": namespace}
    else:
        database_url = ledger_url = request.getfixturevalue("postgres_url")
        env_backend = {}
    record, key = create_key(database_url, rate_limit_requests=10_000)
    set_budget(database_url, BudgetScope.KEY, record.id, daily_tokens=1_000_000)
    set_price(database_url, "venice", "llama-3.3-70b", "1", "2")
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if k != "REDIS_URL"},
           "DATABASE_URL": database_url, "VENICE_API_KEY": "sk-fake-upstream",
           "VENICE_BASE_URL": fake_url, "BIND_ADDR": f"127.0.0.1:{port}",
           "ADMIN_BIND_ADDR": "off", "USAGE_SPOOL_DIR": str(tmp_path / "spool"),
           "LIMIT_LEASE_SECONDS": "0", **env_backend}
    url = f"http://127.0.0.1:{port}"

    def start() -> subprocess.Popen[bytes]:
        process = subprocess.Popen([str(BIN / "llm-gateway"), "serve"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until_up(url + "/healthz")
        return process

    process = start()
    body = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Tell me"}],
            "stream": True, "max_tokens": 4000}
    streams, readers, seen_text = [], [], []
    client = httpx.Client(timeout=30)
    try:
        for _ in range(4):  # streams in flight, each some way in when the kill comes
            stream = client.stream(
                "POST", url + "/v1/chat/completions", json=body,
                headers={"authorization": f"Bearer {key}", "x-fake-chunks": "200",
                         "x-fake-chunk-delay-ms": "100"})
            response = stream.__enter__()
            streams.append((stream, response))
        time.sleep(2.5)  # two and a half seconds of chunks, at least one progress line each
        for _, response in streams:
            lines = response.iter_lines()
            readers.append(lines)  # a reader let go of closes its stream
            text = ""
            for _ in range(5):
                line = next(lines)
                if line.startswith("data: {"):
                    text += "".join(choice["delta"].get("content") or ""
                                    for choice in json.loads(line[6:])["choices"])
            seen_text.append(text)
        held = counters(backend, ledger_url, namespace)
        assert held and all(reserved > 0 for _, reserved in held.values())
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    finally:
        for stream, _ in streams:
            with contextlib.suppress(httpx.HTTPError):
                stream.__exit__(None, None, None)
        client.close()
    restarted = start()  # replays the spool: settles what the killed one held
    try:
        wait_until(lambda: all(reserved == 0 for _, reserved in
                               counters(backend, ledger_url, namespace).values()), 10)
        wait_until(lambda: len(usage_records(database_url)) == 4, 10)
    finally:
        restarted.terminate()
        restarted.wait(10)
    rows = usage_records(database_url)
    assert {row.error_code for row in rows} == {"gateway_interrupted"}
    for row in rows:
        # Two and a half seconds of a chunk every 100 ms: well past the first progress line.
        assert row.tokens_estimated and row.completion_tokens > 5
        assert row.provider == "venice" and row.upstream_model == "llama-3.3-70b"
        assert row.cost_usd is not None and row.cost_usd > 0
    spent = sum(spent for spent, _ in counters(backend, ledger_url, namespace).values())
    # Each day and month counter booked what the rows say, once.
    per_counter = {spent for spent, _ in counters(backend, ledger_url, namespace).values()}
    assert per_counter == {sum(row.total_tokens for row in rows)}
    assert spent > 0
