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


# ---- negative cache and constant-shape work (hostile clients) ---------------------------------

def forged_key_with_valid_checksum() -> str:
    """A key nobody issued, well-formed: it passes the checksum and reaches the store."""
    from llm_gateway.keys import generate_key

    return generate_key()


async def test_an_unknown_prefix_costs_one_lookup_per_miss_lifetime() -> None:
    from llm_gateway.auth import MISS_CACHE_SECONDS

    store, clock = MemoryKeys(), Clock()
    auth = authenticator(store, clock)
    forged = forged_key_with_valid_checksum()
    for _ in range(50):
        assert code_of(await auth.authenticate(f"Bearer {forged}")) == "invalid_api_key"
    assert store.lookups == 1
    clock.now += MISS_CACHE_SECONDS
    await auth.authenticate(f"Bearer {forged}")
    assert store.lookups == 2


async def test_a_key_created_after_a_miss_works_once_the_miss_expires_or_is_forgotten() -> None:
    from llm_gateway.auth import MISS_CACHE_SECONDS

    store, clock = MemoryKeys(), Clock()
    auth = authenticator(store, clock)
    record, key = store.add()
    del store.by_prefix[record.prefix]
    assert isinstance(await auth.authenticate(f"Bearer {key}"), Rejection)
    store.by_prefix[record.prefix] = record  # created meanwhile, elsewhere
    assert isinstance(await auth.authenticate(f"Bearer {key}"), Rejection)  # still a miss
    clock.now += MISS_CACHE_SECONDS
    assert await auth.authenticate(f"Bearer {key}") == record
    auth.forget()
    del store.by_prefix[record.prefix]
    await auth.authenticate(f"Bearer {key}")
    store.by_prefix[record.prefix] = record
    auth.forget(record.prefix)  # what the admin API does in its own process
    assert await auth.authenticate(f"Bearer {key}") == record


async def test_the_miss_cache_is_bounded() -> None:
    from llm_gateway import auth as auth_module

    store = MemoryKeys()
    auth = authenticator(store, Clock())
    first = forged_key_with_valid_checksum()
    await auth.authenticate(f"Bearer {first}")
    for _ in range(auth_module.MISS_CACHE_SIZE):
        await auth.authenticate(f"Bearer {forged_key_with_valid_checksum()}")
    assert len(auth._misses) == auth_module.MISS_CACHE_SIZE
    lookups = store.lookups
    await auth.authenticate(f"Bearer {first}")  # the oldest was forgotten: looked up again
    assert store.lookups == lookups + 1


async def test_an_unknown_prefix_and_a_wrong_key_take_the_same_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both compare one SHA-256 against a stored hash (a dummy one for an unknown prefix),
    so the response time does not tell which prefixes exist."""
    from llm_gateway import auth as auth_module

    compared: list[bytes] = []
    real = auth_module.hash_matches

    def counting(key: str, stored: bytes) -> bool:
        compared.append(stored)
        return real(key, stored)

    monkeypatch.setattr(auth_module, "hash_matches", counting)
    store = MemoryKeys()
    record, key = store.add()
    store.by_prefix[record.prefix] = replace(record, key_hash=b"\1" * 32)  # a wrong key
    auth = authenticator(store, Clock())
    assert code_of(await auth.authenticate(f"Bearer {key}")) == "invalid_api_key"
    assert code_of(await auth.authenticate(
        f"Bearer {forged_key_with_valid_checksum()}")) == "invalid_api_key"
    assert len(compared) == 2 and compared[1] == bytes(32)
    assert store.lookups == 2


async def test_admin_tokens_and_jwts_are_no_gateway_keys() -> None:
    from llm_gateway.admin.tokens import generate_token

    store = MemoryKeys()
    auth = authenticator(store, Clock())
    token = generate_token()
    assert code_of(await auth.authenticate(f"Bearer {token}")) == "invalid_api_key"
    jwt_like = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"
    refused = await auth.authenticate(f"Bearer {jwt_like}")
    assert code_of(refused) == "invalid_api_key"
    assert b"does not accept JWTs" in refused.body  # type: ignore[union-attr]
    assert store.lookups == 0
