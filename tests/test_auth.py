"""The Authenticator on its own: an in-memory store and a clock the test moves."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from llm_gateway.auth import TOUCH_INTERVAL_SECONDS, Authenticator
from llm_gateway.config import FailurePolicy
from llm_gateway.errors import Rejection
from llm_gateway.keys import KeyRecord, new_key_record
from llm_gateway.stores import StoreUnavailable


class MemoryKeys:
    """Just what the Authenticator asks of a store, counting the lookups."""

    def __init__(self) -> None:
        self.by_prefix: dict[str, KeyRecord] = {}
        self.lookups = 0
        self.down = False
        self.delay = 0.0

    def add(self, **options: object) -> tuple[KeyRecord, str]:
        record, key = new_key_record(name="unit", subject_id=None, now=time.time(),
                                     **options)  # type: ignore[arg-type]
        self.by_prefix[record.prefix] = record
        return record, key

    async def key_by_prefix(self, prefix: str) -> KeyRecord | None:
        self.lookups += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.down:
            raise StoreUnavailable("the test took it down")
        return self.by_prefix.get(prefix)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def authenticator(store: MemoryKeys, clock: Clock, **options: object) -> Authenticator:
    return Authenticator(store, clock=clock, cache_seconds=2.0, **options)  # type: ignore[arg-type]


def code_of(answer: KeyRecord | Rejection) -> str:
    assert isinstance(answer, Rejection), answer
    return answer.code


@pytest.mark.parametrize("header", [None, "", "Basic abc", "Bearer ", "Bearer llmg_short",
                                    "Bearer sk-not-ours-at-all"])
async def test_malformed_credentials_cost_no_lookup(header: str | None) -> None:
    store = MemoryKeys()
    auth = authenticator(store, Clock())
    assert code_of(await auth.authenticate(header)) == "invalid_api_key"
    assert store.lookups == 0


async def test_a_key_with_a_broken_checksum_costs_no_lookup() -> None:
    store = MemoryKeys()
    _, key = store.add()
    forged = key[:-1] + ("A" if key[-1] != "A" else "B")
    assert code_of(await authenticator(store, Clock()).authenticate(f"Bearer {forged}")) == (
        "invalid_api_key")
    assert store.lookups == 0


async def test_a_valid_key_is_looked_up_once_per_cache_lifetime() -> None:
    store, clock = MemoryKeys(), Clock()
    record, key = store.add()
    auth = authenticator(store, clock)
    for _ in range(3):
        assert await auth.authenticate(f"Bearer {key}") == record
    assert store.lookups == 1
    clock.now += 2.0  # the cache lifetime bounds how late a revocation is seen
    assert await auth.authenticate(f"bearer {key}") == record
    assert store.lookups == 2


async def test_revocation_is_seen_once_the_cached_lookup_expires() -> None:
    store, clock = MemoryKeys(), Clock()
    record, key = store.add()
    auth = authenticator(store, clock)
    assert await auth.authenticate(f"Bearer {key}") == record
    store.by_prefix[record.prefix] = replace(record, is_active=False, revoked_at=clock.now)
    assert await auth.authenticate(f"Bearer {key}") == record  # still cached
    clock.now += 2.5
    refused = await auth.authenticate(f"Bearer {key}")
    assert code_of(refused) == "invalid_api_key" and b"revoked" in refused.body  # type: ignore[union-attr]


async def test_expiry_follows_the_clock() -> None:
    store, clock = MemoryKeys(), Clock()
    _, key = store.add(expires_at=clock.now + 10)
    auth = authenticator(store, clock)
    assert isinstance(await auth.authenticate(f"Bearer {key}"), KeyRecord)
    clock.now += 10
    assert b"expired" in (await auth.authenticate(f"Bearer {key}")).body  # type: ignore[union-attr]


async def test_a_key_of_another_hash_with_the_same_prefix_is_refused() -> None:
    store = MemoryKeys()
    record, key = store.add()
    store.by_prefix[record.prefix] = replace(record, key_hash=b"\0" * 32)
    assert code_of(await authenticator(store, Clock()).authenticate(f"Bearer {key}")) == (
        "invalid_api_key")


async def test_concurrent_lookups_of_one_prefix_cost_one_query() -> None:
    store = MemoryKeys()
    record, key = store.add()
    store.delay = 0.05
    auth = authenticator(store, Clock())
    answers = await asyncio.gather(*(auth.authenticate(f"Bearer {key}") for _ in range(20)))
    assert answers == [record] * 20 and store.lookups == 1


async def test_fail_closed_refuses_every_key_while_the_store_is_down() -> None:
    store, clock = MemoryKeys(), Clock()
    _, key = store.add()
    auth = authenticator(store, clock, failure_policy=FailurePolicy.FAIL_CLOSED)
    assert isinstance(await auth.authenticate(f"Bearer {key}"), KeyRecord)
    store.down, clock.now = True, clock.now + 3
    assert code_of(await auth.authenticate(f"Bearer {key}")) == "key_store_unavailable"
    assert auth.outage.is_down and auth.outage.state == "unavailable"
    store.down = False
    assert isinstance(await auth.authenticate(f"Bearer {key}"), KeyRecord)
    assert not auth.outage.is_down


async def test_fail_open_serves_keys_seen_before_and_never_unknown_ones() -> None:
    store, clock = MemoryKeys(), Clock()
    record, known = store.add()
    _, unseen = store.add()
    auth = authenticator(store, clock, failure_policy=FailurePolicy.FAIL_OPEN)
    assert await auth.authenticate(f"Bearer {known}") == record
    store.down, clock.now = True, clock.now + 3600
    assert await auth.authenticate(f"Bearer {known}") == record
    assert code_of(await auth.authenticate(f"Bearer {unseen}")) == "key_store_unavailable"
    assert auth.outage.state == "degraded" and auth.outage.substitutions == 1


async def test_last_use_is_noted_at_most_once_per_interval() -> None:
    store, clock = MemoryKeys(), Clock()
    record, key = store.add()
    auth = authenticator(store, clock)
    await auth.authenticate(f"Bearer {key}")
    await auth.authenticate(f"Bearer {key}")
    assert auth.take_touches() == {record.id: clock.now}
    clock.now += 1
    await auth.authenticate(f"Bearer {key}")
    assert auth.take_touches() == {}
    clock.now += TOUCH_INTERVAL_SECONDS
    await auth.authenticate(f"Bearer {key}")
    assert auth.take_touches() == {record.id: clock.now}
