"""The engine's error paths answer like OpenAI and never lose a request.

Real servers and clients throughout: `serve` and the sidecar as processes where start-up
and the connection layer are what is tested, uvicorn in a thread (serve's ASGI app on a
real socket) where a backend is taken away under it: a spool directory replaced by a file,
a private Redis stopped, a key store that stops answering budget lookups, an engine part
that raises.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from llm_gateway.billing import spool as spool_module
from llm_gateway.billing.model import BudgetScope
from llm_gateway.billing.records import UsageRecord
from llm_gateway.config import FailurePolicy
from llm_gateway.exchange import Exchange
from llm_gateway.limits import MemoryRateLimiter
from llm_gateway.stores import StoreUnavailable, open_store
from llm_gateway.testing.records import RecordedUsage
from llm_gateway.wiring import build_gateway
from tests.billing_support import set_budget
from tests.conftest import make_settings
from tests.support import (
    BIN,
    REPO,
    create_key,
    free_port,
    gateway_process,
    private_redis,
    serve_in_thread,
    usage_records,
)

CHAT = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hello"}]}
REQUEST_ID = re.compile(r"^req_[0-9a-f]{24}$")
TRACE_ID = re.compile(r"^[0-9a-f]{32}$")


def chat(url: str, key: str, body: dict[str, Any] | None = None, **headers: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=body or CHAT, timeout=10,
                      headers={"authorization": f"Bearer {key}", **headers})


def assert_openai_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code"} and error["code"] == code
    assert REQUEST_ID.match(response.headers["x-request-id"])
    assert TRACE_ID.match(response.headers["x-trace-id"])
    return error  # type: ignore[no-any-return]


def metric(url: str, name: str) -> float | None:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


class Gateway:
    """serve's ASGI app in a thread, on a gateway built from these parts."""

    def __init__(self, settings: Any, **parts: Any) -> None:
        self.settings = settings
        self.gateway = build_gateway(settings, key_cache_seconds=3600, backoff_base=0.01,
                                     **parts)
        self.finished = RecordedUsage()
        self.gateway.add_record_sink(self.finished)

    def __enter__(self) -> Gateway:
        from llm_gateway.adapters.asgi import create_app

        self._context = serve_in_thread(create_app(self.settings, gateway=self.gateway))
        self.url = self._context.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._context.__exit__(None, None, None)

    def key(self, **options: Any) -> tuple[Any, str]:
        return create_key(self.settings.database_url, rate_limit_requests=1000, **options)


# ---- 1. the usage spool --------------------------------------------------------------------


@pytest.mark.parametrize("command", ["serve", "sidecar"])
def test_a_gateway_without_a_writable_spool_refuses_to_start_in_one_line(
    tmp_path: Path, fake_url: str, command: str,
) -> None:
    """A read-only root file system, a path through a file: the no-loss promise cannot be
    kept, so the process says so in one line and exits (serve's start-up failure, 3; the
    sidecar's setting error, 2) instead of answering 500 to every request."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    env = {"DATABASE_URL": f"sqlite:///{tmp_path / 'gateway.db'}",
           "VENICE_API_KEY": "sk-fake-upstream", "VENICE_BASE_URL": fake_url,
           "BIND_ADDR": f"127.0.0.1:{free_port()}", "ADMIN_BIND_ADDR": "off",
           "USAGE_SPOOL_DIR": str(blocker / "spool")}
    args = [command]
    if command == "sidecar":
        args += ["--mode", "reverse", "--listen", f"127.0.0.1:{free_port()}",
                 "--admin", f"127.0.0.1:{free_port()}", "--ca-dir", str(tmp_path / "ca")]
    result = subprocess.run([str(BIN / "llm-gateway"), *args], env={**os.environ, **env},
                            capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == (3 if command == "serve" else 2), output
    said = [line for line in output.splitlines() if "USAGE_SPOOL_DIR" in line]
    assert len(said) == 1 and "cannot be written" in said[0], output
    assert "Traceback" not in output


def test_a_spool_that_breaks_later_fails_no_request_and_loses_no_record(
    tmp_path: Path, fake_url: str, fake: Any, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A segment per line, and no pause between retries: the breakage shows at once.
    monkeypatch.setattr(spool_module, "ROTATE_SECONDS", 0.0)
    monkeypatch.setattr(spool_module, "RETRY_SECONDS", 0.0)
    caplog.set_level(logging.INFO, logger="llm_gateway")
    spool = tmp_path / "spool"
    settings = make_settings(tmp_path, fake_url, usage_spool_dir=str(spool))
    with Gateway(settings) as gw:
        key = gw.key()[1]
        ids = [chat(gw.url, key).headers["x-request-id"]]
        # Moved away in one step (the writer rotates segments meanwhile), then replaced.
        spool.rename(tmp_path / "spool-gone")
        for _ in range(50):  # the writer may make the directory again in between: once more
            try:
                spool.write_text("the disk went read-only")  # every new segment now fails
                break
            except IsADirectoryError:
                shutil.rmtree(spool, ignore_errors=True)
        shutil.rmtree(tmp_path / "spool-gone", ignore_errors=True)
        for _ in range(5):
            response = chat(gw.url, key)
            assert response.status_code == 200, response.text
            ids.append(response.headers["x-request-id"])
        failures = metric(gw.url, "llm_gateway_usage_spool_failures_total")
        assert failures is not None and failures >= 10  # each admission and each record
        spool.unlink()
        spool.mkdir()
        ids.append(chat(gw.url, key).headers["x-request-id"])
        gw.gateway.flush_from_thread()
        stored = usage_records(settings.database_url)
    assert sorted(record.request_id for record in stored) == sorted(ids)
    errors = [r for r in caplog.records if "cannot be written" in r.getMessage()]
    assert [r.levelname for r in errors] == ["ERROR"]  # once, not once per request
    assert any("can be written again" in r.getMessage() for r in caplog.records)


def test_compose_and_the_image_give_serve_a_spool_volume() -> None:
    """compose.yaml's serve (read-only root file system) keeps its spool on a named
    volume, and the image owns the mount point so that a new volume is the gateway's."""
    serve = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]["serve"]
    directory = serve["environment"]["USAGE_SPOOL_DIR"]
    assert serve["read_only"] is True
    assert f"spool:{directory}" in serve["volumes"]
    dockerfile = (REPO / "sidecar" / "Dockerfile").read_text()
    assert f"install -d -o 10001 -g 10001 -m 0700 {directory}" in dockerfile


# ---- 2. budgets when their backends are down ---------------------------------------------


def test_budget_counters_down_follow_the_rate_limit_failure_policy(
    tmp_path: Path, fake_url: str, fake: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis stopped under a key with a budget: fail-open admits (logged once, counted,
    /readyz degraded); fail-closed answers 503 with Retry-After, /readyz says unavailable
    and ready again once Redis is back, without a restart."""
    caplog.set_level(logging.WARNING, logger="llm_gateway")
    with private_redis(tmp_path) as redis:
        base = make_settings(tmp_path, fake_url, redis_url=redis.url)
        record, key = create_key(base.database_url, rate_limit_requests=1000)
        set_budget(base.database_url, BudgetScope.KEY, record.id, daily_tokens=1_000_000)
        closed = Gateway(
            dataclasses.replace(base, rate_limit_failure_policy=FailurePolicy.FAIL_CLOSED),
            limiter=MemoryRateLimiter())  # the limiter in process: only the budgets are away
        with Gateway(base) as open_gw, closed as closed_gw:
            for gw in (open_gw, closed_gw):
                assert chat(gw.url, key).status_code == 200
            redis.stop()

            for _ in range(3):
                assert chat(open_gw.url, key).status_code == 200
            readiness = httpx.get(open_gw.url + "/readyz")
            assert readiness.status_code == 200 and readiness.json()["status"] == "degraded"
            assert readiness.json()["checks"]["budget_ledger"]["state"] == "degraded"
            metrics = httpx.get(open_gw.url + "/metrics").text
            labels = '{backend="redis",component="budget_ledger"}'
            assert f"llm_gateway_backend_up{labels} 0.0" in metrics
            assert re.search(r'llm_gateway_backend_substitutions_total\{backend="redis",'
                             r'component="budget_ledger"\} [1-9]', metrics)

            refused = chat(closed_gw.url, key)
            error = assert_openai_error(refused, 503, "rate_limiter_unavailable")
            assert "budget" in error["message"] and refused.headers["retry-after"] == "1"
            readiness = httpx.get(closed_gw.url + "/readyz")
            assert readiness.status_code == 503
            assert readiness.json()["error"]["code"] == "rate_limiter_unavailable"

            redis.start()  # same port, empty
            assert httpx.get(closed_gw.url + "/readyz").json()["status"] == "ready"
            assert chat(closed_gw.url, key).status_code == 200
    said = [r.getMessage() for r in caplog.records
            if "budget_ledger backend redis" in r.getMessage()]
    assert sum("unavailable" in line for line in said) == 2, said  # one per gateway


class BudgetsStop:
    """The real store, except that budget lookups fail while ``stopped``, as a key store
    that went away makes them fail (keys stay cached)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.stopped = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def budget(self, scope: Any, scope_id: str) -> Any:
        if self.stopped:
            raise StoreUnavailable("stopped by the test")
        return await self.inner.budget(scope, scope_id)


@pytest.mark.parametrize("policy", [FailurePolicy.FAIL_CLOSED, FailurePolicy.FAIL_OPEN])
def test_budget_lookups_follow_the_key_store_failure_policy(
    tmp_path: Path, fake_url: str, fake: Any, policy: FailurePolicy,
) -> None:
    settings = make_settings(tmp_path, fake_url, auth_failure_policy=policy)
    store = BudgetsStop(open_store(settings.database_url))
    with Gateway(settings, store=store) as gw:
        record, key = gw.key()
        set_budget(settings.database_url, BudgetScope.KEY, record.id, max_output_tokens=40)
        assert chat(gw.url, key).status_code == 200
        store.stopped = True
        gw.gateway.refresh_from_thread()  # the budget is due to be read again
        response = chat(gw.url, key)
        outage = gw.gateway.auth.outage
        assert outage.is_down and outage.failures >= 1
        if policy is FailurePolicy.FAIL_CLOSED:
            assert_openai_error(response, 503, "key_store_unavailable")
            assert response.headers["retry-after"] == "1"
        else:
            # Served, and still held to the budget this process read last.
            assert response.status_code == 200
            assert fake.requests[-1].json["max_tokens"] == 40
            assert outage.substitutions >= 1


# ---- 3. the 429s of budgets carry OpenAI's token headers -----------------------------------


def test_budget_refusals_carry_token_headers_and_retry_after(
    tmp_path: Path, fake_url: str, fake: Any,
) -> None:
    settings = make_settings(tmp_path, fake_url)
    with Gateway(settings) as gw:
        tokens, tokens_key = gw.key(name="daily-tokens")
        set_budget(settings.database_url, BudgetScope.KEY, tokens.id, daily_tokens=300)
        per_minute, per_minute_key = gw.key(name="per-minute")
        set_budget(settings.database_url, BudgetScope.KEY, per_minute.id,
                   tokens_per_minute=300)
        body = {**CHAT, "max_tokens": 250}
        for key in (tokens_key, per_minute_key):
            assert chat(gw.url, key, body).status_code == 200

        over = chat(gw.url, tokens_key, body)
        assert_openai_error(over, 429, "insufficient_quota")
        assert over.headers["x-ratelimit-limit-tokens"] == "300"
        assert 0 <= int(over.headers["x-ratelimit-remaining-tokens"]) < 250
        assert re.fullmatch(r"(\d+h)?(\d+m)?\d+s", over.headers["x-ratelimit-reset-tokens"])
        now = datetime.now(UTC)
        to_midnight = 86400 - (now.hour * 3600 + now.minute * 60 + now.second)
        assert abs(int(over.headers["retry-after"]) - to_midnight) <= 5  # the day's window

        bucket = chat(gw.url, per_minute_key, body)
        assert_openai_error(bucket, 429, "rate_limit_exceeded")
        assert bucket.headers["x-ratelimit-limit-tokens"] == "300"
        assert int(bucket.headers["x-ratelimit-remaining-tokens"]) < 250
        assert bucket.headers["x-ratelimit-reset-tokens"].endswith("s")
        assert 1 <= int(bucket.headers["retry-after"]) <= 60  # when the bucket holds it again


# ---- 4. every answer names its request and trace -------------------------------------------


def raw_answer(port: int, data: bytes) -> tuple[int, dict[str, str]]:
    """Send ``data`` on a new connection; the status and headers of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    head = received.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    return int(head[0].split()[1]), dict(line.lower().split(": ", 1) for line in head[1:])


def test_answers_from_outside_the_engine_carry_request_and_trace_ids(
    tmp_path: Path, fake_url: str,
) -> None:
    """404 (the app), 413 (before the body is read), 408 and 431 (the connection layer) of
    a real `serve`: ids minted as the engine mints them (one sequence per process)."""
    port = free_port()
    env = {"DATABASE_URL": make_settings(tmp_path, fake_url).database_url,
           "VENICE_API_KEY": "sk-fake-upstream", "VENICE_BASE_URL": fake_url,
           "ADMIN_BIND_ADDR": "off", "USAGE_SPOOL_DIR": str(tmp_path / "spool"),
           "HEADER_READ_TIMEOUT_SECONDS": "0.3", "MAX_HEADER_BYTES": "4096",
           "REQUEST_BODY_LIMIT_BYTES": "1000", "ACCESS_LOG": "off"}
    with gateway_process(env, port=port) as url:
        engine = httpx.post(url + "/v1/chat/completions", json=CHAT)  # 401: the engine's own
        assert_openai_error(engine, 401, "invalid_api_key")
        process_tag = engine.headers["x-request-id"][:16]

        caller = "0af7651916cd43dd8448eb211c80319c"
        missing = httpx.get(url + "/no/such/path",
                            headers={"traceparent": f"00-{caller}-b7ad6b7169203331-01"})
        assert_openai_error(missing, 404, "not_found")
        assert missing.headers["x-trace-id"] == caller  # the caller's trace, as the engine's

        too_large = httpx.post(url + "/v1/chat/completions", content=b"x" * 2000,
                               headers={"content-type": "application/json"})
        assert_openai_error(too_large, 413, "request_too_large")

        seen = {engine.headers["x-request-id"], missing.headers["x-request-id"],
                too_large.headers["x-request-id"]}
        for data, status in ((b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", 408),
                             (b"GET /v1/models HTTP/1.1\r\nx-big: " + b"a" * 8000 + b"\r\n\r\n",
                              431)):
            answered, headers = raw_answer(port, data)
            assert answered == status
            assert REQUEST_ID.match(headers["x-request-id"])
            assert TRACE_ID.match(headers["x-trace-id"])
            seen.add(headers["x-request-id"])
        assert len(seen) == 5
        assert {request_id[:16] for request_id in seen} == {process_tag}


# ---- 5. an engine failure in serve: OpenAI's 500, and one usage record ---------------------


def test_an_engine_failure_is_an_openai_500_with_one_usage_record(
    tmp_path: Path, fake_url: str, fake: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = make_settings(tmp_path, fake_url)
    with Gateway(settings) as gw:
        key = gw.key()[1]
        engine = gw.gateway

        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a bug")

        # Admission fails: nothing admitted, so no record.
        with monkeypatch.context() as patch:
            patch.setattr(engine.router, "plan", lambda *a, **k: (_ for _ in ()).throw(
                RuntimeError("a bug")))
            refused = chat(gw.url, key)
        assert_openai_error(refused, 500, "gateway_error")

        # Sending fails before any answer: the 500, and the exchange's record.
        with monkeypatch.context() as patch:
            patch.setattr(engine.relay, "respond", broken)
            failed = chat(gw.url, key)
        assert_openai_error(failed, 500, "gateway_error")
        [record] = gw.finished.wait_for(1)
        assert record.request_id == failed.headers["x-request-id"]
        assert (record.status, record.error_code) == (500, "gateway_error")

        # It fails inside a stream: the status went out, an error event ends the stream.
        calls = 0
        real_on_frame = Exchange.on_frame

        def on_frame(self: Exchange, frame: bytes) -> bytes | None:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise RuntimeError("a bug")
            return real_on_frame(self, frame)

        with monkeypatch.context() as patch:
            patch.setattr(Exchange, "on_frame", on_frame)
            stream = chat(gw.url, key, {**CHAT, "stream": True})
        assert stream.status_code == 200
        events = [line for line in stream.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == "gateway_error"
        records = gw.finished.wait_for(2)
        assert (records[1].status, records[1].error_code) == (200, "gateway_error")
        gw.gateway.flush_from_thread()
        stored = usage_records(settings.database_url)
    assert sorted(r.request_id for r in stored) == sorted(r.request_id for r in records)


# ---- 6. retention, applied by the writer itself -------------------------------------------


def _record(request_id: str, days_ago: float) -> UsageRecord:
    return UsageRecord(request_id=request_id, key_id="k", subject_id="s", adapter="asgi",
                       endpoint="chat.completions", model="m", stream=False, status=200,
                       started_at=time.time() - days_ago * 86400, duration_ms=1.0)


def test_the_usage_writer_applies_retention_at_start(
    tmp_path: Path, fake_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """USAGE_RETENTION_DAYS on either store, with no command run: the records of the days
    before it go at start (and once a day), said in one log line."""
    caplog.set_level(logging.INFO, logger="llm_gateway")
    settings = make_settings(tmp_path, fake_url, usage_retention_days=30)

    async def seed() -> None:
        store = open_store(settings.database_url)
        try:
            await store.migrate()
            await store.write_usage([_record("old", 45), _record("recent", 2)])
        finally:
            await store.close()

    asyncio.run(seed())
    with Gateway(settings) as gw:
        deadline = time.monotonic() + 10
        while {r.request_id for r in usage_records(settings.database_url)} != {"recent"}:
            assert time.monotonic() < deadline, "retention did not run"
            time.sleep(0.05)
        key = gw.key()[1]
        for _ in range(3):
            assert chat(gw.url, key).status_code == 200
    said = [r.getMessage() for r in caplog.records if "usage retention" in r.getMessage()]
    assert len(said) == 1 and "dropped" in said[0], said



async def test_closing_the_writer_mid_batch_loses_no_record_to_the_database() -> None:
    """A graceful stop that comes while a batch is being written (the writer's own 50 ms
    pass) waits for that batch: cancelling it there left its records in the spool only,
    and a stopped process without them in the database."""
    from llm_gateway.billing.metering import UsageWriter

    written: list[str] = []
    writing = asyncio.Event()

    class SlowSink:
        async def write_usage(self, records: list[UsageRecord]) -> None:
            writing.set()
            await asyncio.sleep(0.2)
            written.extend(record.request_id for record in records)

    writer = UsageWriter(SlowSink(), interval=0.01)  # type: ignore[arg-type]
    writer.start()
    for n in range(3):
        writer.add(_record(f"req-{n}", 0))
    await asyncio.wait_for(writing.wait(), 5)  # the writer's pass is mid-batch now
    await writer.close()
    assert sorted(written) == ["req-0", "req-1", "req-2"]
