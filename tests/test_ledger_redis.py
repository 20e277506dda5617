"""The Redis ledger gives the memory ledger's answers (its scripts apply the same rules
as llm_gateway.billing.ledger's reserve_in and settle_in)."""

from __future__ import annotations

import os
import time

import redis

from llm_gateway.billing.ledger import Draw, Hold, MemoryLedger
from llm_gateway.billing.ledger_redis import RedisLedger


def _namespace() -> str:
    return f"ledger-{os.getpid()}-{time.monotonic_ns()}"


def _counter(url: str, namespace: str, name: str) -> dict[bytes, bytes]:
    client = redis.Redis.from_url(url)
    try:
        return client.hgetall(f"{namespace}:{{budgets}}:{name}")  # type: ignore[return-value]
    finally:
        client.close()


async def test_the_redis_ledger_answers_as_the_memory_ledger(redis_url: str) -> None:
    namespace = _namespace()
    memory, shared = MemoryLedger(), RedisLedger(redis_url, namespace=namespace)
    ledgers = (memory, shared)
    day = Hold("tok:key:k:d1", 100, 40, time.time() + 3600)
    # A bucket that refills 1 token in 6 s: the milliseconds between the two ledgers'
    # calls move no answer's whole tokens.
    tpm = Draw("tpm:key:k", 10, 4)
    try:
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
    finally:
        await shared.close()
    assert _counter(redis_url, namespace, day.name) == {b"spent": b"35", b"reserved": b"40"}
