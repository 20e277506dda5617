"""Every token and cent accounted for: usage rows equal what providers report, usage
chunks follow OpenAI's semantics whatever the provider does, budgets hold under
concurrency on shared state, prices in force at a request's start price it, and nothing
is lost when the database goes away or the process is killed."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llm_gateway.billing.model import MILLION, BudgetScope, Price
from llm_gateway.billing.quotas import _units_per_token, usd_units
from llm_gateway.stores import StoreUnavailable, open_store
from llm_gateway.wiring import build_gateway
from tests.billing_support import set_budget, set_price
from tests.conftest import make_settings
from tests.routing_support import CHAT, another_fake, provider, routed_gateway
from tests.support import (
    BIN,
    create_key,
    free_port,
    gateway_processes,
    serve_in_thread,
    usage_records,
    wait_until_up,
)


def frames(data: bytes) -> list[bytes]:
    return [frame + b"\n\n" for frame in data.split(b"\n\n") if frame]


def one_provider(base_url: str, profile: str) -> dict[str, Any]:
    return {"providers": {"p": provider(base_url, profile=profile)},
            "models": {"chat-fast": {"targets": [{"provider": "p", "model": "llama-3.3-70b"}]}}}


@pytest.mark.parametrize("kind", ["venice", "openai"])
@pytest.mark.parametrize("asks", [False, True], ids=["unasked", "asked"])
def test_stream_usage_is_metered_and_shown_only_when_asked(
    tmp_path: Path, monkeypatch, kind: str, asks: bool,  # type: ignore[no-untyped-def]
) -> None:
    with another_fake(usage_mode=kind) as (fake, url), routed_gateway(
        tmp_path, one_provider(url, kind), monkeypatch,
    ) as gw:
        body: dict[str, Any] = {**CHAT, "stream": True}
        if asks:
            body["stream_options"] = {"include_usage": True}
        response = gw.chat(gw.key(), body)
        assert response.status_code == 200
        [sent] = fake.requests
        if kind == "openai":  # the gateway asked for usage, whatever the client did
            assert sent.json["stream_options"] == {"include_usage": True}
        upstream = frames(bytes(sent.sent))
        usage_frames = [f for f in upstream if b'"choices":[]' in f and b'"usage"' in f]
        assert len(usage_frames) == 1
        expected = upstream if asks else [f for f in upstream if f not in usage_frames]
        assert frames(response.content) == expected  # every other frame byte for byte
        reported = json.loads(usage_frames[0].removeprefix(b"data: "))["usage"]
        [record] = gw.finished.wait_for(1)
        assert (record.prompt_tokens, record.completion_tokens, record.total_tokens) == (
            reported["prompt_tokens"], reported["completion_tokens"], reported["total_tokens"])
        assert not record.tokens_estimated
        if kind == "venice":
            assert record.provider_cost_usd == Decimal(str(reported["cost"]["usd"]))


@pytest.mark.parametrize("kind", ["venice", "openai"])
def test_json_usage_is_metered(tmp_path: Path, monkeypatch, kind: str) -> None:  # type: ignore[no-untyped-def]
    with another_fake(usage_mode=kind) as (_, url), routed_gateway(
        tmp_path, one_provider(url, kind), monkeypatch,
    ) as gw:
        response = gw.chat(gw.key())
        reported = response.json()["usage"]
        [record] = gw.finished.wait_for(1)
        assert (record.prompt_tokens, record.completion_tokens) == (
            reported["prompt_tokens"], reported["completion_tokens"])
        assert (record.model, record.provider, record.upstream_model) == (
            "chat-fast", "p", "llama-3.3-70b")


def test_a_client_that_leaves_mid_stream_leaves_one_row_with_what_it_got(
    tmp_path: Path, fake_url: str, monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    with routed_gateway(tmp_path, one_provider(fake_url, "venice"), monkeypatch) as gw:
        key = gw.key()
        request = json.dumps({**CHAT, "stream": True}).encode()
        host, port = gw.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                b"content-type: application/json\r\n"
                + f"authorization: Bearer {key}\r\ncontent-length: {len(request)}\r\n".encode()
                + b"x-fake-chunks: 40\r\nx-fake-chunk-delay-ms: 50\r\n\r\n" + request
            )
            received = b""
            while received.count(b"chunk") < 3:
                received += sock.recv(65536)
        [record] = gw.finished.wait_for(1)
        assert (record.status, record.error_code) == (499, "client_disconnected")
        assert record.tokens_estimated and record.completion_tokens > 0
        gw.gateway.flush_from_thread()
        assert len(usage_records(gw.database_url)) == 1


class StoppableStore:
    """The real store, except that it does not answer while stopped: writes and pings
    fail as a database that went away makes them fail."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.stopped = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def write_usage(self, records: list[Any]) -> None:
        if self.stopped:
            raise StoreUnavailable("stopped by the test")
        await self.inner.write_usage(records)

    async def ping(self) -> None:
        if self.stopped:
            raise StoreUnavailable("stopped by the test")
        await self.inner.ping()


def test_a_burst_while_the_store_is_down_loses_nothing(
    tmp_path: Path, fake_url: str,
) -> None:
    settings = make_settings(tmp_path, fake_url, usage_spool_dir=str(tmp_path / "spool"))
    store = StoppableStore(open_store(settings.database_url))
    gateway = build_gateway(settings, store=store, key_cache_seconds=3600)  # type: ignore[arg-type]
    key = create_key(settings.database_url, rate_limit_requests=1000)[1]
    body = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hi"}]}
    with serve_in_thread(create_app_for(settings, gateway)) as url, httpx.Client() as client:
        def send() -> str:
            response = client.post(url + "/v1/chat/completions", json=body,
                                   headers={"authorization": f"Bearer {key}"})
            assert response.status_code == 200
            return response.headers["x-request-id"]

        ids = [send() for _ in range(20)]
        store.stopped = True
        ids += [send() for _ in range(160)]
        time.sleep(0.3)  # the writer tried, failed, and kept them
        store.stopped = False
        ids += [send() for _ in range(20)]
        gateway.flush_from_thread()
        rows = usage_records(settings.database_url)
    assert len(ids) == 200 and sorted(r.request_id for r in rows) == sorted(ids)


def create_app_for(settings: Any, gateway: Any) -> Any:
    from llm_gateway.adapters.asgi import create_app

    return create_app(settings, gateway=gateway)


def test_serve_killed_with_records_queued_loses_none(tmp_path: Path, fake_url: str) -> None:
    settings = make_settings(tmp_path, fake_url)
    key = create_key(settings.database_url, rate_limit_requests=100_000)[1]
    port = free_port()
    env = {**os.environ, "DATABASE_URL": settings.database_url,
           "VENICE_API_KEY": "sk-fake-upstream", "VENICE_BASE_URL": fake_url,
           "BIND_ADDR": f"127.0.0.1:{port}", "ADMIN_BIND_ADDR": "off",
           "USAGE_SPOOL_DIR": str(tmp_path / "spool")}
    env.pop("REDIS_URL", None)
    url = f"http://127.0.0.1:{port}"

    def start() -> subprocess.Popen[bytes]:
        process = subprocess.Popen([str(BIN / "llm-gateway"), "serve"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until_up(url + "/healthz")
        return process

    process = start()
    answered: list[str] = []
    body = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hi"}]}

    def hammer(_: int) -> None:
        with httpx.Client(timeout=5) as client:
            for _ in range(200):
                try:
                    response = client.post(url + "/v1/chat/completions", json=body,
                                           headers={"authorization": f"Bearer {key}"})
                except httpx.TransportError:
                    return
                if response.status_code == 200:
                    answered.append(response.headers["x-request-id"])

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(hammer, n) for n in range(8)]
        while len(answered) < 300:
            time.sleep(0.01)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        for future in futures:
            future.result()
    restarted = start()  # replays what the killed one left in the spool
    try:
        deadline = time.monotonic() + 10
        while True:
            rows = usage_records(settings.database_url)
            missing = set(answered) - {row.request_id for row in rows}
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        restarted.terminate()
        restarted.wait(10)
    assert not missing, f"{len(missing)} of {len(answered)} answered requests have no row"
    ids = [row.request_id for row in rows]
    assert len(ids) == len(set(ids))  # none twice


@pytest.mark.parametrize("backend", ["redis", "postgres"])
def test_four_replicas_hold_one_budget(  # type: ignore[no-untyped-def]
    tmp_path: Path, fake_url: str, postgres_url: str, redis_url: str, backend: str,
) -> None:
    set_price(postgres_url, "venice", "llama-3.3-70b", "10", "10")  # 1e-5 USD a token
    record, key = create_key(postgres_url, rate_limit_requests=100_000)
    # 100 max_tokens plus a short prompt: about 1.06e-3 USD reserved each; 10 fit.
    budget = Decimal("0.0106")
    set_budget(postgres_url, BudgetScope.KEY, record.id, daily_usd=budget)
    env = {"DATABASE_URL": postgres_url, "VENICE_API_KEY": "sk-fake-upstream",
           "VENICE_BASE_URL": fake_url, "ADMIN_BIND_ADDR": "off",
           "USAGE_SPOOL_DIR": str(tmp_path / "spool"),
           "REDIS_URL": redis_url if backend == "redis" else "",
           "REDIS_NAMESPACE": f"budget-{os.getpid()}-{time.monotonic_ns()}"}
    body = {**CHAT, "model": "llama-3.3-70b", "max_tokens": 100}
    with gateway_processes(env, 4) as replicas:
        def one(index: int) -> httpx.Response:
            return httpx.post(replicas[index % 4].url + "/v1/chat/completions", json=body,
                              headers={"authorization": f"Bearer {key}"}, timeout=20)

        with concurrent.futures.ThreadPoolExecutor(100) as pool:
            responses = list(pool.map(one, range(100)))
        served = [r for r in responses if r.status_code == 200]
        refused = [r for r in responses if r.status_code != 200]
        assert len(served) >= 10
        assert {(r.status_code, r.json()["error"]["code"]) for r in refused} == {
            (429, "insufficient_quota")}
        sdk = openai.OpenAI(base_url=replicas[0].url + "/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.RateLimitError) as raised:
            for _ in range(20):  # the budget is spent by now, or soon is
                sdk.chat.completions.create(**body)
        assert raised.value.code == "insufficient_quota"
    rows = usage_records(postgres_url)
    spent = sum((row.cost_usd or Decimal(0)) for row in rows)
    assert 0 < spent <= budget


def test_a_price_change_prices_requests_before_and_after_it_differently(
    tmp_path: Path, fake_url: str, monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    routes = one_provider(fake_url, "venice")
    # Far enough ahead that the first request starts before it on a loaded machine too
    # (1.5 s once was not: both requests were priced after the change).
    change_at = time.time() + 4
    with routed_gateway(tmp_path, routes, monkeypatch) as gw:
        set_price(gw.database_url, "p", "llama-3.3-70b", "1", "2")
        set_price(gw.database_url, "p", "llama-3.3-70b", "10", "20", effective_from=change_at)
        gw.gateway.refresh_from_thread()  # or wait for the 5 s refresh
        key = gw.key()
        assert gw.chat(key).status_code == 200
        time.sleep(max(0.0, change_at - time.time()) + 0.05)
        assert gw.chat(key).status_code == 200
        before, after = gw.finished.wait_for(2)
    assert before.started_at < change_at <= after.started_at
    assert before.cost_usd is not None and after.cost_usd is not None
    assert after.cost_usd == before.cost_usd * 10  # the same tokens, ten times the price


def test_cached_prompt_tokens_are_priced_at_the_cached_input_price(
    tmp_path: Path, monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    """OpenAI's usage.prompt_tokens_details.cached_tokens reaches the record (JSON and
    stream) and is priced at cached_input, the rest of the prompt at input: exactly."""
    prompt = "one two three four five six seven eight nine ten"  # the fake: 10 tokens
    body = {**CHAT, "messages": [{"role": "user", "content": prompt}]}
    with another_fake(usage_mode="openai") as (_, url), routed_gateway(
        tmp_path, one_provider(url, "openai"), monkeypatch,
    ) as gw:
        set_price(gw.database_url, "p", "llama-3.3-70b", "2.50", "10", cached_input_usd="1.25")
        gw.gateway.refresh_from_thread()
        key = gw.key()
        cached = {"x-fake-cached-tokens": "6"}
        answered = gw.chat(key, body, **cached)
        assert answered.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 6}
        assert gw.chat(key, {**body, "stream": True}, **cached).status_code == 200
        assert gw.chat(key, body).status_code == 200  # nothing cached: all at the input price
        records = sorted(gw.finished.wait_for(3), key=lambda record: record.started_at)
        gw.gateway.flush_from_thread()
        stored = {row.request_id: row for row in usage_records(gw.database_url)}
    # 4 prompt tokens at 2.50, 6 at 1.25 and 64 completion tokens at 10, per million.
    with_cache = Decimal("0.0006575")
    without = Decimal("0.000665")
    assert [(r.prompt_tokens, r.cache_read_tokens, r.completion_tokens) for r in records] == [
        (10, 6, 64), (10, 6, 64), (10, 0, 64)]
    assert [r.cost_usd for r in records] == [with_cache, with_cache, without]
    assert [(stored[r.request_id].cache_read_tokens, stored[r.request_id].cost_usd)
            for r in records] == [(6, with_cache), (6, with_cache), (0, without)]


@pytest.mark.parametrize(("input_price", "output_price", "whole"), [
    ("0.70", "2.80", True), ("0.15", "0.60", True), ("0.0001", "3", True),
    ("0.00001", "2.5", False), ("1.23456", "7", False), ("0", "0", True)])
def test_reservations_are_priced_in_integers_exactly_as_in_decimal(
        input_price: str, output_price: str, whole: bool) -> None:
    """The integer fast path of a reservation's price equals the Decimal computation, and is
    taken only where it is exact (per-token prices that are whole 1e-10 USD)."""
    price = Price("p", "m", Decimal(input_price), Decimal(output_price), 0.0)
    per_token = _units_per_token(price)
    assert (per_token is not None) is whole
    for prompt, cap in [(0, 1), (1, 1), (12_345, 4_096), (999_999, 131_072), (7, 3)]:
        exact = usd_units((prompt * price.input_per_mtok + cap * price.output_per_mtok)
                          / MILLION)
        if per_token is not None:
            assert prompt * per_token[0] + cap * per_token[1] == exact
