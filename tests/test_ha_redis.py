"""Redis Sentinel and Redis Cluster under load, with the primary that holds a key's counters
killed mid-run: a gateway (in process, on REDIS_URL=redis+sentinel://… or
redis+cluster://…, fail-closed) keeps its limits exact within the documented bound, never
spends a budget past its limit, and has a record for every request it admitted.

The bound (docs: ha-stores): a write Redis acknowledged but had not yet sent to the replica
when the primary died is lost with it. Redis writes a script's effects to its replicas in
the same event-loop pass as its reply, so at most the calls of that last pass, which the
requests in flight bound: a limit may admit up to ``CONCURRENCY`` more than it says, and
the counts on the new primary may miss as many. Most runs lose nothing.

Servers of the test's own (tests/ha_servers.py); each test takes ~5-15 s.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import ResponseError

from llm_gateway.billing.model import BudgetScope
from llm_gateway.config import FailurePolicy, RateLimitAlgorithm
from llm_gateway.limits.redis import window_key
from llm_gateway.redis_scripts import RedisScripts, Script
from llm_gateway.redis_scripts.cluster import REFRESH_SECONDS
from tests.billing_support import set_budget, set_price
from tests.ha_servers import redis_cluster, sentinel_set, wait_for
from tests.support import closed_port, roomy_window, usage_records

pytestmark = pytest.mark.slow_once

INCR = Script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
CHAT = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 20}
BEFORE, AFTER = 120, 200  # requests before the kill, and after the gateway is back
CONCURRENCY = 8
PACE_SECONDS = 0.06  # each of the CONCURRENCY callers waits this long between requests
LIMIT = 120  # the limited key's requests per window (it asks for more)
BUDGET_USD = Decimal("0.016")  # the budgeted key's day: 100 requests (it asks for more)


async def load(url: str, keys: list[str], fail: Callable[[], None]) -> list[httpx.Response]:
    """Requests CONCURRENCY at a time and paced, alternating between ``keys``: BEFORE,
    then ``fail`` (in a thread: it kills a server and waits for the failover) while the
    others go on, then AFTER once the gateway answers again (the failure policy's retry
    comes within a second)."""
    answered: list[httpx.Response] = []
    failed_over = threading.Event()
    after: list[int] = []
    sent = itertools.count()

    async def worker(client: httpx.AsyncClient) -> None:
        while len(after) < AFTER:
            n = next(sent)
            response = await client.post(
                url + "/v1/chat/completions", json=CHAT,
                headers={"authorization": f"Bearer {keys[n % len(keys)]}"})
            answered.append(response)
            if failed_over.is_set() and (after or response.status_code != 503):
                after.append(n)
            if len(answered) == BEFORE:
                await asyncio.to_thread(fail)
                failed_over.set()
            await asyncio.sleep(PACE_SECONDS)

    async with httpx.AsyncClient(timeout=30) as client:
        await asyncio.gather(*(worker(client) for _ in range(CONCURRENCY)))
    return answered


def failover_under_load(start_gateway, redis_url: str, fail: Callable[[str], None],  # type: ignore[no-untyped-def]
                        counted: Callable[[str], int]) -> None:
    """The run and its checks; ``fail(counter)`` kills the primary (of the limited key's
    counter), ``counted(counter)`` reads it from where the data is after the failover."""
    gw = start_gateway(redis_url=redis_url, rate_limit_failure_policy=FailurePolicy.FAIL_CLOSED,
                       rate_limit_algorithm=RateLimitAlgorithm.FIXED_WINDOW,
                       limit_lease_seconds=0)
    window = roomy_window()
    limited, limited_key = gw.key_with_record(rate_limit_requests=LIMIT,
                                              rate_limit_window_seconds=window)
    budgeted, budgeted_key = gw.key_with_record(rate_limit_requests=100_000,
                                                rate_limit_window_seconds=window)
    set_price(gw.database_url, "venice", "llama-3.3-70b", "0", "10")  # 1e-5 USD a token out
    set_budget(gw.database_url, BudgetScope.KEY, budgeted.id, daily_usd=BUDGET_USD)
    gw.gateway.refresh_from_thread()
    counter = window_key(limited.id, LIMIT, window, gw.gateway.settings.redis_namespace)

    answered = asyncio.run(load(gw.url, [limited_key, budgeted_key], lambda: fail(counter)))
    gw.gateway.flush_from_thread()

    by_key: dict[str, collections.Counter[tuple[int, str]]] = {
        limited_key: collections.Counter(), budgeted_key: collections.Counter()}
    for response in answered:
        key = response.request.headers["authorization"].removeprefix("Bearer ")
        code = "" if response.status_code == 200 else response.json()["error"]["code"]
        by_key[key][(response.status_code, code)] += 1
    print({key[:12]: dict(counts) for key, counts in by_key.items()})
    allowed = {(200, ""), (429, "rate_limit_exceeded"), (429, "insufficient_quota"),
               (503, "rate_limiter_unavailable")}
    for counts in by_key.values():
        assert set(counts) <= allowed, counts  # no 500, no other failure
    # Some requests failed while no primary answered: the failover really was under load.
    assert sum(c[(503, "rate_limiter_unavailable")] for c in by_key.values()) >= 1
    admitted = by_key[limited_key][(200, "")]
    lost = admitted - min(counted(counter), LIMIT)
    print(f"limited key: {admitted} admitted, {counted(counter)} counted after the failover")
    assert admitted <= LIMIT + CONCURRENCY and lost <= CONCURRENCY
    assert by_key[limited_key][(429, "rate_limit_exceeded")] >= 1  # the limit was reached

    records = usage_records(gw.database_url)
    ids = collections.Counter(record.request_id for record in records)
    assert not [rid for rid, n in ids.items() if n > 1]  # none doubled
    for response in answered:  # every admitted request has its record
        if response.status_code == 200:
            assert ids[response.headers["x-request-id"]] == 1
    spent = sum((record.cost_usd or Decimal(0)) for record in records
                if record.key_id == budgeted.id)
    assert by_key[budgeted_key][(429, "insufficient_quota")] >= 1  # the budget ran out
    assert spent <= BUDGET_USD, spent  # and was never overspent


def test_a_sentinel_failover_under_load(start_gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with sentinel_set(tmp_path) as (nodes, primary, replica, sentinel):
        # A sentinel that is down comes first: it is passed over.
        url = f"redis+sentinel://127.0.0.1:{closed_port()},127.0.0.1:{sentinel}/svc"

        def fail(counter: str) -> None:
            nodes.kill(primary)
            wait_for(lambda: redis.Redis(port=sentinel).sentinel_get_master_addr_by_name(
                "svc")[1] == replica, 15, "the sentinel promoting the replica")

        failover_under_load(start_gateway, url, fail,
                            lambda key: int(redis.Redis(port=replica).hget(key, "count") or 0))
        assert redis.Redis(port=replica).info("replication")["role"] == "master"


def slot_owner(port: int, slot: int) -> int:
    """The port of the primary that node ``port`` says owns ``slot``."""
    for start, end, primary, *_ in redis.Redis(port=port).execute_command("CLUSTER", "SLOTS"):
        if start <= slot <= end:
            return int(primary[1])
    raise AssertionError(f"no owner of slot {slot}")


def test_a_cluster_node_failover_under_load(start_gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with redis_cluster(tmp_path) as (nodes, ports):
        url = "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in ports[:2])
        victim: list[int] = []

        def alive() -> int:
            return next(port for port in ports if port not in victim)

        def fail(counter: str) -> None:
            slot = key_slot(counter.encode())  # the limited key's counters' slot
            victim.append(slot_owner(ports[0], slot))
            nodes.kill(victim[0])
            wait_for(lambda: slot_owner(alive(), slot) != victim[0], 15,
                     "a replica taking over the slot")

        def counted(counter: str) -> int:
            node = slot_owner(alive(), key_slot(counter.encode()))
            return int(redis.Redis(port=node).hget(counter, "count") or 0)

        failover_under_load(start_gateway, url, fail, counted)


def test_a_cluster_call_follows_moved_and_ask(tmp_path: Path) -> None:
    """A slot given to another primary answers MOVED (the map is asked for again); a slot
    being migrated answers ASK for a key it no longer has (ASKING, then the call)."""
    with redis_cluster(tmp_path) as (_, ports):
        async def run() -> None:
            scripts = RedisScripts(f"redis+cluster://127.0.0.1:{ports[0]}")
            try:
                moved, asked = "{ha-moved}n", "{ha-asked}n"
                assert await scripts.run(INCR, [moved], [1]) == 1
                ids = {port: redis.Redis(port=port).cluster("myid") for port in ports}
                for key in (moved, asked):  # both to a primary that does not own them
                    slot = key_slot(key.encode())
                    source = slot_owner(ports[0], slot)
                    target = next(p for p in ports[:3] if p != source)
                    if key == moved:  # an empty slot given away: every primary told
                        redis.Redis(port=source).delete(key)
                        for port in ports[:3]:  # redis-cli made the first three primaries
                            redis.Redis(port=port).execute_command(
                                "CLUSTER", "SETSLOT", slot, "NODE", ids[target])
                        wait_for(lambda s=slot, t=target: slot_owner(ports[0], s) == t, 10,
                                 "the slot moved")
                    else:
                        redis.Redis(port=target).execute_command(
                            "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
                        redis.Redis(port=source).execute_command(
                            "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
                    await asyncio.sleep(REFRESH_SECONDS)  # a map this young is not asked again
                    refreshes = scripts.cluster.refreshes  # type: ignore[union-attr]
                    assert await scripts.run(INCR, [key], [5]) == 5
                    on_target = redis.Redis(port=target, single_connection_client=True)
                    on_target.execute_command("ASKING")  # a slot it is importing
                    assert int(on_target.get(key) or 0) == 5
                    if key == moved:
                        await asyncio.sleep(0.1)  # the map asked for again, in the background
                        assert scripts.cluster.refreshes > refreshes  # type: ignore[union-attr]
                with pytest.raises(ResponseError, match="CROSSSLOT"):
                    await scripts.run(INCR, ["{a}x", "{b}x"], [1])
                await scripts.ping()
            finally:
                await scripts.close()

        asyncio.run(run())


def test_a_demoted_primary_sends_the_call_to_the_new_one(tmp_path: Path) -> None:
    """A switchover (SENTINEL FAILOVER) keeps the old primary's connections open, and it
    answers -READONLY: the call is made on the primary the sentinels name now."""
    with sentinel_set(tmp_path) as (_, primary, replica, sentinel):
        async def run() -> None:
            scripts = RedisScripts(f"redis+sentinel://127.0.0.1:{sentinel}/svc")
            try:
                assert await scripts.run(INCR, ["{ha}n"], [1]) == 1
                assert scripts.locator is not None and scripts.locator.asked == 1
                redis.Redis(port=sentinel).execute_command("SENTINEL", "FAILOVER", "svc")
                wait_for(lambda: redis.Redis(port=primary).info("replication")["role"]
                         == "slave" and redis.Redis(port=sentinel)
                         .sentinel_get_master_addr_by_name("svc")[1] == replica, 15,
                         "the switchover")
                assert await scripts.run(INCR, ["{ha}n"], [1]) == 2  # on the new primary
                assert scripts.locator.asked >= 2
                assert int(redis.Redis(port=replica).get("{ha}n") or 0) == 2
            finally:
                await scripts.close()

        asyncio.run(run())
