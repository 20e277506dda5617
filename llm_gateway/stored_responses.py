"""Stored responses (OpenAI's Responses API) belong to their caller.

A provider sees one key for every caller, so only the gateway can keep callers apart: a
response id created through it is bound to the subject (and key) that created it, with
the target that made it (``ResponseOwners``, shared by every replica). A ``GET``,
``DELETE``, ``cancel`` or ``input_items`` naming an id, or a ``previous_response_id``,
that is not the caller's is answered 404 as the provider answers an unknown id; the
caller's own goes to the provider and target that created it, whatever the weights (a
stored conversation cannot fail over: 503, naming why, while that target is down). A
request with ``store: false`` keeps nothing and routes as any other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from llm_gateway import errors
from llm_gateway.errors import Rejection
from llm_gateway.exchange import Exchange
from llm_gateway.keys import KeyRecord
from llm_gateway.protocols import RESPONSES, Endpoint, matches
from llm_gateway.routing.health import State
from llm_gateway.routing.router import Plan, Router
from llm_gateway.routing.table import ModelRoute, Target
from llm_gateway.stores import StoreUnavailable
from llm_gateway.stores.responses import ResponseBinding, ResponseOwners

log = logging.getLogger("llm_gateway")
# The operations whose answer is a response the provider may keep.
_CREATING = frozenset({"responses"})


class StoredResponses:
    def __init__(self, owners: ResponseOwners, router: Router, retention_days: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.owners = owners
        self._router = router
        self._retention_days = retention_days
        self._clock = clock

    async def plan(self, endpoint: Endpoint, path: str, payload: dict | None,
                   key: KeyRecord) -> Plan | Rejection | None:
        """For a request that names a stored response (its path, or
        ``previous_response_id``): the plan pinned to the target that made it, or the
        refusal; None for any other request."""
        if endpoint.protocol is not RESPONSES:
            return None
        resource = matches(endpoint.path, path)
        previous = payload.get("previous_response_id") if payload else None
        named = resource or previous
        if not isinstance(named, str) or not named:
            return None
        try:
            binding = await self.owners.owner(named)
        except StoreUnavailable:
            return errors.key_store_unavailable()
        if binding is None or binding.subject_id != key.subject_id:
            return (errors.response_not_found(named) if resource
                    else errors.previous_response_not_found(named))
        return self._pinned(binding)

    def _pinned(self, binding: ResponseBinding) -> Plan | Rejection:
        table = self._router.table
        if binding.provider not in table.providers:
            return errors.stored_response_unavailable(
                binding.response_id, f"its provider '{binding.provider}' is no longer routed")
        target = Target(binding.provider, binding.model)
        if self._router.health.state(target.key) is State.DOWN:
            return errors.stored_response_unavailable(
                binding.response_id, f"the target that stored it ({target.key}) is down")
        return Plan(table, ModelRoute(binding.model, (target,)), (target,))

    def keeps(self, exchange: Exchange) -> bool:
        """Whether ``exchange``'s answer is a response the provider keeps (a translated
        one is not: its target keeps no Responses)."""
        return (exchange.endpoint.operation.name in _CREATING
                and bool(exchange.payload) and exchange.payload.get("store") is not False
                and exchange.crossing.translation is None)

    async def remember(self, exchange: Exchange) -> None:
        """Bind the response ``exchange`` created to its caller (once its id is known)."""
        facts, target, key = exchange.facts, exchange.target, exchange.key
        if (facts is None or not facts.response_id or target is None
                or (exchange.status or 0) >= 400):
            return
        key_id = None if key.id.startswith("subject:") else key.id  # a JWT caller has none
        await self.owners.bind(ResponseBinding.new(
            facts.response_id, key.subject_id, key_id, target.provider, target.model,
            now=self._clock(), retention_days=self._retention_days))

    async def after(self, exchange: Exchange) -> None:
        """What a whole answer changes (a response kept, one deleted); a store that fails
        is logged: the answer goes all the same (the id then answers 404 to its owner
        until it is bound, which is the provider's answer for an id it does not keep)."""
        try:
            if self.keeps(exchange):
                exchange.observe_body()
                await self.remember(exchange)
            await self.forgotten(exchange)
        except Exception as exc:
            log.warning("binding a stored response to its caller failed: %s",
                        type(exc).__name__)

    async def forgotten(self, exchange: Exchange) -> None:
        """A stored response the provider deleted: its binding goes too."""
        if exchange.endpoint.operation.name == "responses.delete" and exchange.status == 200:
            resource = matches(exchange.endpoint.path, exchange.request.path.rstrip("/"))
            if resource:
                await self.owners.forget(resource)
