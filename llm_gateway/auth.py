"""Who is calling: gateway-key authentication with a short-lived lookup cache, or a JWT.

Order of checks is cheapest first: the Bearer header's shape, the key's checksum (a
forged or mistyped key never costs a lookup), then the store by prefix, then a
constant-time hash comparison, then the key's own state. A credential shaped like a JWT
goes to the JWT verifier instead (``auth_jwt``), when JWT callers are configured.

Unknown prefixes are remembered for a short while (bounded), so a forged key with a valid
checksum costs one lookup, not one per request; and an unknown prefix costs the same hash
comparison as a known one with a wrong key, so the response time tells nothing about
which prefixes exist.

When the store does not answer, the failure policy decides: fail-closed (the default)
answers 503 for any key whose cached lookup has expired; fail-open keeps serving keys
this process looked up before the outage, however old the lookup. Neither ever admits a
key the store has not confirmed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from llm_gateway.config import FailurePolicy
from llm_gateway.errors import Rejection, invalid_api_key, key_store_unavailable
from llm_gateway.keys import KeyRecord, hash_matches, is_well_formed, key_prefix, looks_like_jwt
from llm_gateway.outage import Outage
from llm_gateway.stores import Store, StoreUnavailable

if TYPE_CHECKING:
    from llm_gateway.auth_jwt import JwtVerifier

# How long a key lookup is trusted. Bounds how late a revocation made on another
# process (CLI, another replica) takes effect: at most this long after the revoking
# statement commits, every replica refuses the key.
KEY_CACHE_SECONDS = 2.0
# last_used_at is bookkeeping, not policy: write it at most this often per key.
TOUCH_INTERVAL_SECONDS = 60.0
# Unknown prefixes: remembered this long (a key created meanwhile in another process is
# usable after at most this), at most this many (the oldest forgotten first), so a flood
# of forged keys can neither reach the store nor grow memory.
MISS_CACHE_SECONDS = 2.0
MISS_CACHE_SIZE = 10_000
# What a presented key is compared against when no key has its prefix: the same work as
# a wrong key whose prefix exists.
_DUMMY_HASH = bytes(32)


class Authenticator:
    def __init__(
        self,
        store: Store,
        *,
        cache_seconds: float = KEY_CACHE_SECONDS,
        clock: Callable[[], float] = time.time,
        failure_policy: FailurePolicy = FailurePolicy.FAIL_CLOSED,
        backend: str = "store",
        jwt: JwtVerifier | None = None,
    ) -> None:
        self._store = store
        self._cache_seconds = cache_seconds
        self._clock = clock
        self.failure_policy = failure_policy
        self.outage = Outage("key_store", backend, policy=failure_policy, substitute=(
            "serving keys looked up before the outage, 503 for the rest"
            if failure_policy is FailurePolicy.FAIL_OPEN else "answering 503 until it is back"
        ))
        self._cache: dict[str, tuple[float, KeyRecord]] = {}
        self._misses: dict[str, float] = {}  # prefix -> when the store said "no such key"
        self.jwt = jwt  # None: JWT callers are not configured, a JWT is refused
        # Lookups under way, by prefix: a burst on a key whose cache entry just expired
        # costs the store one query, not one per request.
        self._in_flight: dict[str, asyncio.Future[KeyRecord | None]] = {}
        self._touched: dict[str, float] = {}
        self.pending_touches: dict[str, float] = {}

    async def authenticate(self, authorization: str | None) -> KeyRecord | Rejection:
        if not authorization:
            return invalid_api_key(
                "Missing gateway key: send it as 'Authorization: Bearer <gateway key>'."
            )
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return invalid_api_key(
                "Malformed Authorization header: expected 'Bearer <gateway key>'."
            )
        if looks_like_jwt(token):
            if self.jwt is None:
                return invalid_api_key("This gateway does not accept JWTs: send a gateway key.")
            return await self.jwt.authenticate(token)
        if not is_well_formed(token):
            return invalid_api_key()
        now = self._clock()
        try:
            record = await self._lookup(key_prefix(token), now)
        except StoreUnavailable:
            return key_store_unavailable()
        if not hash_matches(token, record.key_hash if record else _DUMMY_HASH) or record is None:
            return invalid_api_key()
        refusal = record.refusal(now)
        if refusal is not None:
            return invalid_api_key(f"Gateway key {record.prefix}… is {refusal}.", final=True)
        if now - self._touched.get(record.id, 0.0) >= TOUCH_INTERVAL_SECONDS:
            self._touched[record.id] = now
            self.pending_touches[record.id] = now
        return record

    async def _lookup(self, prefix: str, now: float) -> KeyRecord | None:
        cached = self._cache.get(prefix)
        if cached is not None and now - cached[0] < self._cache_seconds:
            return cached[1]
        missed = self._misses.get(prefix)
        if missed is not None and now - missed < MISS_CACHE_SECONDS:
            return None
        lookup = self._in_flight.get(prefix)
        if lookup is None:
            lookup = asyncio.ensure_future(self._fetch(prefix, now, cached))
            self._in_flight[prefix] = lookup
            lookup.add_done_callback(lambda done: self._lookup_done(prefix, done))
        # Shielded: one caller going away must not cancel the lookup the others await.
        return await asyncio.shield(lookup)

    def _lookup_done(self, prefix: str, done: asyncio.Future[KeyRecord | None]) -> None:
        if self._in_flight.get(prefix) is done:
            del self._in_flight[prefix]
        if not done.cancelled():
            done.exception()  # seen here, so an outage nobody awaited logs no traceback

    async def _fetch(
        self, prefix: str, now: float, cached: tuple[float, KeyRecord] | None
    ) -> KeyRecord | None:
        try:
            record = await self._store.key_by_prefix(prefix)
        except StoreUnavailable as exc:
            self.outage.failed(exc)
            if self.failure_policy is FailurePolicy.FAIL_OPEN and cached is not None:
                self.outage.substituted()
                return cached[1]
            raise
        self.outage.recovered()
        if record is not None:
            self._cache[prefix] = (now, record)
            self._misses.pop(prefix, None)
        else:
            self._cache.pop(prefix, None)
            self._remember_miss(prefix, now)
        return record

    def _remember_miss(self, prefix: str, now: float) -> None:
        self._misses.pop(prefix, None)  # re-inserted last: the dict's order is by age
        while len(self._misses) >= MISS_CACHE_SIZE:
            del self._misses[next(iter(self._misses))]
        self._misses[prefix] = now

    def forget(self, prefix: str | None = None) -> None:
        """Drop cached lookups (all, or one prefix): after a revoke in this process."""
        if prefix is None:
            self._cache.clear()
            self._misses.clear()
        else:
            self._cache.pop(prefix, None)
            self._misses.pop(prefix, None)

    def take_touches(self) -> dict[str, float]:
        touches, self.pending_touches = self.pending_touches, {}
        return touches
