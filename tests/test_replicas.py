"""Many replicas, one truth: real `llm-gateway serve` processes sharing Postgres and Redis.

Acceptance: exact shared limits over four processes (Redis, and Postgres without Redis),
a revocation on one replica enforced on every other within 5 s, and Redis going away
mid-test and coming back under each failure policy.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import redis

from llm_gateway.limits.redis import window_key
from llm_gateway.testing.fake_upstream import FakeUpstream
from tests.support import (
    BIN,
    POSTGRES_URL,
    REDIS_URL,
    SESSION_DATABASE,
    GatewayProcess,
    create_key,
    gateway_processes,
    need_service,
    postgres_reachable,
    private_redis,
    redis_reachable,
    roomy_window,
)

CHAT = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hello"}]}


@pytest.fixture(scope="module")
def shared_database(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One Postgres schema for every replica of this module (each key is new)."""
    need_service(f"PostgreSQL at {POSTGRES_URL}", postgres_reachable())
    return SESSION_DATABASE.schema_for(tmp_path_factory.mktemp("replicas"))


def replica_env(fake_url: str, database_url: str, redis_url: str | None,
                **extra: str) -> dict[str, str]:
    return {"DATABASE_URL": database_url, "REDIS_URL": redis_url or "",
            "VENICE_API_KEY": "sk-fake-upstream", "VENICE_BASE_URL": fake_url, **extra}


def server_now(backend: str, database_url: str) -> float:
    if backend == "redis":
        seconds, micros = redis.Redis.from_url(REDIS_URL).time()
        return seconds + micros / 1e6
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        return float(row[0])


def metric_value(replica: GatewayProcess, name: str, backend: str) -> float:
    labels = f'{{backend="{backend}",component="rate_limiter"}}'
    for line in httpx.get(replica.url + "/metrics").text.splitlines():
        if line.startswith(name + labels):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{labels} not in /metrics")


async def burst(urls: list[str], key: str, count: int) -> list[httpx.Response]:
    """``count`` requests at once, spread round-robin over the replicas."""
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        return await asyncio.gather(*(
            client.post(urls[i % len(urls)] + "/v1/chat/completions", json=CHAT,
                        headers={"authorization": f"Bearer {key}"})
            for i in range(count)
        ))


@pytest.mark.parametrize("backend", ["redis", "postgres"])
def test_four_replicas_admit_exactly_the_limit(
    backend: str, shared_database: str, fake_server: tuple[FakeUpstream, str]
) -> None:
    if backend == "redis":
        need_service(f"Redis at {REDIS_URL}", redis_reachable())
    redis_url = REDIS_URL if backend == "redis" else None
    window = roomy_window(server_now(backend, shared_database))
    _, key = create_key(shared_database, name=f"burst-{backend}",
                             rate_limit_requests=100, rate_limit_window_seconds=window)
    # The fixed window's form (retry after the window's end); the token bucket's, the
    # default, is tests/test_token_bucket.py's test_four_replicas_admit_exactly_the_burst.
    env = replica_env(fake_server[1], shared_database, redis_url,
                      RATE_LIMIT_ALGORITHM="fixed-window")
    with gateway_processes(env, 4) as replicas:
        for replica in replicas:  # each names the limiter it uses
            checks = httpx.get(replica.url + "/readyz").json()["checks"]
            assert checks["rate_limiter"] == {"backend": backend, "state": "ok"}
        started = time.monotonic()
        responses = asyncio.run(burst([r.url for r in replicas], key, 400))
        elapsed = time.monotonic() - started
        # Exactness holds while the shared limiter answers; a failed call hands the
        # decision to the in-process fallback (fail-open). Say so if that happened.
        failures = [metric_value(r, "llm_gateway_backend_failures_total", backend)
                    for r in replicas]
    statuses = collections.Counter(r.status_code for r in responses)
    assert statuses == {200: 100, 429: 300}, (statuses, f"limiter failures: {failures}")
    assert failures == [0.0] * 4
    for response in responses:
        if response.status_code == 429:
            assert 1 <= int(response.headers["retry-after"]) <= window
            assert response.headers["x-ratelimit-remaining-requests"] == "0"
            assert response.json()["error"]["code"] == "rate_limit_exceeded"
    remaining = sorted(int(r.headers["x-ratelimit-remaining-requests"])
                       for r in responses if r.status_code == 200)
    assert remaining == list(range(100))  # each admitted request had its own count
    print(f"{backend}: 400 requests over 4 replicas in {elapsed:.2f}s: {dict(statuses)}")


def test_revocation_on_one_replica_is_enforced_on_all_within_5_seconds(
    shared_database: str, fake_server: tuple[FakeUpstream, str]
) -> None:
    env = replica_env(fake_server[1], shared_database, None)
    with gateway_processes(env, 4) as replicas:
        created = subprocess.run(
            [str(BIN / "llm-gateway"), "keys", "create", "--name", "doomed", "--json"],
            capture_output=True, text=True, timeout=30, env={**os.environ, **env},
        )
        assert created.returncode == 0, created.stderr
        made = json.loads(created.stdout)
        headers = {"authorization": f"Bearer {made['key']}"}
        for replica in replicas:  # every replica has the key in its cache now
            assert httpx.get(replica.url + "/v1/models", headers=headers).status_code == 200
        revoked = subprocess.run(
            [str(BIN / "llm-gateway"), "keys", "revoke", made["prefix"]],
            capture_output=True, text=True, timeout=30, env={**os.environ, **env},
        )
        assert revoked.returncode == 0, revoked.stderr
        committed = time.monotonic()
        refused_after: dict[str, float] = {}
        while len(refused_after) < len(replicas) and time.monotonic() - committed < 10:
            for replica in replicas:
                if replica.url in refused_after:
                    continue
                response = httpx.get(replica.url + "/v1/models", headers=headers)
                if response.status_code == 401:
                    assert "revoked" in response.json()["error"]["message"]
                    refused_after[replica.url] = time.monotonic() - committed
            time.sleep(0.05)
    assert len(refused_after) == 4, refused_after
    slowest = max(refused_after.values())
    assert slowest < 5, refused_after
    print(f"revocation enforced on all 4 replicas after at most {slowest:.2f}s")


# ---- Redis goes away mid-test --------------------------------------------------------

def limiter_state(replica: GatewayProcess) -> tuple[int, dict]:
    response = httpx.get(replica.url + "/readyz", timeout=10)
    return response.status_code, response.json()


def post(replica: GatewayProcess, key: str) -> httpx.Response:
    return httpx.post(replica.url + "/v1/chat/completions", json=CHAT, timeout=10,
                      headers={"authorization": f"Bearer {key}"})


def wait_for(condition, timeout: float = 10) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, "condition not met in time"
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.fixture
def outage_replicas(
    tmp_path: Path, fake_server: tuple[FakeUpstream, str]
) -> Iterator[tuple[object, GatewayProcess, GatewayProcess, str, str]]:
    """A private Redis, and two replicas sharing it: one fail-open, one fail-closed (on
    fixed windows: the test reads the window's count in Redis)."""
    database_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    record, key = create_key(database_url, rate_limit_requests=1000,
                             rate_limit_window_seconds=3600)
    with private_redis(tmp_path) as server:
        base = replica_env(fake_server[1], database_url, server.url,
                           RATE_LIMIT_ALGORITHM="fixed-window")
        with gateway_processes({**base, "RATE_LIMIT_FAILURE_POLICY": "fail-open"}, 1) as (
            open_replica,
        ), gateway_processes({**base, "RATE_LIMIT_FAILURE_POLICY": "fail-closed"}, 1) as (
            closed_replica,
        ):
            yield server, open_replica, closed_replica, key, record.id


def test_redis_outage_follows_the_policy_and_recovers_without_restart(outage_replicas) -> None:  # type: ignore[no-untyped-def]
    server, open_replica, closed_replica, key, key_id = outage_replicas
    counter = window_key(key_id, 1000, 3600)
    for replica in (open_replica, closed_replica):
        assert post(replica, key).status_code == 200
        assert limiter_state(replica) == (200, {"status": "ready", "checks": {
            "key_store": {"backend": "sqlite", "state": "ok"},
            "rate_limiter": {"backend": "redis", "state": "ok"}},
            "targets": {"venice/*": "healthy"}})
    assert int(redis.Redis.from_url(server.url).hget(counter, "count")) == 2  # type: ignore[arg-type]

    server.stop()
    # fail-open: requests still pass, counted in process; /readyz says degraded (200,
    # so the replica stays in rotation); the metric says the backend is down.
    for _ in range(5):
        response = post(open_replica, key)
        assert response.status_code == 200
        assert response.headers["x-ratelimit-limit-requests"] == "1000"
    status, body = limiter_state(open_replica)
    assert status == 200 and body["status"] == "degraded"
    assert body["checks"]["rate_limiter"]["state"] == "degraded"
    assert body["checks"]["rate_limiter"]["policy"] == "fail-open"
    metrics = httpx.get(open_replica.url + "/metrics").text
    assert 'llm_gateway_backend_up{backend="redis",component="rate_limiter"} 0.0' in metrics
    assert ('llm_gateway_backend_substitutions_total{backend="redis",'
            'component="rate_limiter"} 5.0') in metrics
    # fail-closed: 503 with a clear error; /readyz 503.
    refused = post(closed_replica, key)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "rate_limiter_unavailable"
    status, body = limiter_state(closed_replica)
    assert status == 503 and body["status"] == "unavailable"
    assert body["error"]["code"] == "rate_limiter_unavailable"

    server.start()  # same port, empty: the script cache and the counters are gone
    for replica in (open_replica, closed_replica):
        recovered_in = wait_for(lambda r=replica: limiter_state(r)[1]["status"] == "ready")
        assert recovered_in < 5
        assert post(replica, key).status_code == 200
    assert int(redis.Redis.from_url(server.url).hget(counter, "count")) == 2  # type: ignore[arg-type]
    metrics = httpx.get(open_replica.url + "/metrics").text
    assert 'llm_gateway_backend_up{backend="redis",component="rate_limiter"} 1.0' in metrics

    # The outage was logged once (not once per request), and so was the recovery.
    output = "".join(open_replica.output)
    assert output.count("rate_limiter backend redis unavailable") == 1, output
    assert output.count("rate_limiter backend redis is back") == 1, output


def test_store_outage_fails_closed_for_keys_it_cannot_check(  # type: ignore[no-untyped-def]
    start_gateway, fake
) -> None:
    """Auth's default: once the cached lookup has expired, a dead store means 503."""
    gw = start_gateway()
    key = gw.key()
    assert post_url(gw.url, key).status_code == 200

    async def dead(prefix: str) -> None:
        from llm_gateway.stores import StoreUnavailable

        raise StoreUnavailable("test: the store is down")

    gw.gateway.store.key_by_prefix = dead  # type: ignore[method-assign]
    refused = post_url(gw.url, key)
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "key_store_unavailable"
    assert refused.headers["retry-after"] == "1"


def post_url(url: str, key: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=10,
                      headers={"authorization": f"Bearer {key}"})


def test_store_outage_fail_open_serves_only_keys_seen_before(  # type: ignore[no-untyped-def]
    start_gateway, fake
) -> None:
    from llm_gateway.config import FailurePolicy
    from llm_gateway.stores import StoreUnavailable

    gw = start_gateway(auth_failure_policy=FailurePolicy.FAIL_OPEN)
    known, unknown = gw.key(), gw.key()
    assert post_url(gw.url, known).status_code == 200
    real_lookup = gw.gateway.store.key_by_prefix

    async def dead(prefix: str) -> None:
        raise StoreUnavailable("test: the store is down")

    gw.gateway.store.key_by_prefix = dead  # type: ignore[method-assign]
    assert post_url(gw.url, known).status_code == 200  # looked up before the outage
    assert post_url(gw.url, unknown).status_code == 503  # never guessed
    assert gw.gateway.auth.outage.is_down and gw.gateway.auth.outage.substitutions == 1
    gw.gateway.store.key_by_prefix = real_lookup  # type: ignore[method-assign]
    assert post_url(gw.url, unknown).status_code == 200
    assert not gw.gateway.auth.outage.is_down


def test_suite_gateways_run_on_the_backends_ci_names(gw) -> None:  # type: ignore[no-untyped-def]
    """CI's second pass sets TEST_DATABASE_URL and TEST_REDIS_URL: make sure the suite's
    gateways really run on them, not quietly on the embedded defaults."""
    from tests.support import TEST_DATABASE_URL, TEST_REDIS_URL

    store_scheme = gw.database_url.split(":", 1)[0]
    assert store_scheme == ("postgresql" if TEST_DATABASE_URL else "sqlite")
    checks = httpx.get(gw.url + "/readyz").json()["checks"]
    assert checks["key_store"] == {"backend": "postgres" if TEST_DATABASE_URL else "sqlite",
                                   "state": "ok"}
    expected_limiter = ("redis" if TEST_REDIS_URL
                        else "postgres" if TEST_DATABASE_URL else "memory")
    assert checks["rate_limiter"] == {"backend": expected_limiter, "state": "ok"}
