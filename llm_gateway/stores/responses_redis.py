"""Response bindings (llm_gateway.stores.responses) in Redis: one string key per response
id, ``<namespace>:responses:<id>``, holding the binding as JSON and expiring with it.

``SET NX PX`` makes the first bind win however many replicas bind the id at once, and
Redis removes the key when the binding expires: nothing to sweep. The commands run as
one-line scripts through llm_gateway.redis_scripts, the pipelined connection the limiter
and the budget ledger share, so a lookup on the request path shares their writes and
reads instead of opening a pool of its own. A single key per command: Redis Cluster
needs no hash tag.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llm_gateway.redis_scripts import RedisScripts, Script
from llm_gateway.stores import StoreUnavailable
from llm_gateway.stores.responses import ResponseBinding

# ARGV: the binding (JSON), its time to live in milliseconds.
BIND = Script("return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])")
OWNER = Script("return redis.call('GET', KEYS[1])")
FORGET = Script("return redis.call('DEL', KEYS[1])")
_NOT_ANSWERING = (RedisConnectionError, RedisTimeoutError, OSError)


def binding_key(response_id: str, namespace: str = "llmg") -> str:
    return f"{namespace}:responses:{response_id}"


def _encoded(binding: ResponseBinding) -> str:
    return json.dumps({
        "subject_id": binding.subject_id, "key_id": binding.key_id,
        "provider": binding.provider, "model": binding.model,
        "created_at": binding.created_at, "expires_at": binding.expires_at,
    }, separators=(",", ":"))


def _decoded(response_id: str, stored: bytes) -> ResponseBinding:
    fields = json.loads(stored)
    return ResponseBinding(response_id, fields["subject_id"], fields["key_id"],
                           fields["provider"], fields["model"], float(fields["created_at"]),
                           float(fields["expires_at"]))


class RedisResponseOwners:
    backend = "redis"

    def __init__(self, url: str, *, namespace: str = "llmg",
                 scripts: RedisScripts | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.namespace = namespace
        # Shared with the limiter and the ledger when wiring passes it (they close it);
        # one of its own otherwise, closed here.
        self._owns_scripts = scripts is None
        self._scripts = scripts or RedisScripts(url)
        self._clock = clock

    async def bind(self, binding: ResponseBinding) -> None:
        ttl_ms = math.ceil((binding.expires_at - self._clock()) * 1000)
        if ttl_ms <= 0:
            return  # expired already: there is nothing to keep
        await self._run(BIND, binding.response_id, _encoded(binding), ttl_ms)

    async def owner(self, response_id: str) -> ResponseBinding | None:
        stored = await self._run(OWNER, response_id)
        if stored is None:
            return None
        binding = _decoded(response_id, stored)
        # Redis expires the key on its own clock; this one decides too, so that every
        # backend answers alike when the two disagree by a moment.
        return binding if binding.expires_at > self._clock() else None

    async def forget(self, response_id: str) -> None:
        await self._run(FORGET, response_id)

    async def close(self) -> None:
        if self._owns_scripts:
            await self._scripts.close()

    async def _run(self, script: Script, response_id: str, *args: Any) -> Any:
        try:
            return await self._scripts.run(script, [binding_key(response_id, self.namespace)],
                                           list(args))
        except _NOT_ANSWERING as exc:
            raise StoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc
