"""Postgres with two hosts (DATABASE_URL naming both, target_session_attrs=read-write) and a
switchover under load: the primary stopped, the standby (pg_basebackup -R) promoted. The
gateway keeps admitting the keys it knows (AUTH_FAILURE_POLICY=fail-open), spools the
records the database cannot take meanwhile and writes them once the new primary answers:
every admitted request has exactly one record there, none lost, none doubled; the pool
reconnects to the new primary (a key created there after the switchover is served).

Servers of the test's own (tests/ha_servers.py), on free ports; ~10-15 s.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest

from llm_gateway.config import FailurePolicy
from llm_gateway.stores import StoreUnavailable
from llm_gateway.stores.postgres import PostgresStore
from tests.ha_servers import postgres_pair, wait_for
from tests.support import roomy_window, usage_records

pytestmark = pytest.mark.slow_once

CHAT = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hello"}]}
CONCURRENCY, PACE_SECONDS = 6, 0.05
BEFORE, AFTER = 60, 120  # requests before the switchover, and after it is done


async def load(url: str, key: str, switch_over: threading.Thread) -> list[httpx.Response]:
    answered: list[httpx.Response] = []
    sent = itertools.count()
    after: list[int] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while len(after) < AFTER:
            n = next(sent)
            answered.append(await client.post(url + "/v1/chat/completions", json=CHAT,
                                              headers={"authorization": f"Bearer {key}"}))
            if n == BEFORE:
                switch_over.start()
            elif n > BEFORE and not switch_over.is_alive():
                after.append(n)
            await asyncio.sleep(PACE_SECONDS)

    async with httpx.AsyncClient(timeout=30) as client:
        await asyncio.gather(*(worker(client) for _ in range(CONCURRENCY)))
    return answered


def test_a_switchover_under_load_loses_and_doubles_no_record(start_gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with postgres_pair() as pair:
        url = (f"postgresql:///postgres?user=postgres&host=127.0.0.1,127.0.0.1"
               f"&port={pair.primary_port},{pair.standby_port}&target_session_attrs=read-write")
        gw = start_gateway(database_url=url, auth_failure_policy=FailurePolicy.FAIL_OPEN,
                           usage_spool_dir=str(tmp_path / "spool"))
        window = roomy_window()
        key = gw.key(rate_limit_requests=100_000, rate_limit_window_seconds=window)
        assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=10,
                          headers={"authorization": f"Bearer {key}"}).status_code == 200

        outage: list[float] = []
        in_the_gap: list[httpx.Response] = []

        def switch_over() -> None:
            outage.append(time.time())
            pair.stop("primary", "fast")  # a planned switchover: the standby has every commit
            # One request surely sent while no database answers: on a loaded machine the
            # load's own may all fall outside the gap (a CI pass saw none inside it).
            in_the_gap.append(httpx.post(gw.url + "/v1/chat/completions", json=CHAT,
                                         timeout=30, headers={"authorization": f"Bearer {key}"}))
            time.sleep(1.0)  # no primary for a second (an operator's switchover takes longer)
            pair.promote("standby")
            wait_for(lambda: pair.is_primary(pair.standby_port), 20, "the standby promoted")
            outage.append(time.time())

        answered = asyncio.run(load(gw.url, key, threading.Thread(target=switch_over)))
        answered += in_the_gap
        statuses = collections.Counter(response.status_code for response in answered)
        print(dict(statuses), "spooled:", gw.gateway.usage.spooled)
        assert set(statuses) == {200}  # the key was known: admitted throughout
        wait_for(lambda: gw.gateway.flush_from_thread() or gw.gateway.usage.pending == 0,
                 20, "every record written")

        # The records are on the new primary: one per admitted request, none doubled.
        new_primary = pair.url(pair.standby_port)
        ids = collections.Counter(record.request_id for record in usage_records(new_primary))
        assert [rid for rid, n in ids.items() if n > 1] == []
        missing = [r.headers["x-request-id"] for r in answered
                   if ids[r.headers["x-request-id"]] != 1]
        assert missing == [], f"{len(missing)} of {len(answered)} admitted requests unrecorded"
        # Requests were admitted while no database answered (their records waited in the
        # spool, or a write waited for a connection, until the new primary took them).
        during = [r for r in usage_records(new_primary) if outage[0] < r.started_at < outage[1]]
        print(f"switchover {outage[1] - outage[0]:.2f}s, {len(during)} admitted meanwhile")
        assert len(during) >= 1

        # The pool is on the new primary: a key only it knows is looked up and served.
        fresh = gw.key(rate_limit_requests=100_000, rate_limit_window_seconds=window)
        assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=10,
                          headers={"authorization": f"Bearer {fresh}"}).status_code == 200
        with psycopg.connect(new_primary) as conn:
            row = conn.execute("SELECT count(*) FROM gateway_keys").fetchone()
            assert row is not None and row[0] == 2

        # A connection whose server turned read-only (as a demoted primary is) is dropped,
        # and the write it failed is StoreUnavailable (the failure policies' answer).
        async def write_on_a_read_only_server() -> None:
            store = PostgresStore(url, min_size=1, max_size=1)
            try:
                await store.ping()  # its one connection open, on the new primary
                with psycopg.connect(new_primary, autocommit=True) as conn:
                    conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
                    conn.execute("SELECT pg_reload_conf()")
                await asyncio.sleep(0.3)  # the reload reaches the open session
                with pytest.raises(StoreUnavailable, match="ReadOnlySqlTransaction"):
                    await store.revoke_key(str(uuid.uuid4()), 0.0)
                assert store.pool.get_stats().get("returns_bad") == 1
            finally:
                await store.close()

        asyncio.run(write_on_a_read_only_server())
