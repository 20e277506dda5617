"""The shared ledgers give the memory ledger's answers: Redis's scripts and Postgres's
functions apply the rules of llm_gateway.billing.ledger's reserve_in and settle_in."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from llm_gateway.billing.ledger import Draw, Hold, Ledger, MemoryLedger
from llm_gateway.billing.ledger_postgres import PostgresLedger
from llm_gateway.billing.ledger_redis import RedisLedger
from llm_gateway.stores import open_store
from llm_gateway.stores.postgres import PostgresStore


@asynccontextmanager
async def shared_ledger(backend: str, request: pytest.FixtureRequest) -> AsyncIterator[Ledger]:
    if backend == "redis":
        namespace = f"ledger-{os.getpid()}-{time.monotonic_ns()}"
        ledger = RedisLedger(request.getfixturevalue("redis_url"), namespace=namespace)
        try:
            yield ledger
        finally:
            await ledger.close()
        return
    store = open_store(request.getfixturevalue("postgres_url"))
    assert isinstance(store, PostgresStore)
    try:
        await store.migrate()
        yield PostgresLedger(store)
    finally:
        await store.close()


@pytest.mark.parametrize("backend", ["redis", "postgres"])
async def test_a_shared_ledger_answers_as_the_memory_ledger(
    backend: str, request: pytest.FixtureRequest,
) -> None:
    owner = f"key:{os.getpid()}-{time.monotonic_ns()}"  # counters of this run's own
    day = Hold(f"tok:{owner}:d1", 100, 40, time.time() + 3600)
    # A bucket that refills 1 token in 6 s: the milliseconds between the two ledgers'
    # calls move no answer's whole tokens.
    tpm = Draw(f"tpm:{owner}", 10, 4)
    async with shared_ledger(backend, request) as shared:
        ledgers = (MemoryLedger(), shared)
        for _ in range(3):  # the third would pass the counter's 100
            answers = [await ledger.reserve([day], [tpm]) for ledger in ledgers]
            assert answers[0] == answers[1]
        assert not answers[0].granted and answers[0].refused_by == day.name
        for ledger in ledgers:
            await ledger.settle([day], [10], [tpm], [1])
            await ledger.settle([day], [25], [tpm], [4])
        answers = [await ledger.reserve([day], [tpm]) for ledger in ledgers]
        assert answers[0] == answers[1] and answers[0].granted
        assert answers[0].left == {day.name: 100 - 35, tpm.name: 10 - 8 + 3}
