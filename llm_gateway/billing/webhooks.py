"""Budget alerts to webhooks, off the request path: per webhook a bounded queue in memory,
drained by one task of its own, so a webhook that hangs or is gone delays only its own
alerts and never a request (the request path only puts on a queue, never waits).

Each alert is POSTed as JSON (``content-type: application/json``), signed as
llm_gateway.billing.alerts says (``x-llm-gateway-signature: t=<ts>,v1=<hex>``, signed anew
for every attempt), with a short timeout; anything but a 2xx answer, a timeout or a
connection that fails is tried again after a backoff doubling from a second (at most a
minute) until ``ATTEMPTS`` attempts are spent, then counted and logged as failed. A queue
that is full drops the alert (counted; logged the first time, not for each alert). Redirects
are not followed. Logs name a webhook by its origin only: its path may be a credential.

httpx is imported when the first webhook starts (a gateway without webhooks never loads it).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from llm_gateway.billing.alerts import SIGNATURE_HEADER, Webhook, backoff, signature

log = logging.getLogger("llm_gateway.alerts")

QUEUE_SIZE = 100  # alerts waiting per webhook
ATTEMPTS = 5
TIMEOUT_SECONDS = 5.0
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 60.0
CLOSE_GRACE_SECONDS = 1.0  # what a stopping gateway gives alerts under way
OUTCOMES = ("delivered", "retried", "failed", "dropped")

# (url, body, headers) -> the answer's status; raises for no answer (a timeout, a refusal).
Post = Callable[[str, bytes, dict[str, str]], Awaitable[int]]


class WebhookSender:
    def __init__(self, webhooks: Sequence[Webhook], *, post: Post | None = None,
                 queue_size: int = QUEUE_SIZE, attempts: int = ATTEMPTS,
                 timeout: float = TIMEOUT_SECONDS, backoff_base: float = BACKOFF_BASE_SECONDS,
                 backoff_cap: float = BACKOFF_CAP_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        self.webhooks = tuple(webhooks)
        self.outcomes: collections.Counter[str] = collections.Counter()
        self._post = post
        self._queue_size = queue_size
        self._attempts = attempts
        self._timeout = timeout
        self._backoff = (backoff_base, backoff_cap)
        self._clock = clock
        self._queues: list[asyncio.Queue[bytes]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._dropping: set[int] = set()  # webhooks whose full queue was logged
        self._client: Any = None
        self._delivering = 0

    def start(self) -> None:
        if self._tasks or not self.webhooks:
            return
        if self._post is None:
            import httpx

            self._client = httpx.AsyncClient(timeout=self._timeout, follow_redirects=False)
            self._post = self._httpx_post
        loop = asyncio.get_running_loop()
        self._queues = [asyncio.Queue(self._queue_size) for _ in self.webhooks]
        self._tasks = [loop.create_task(self._drain(hook, queue))
                       for hook, queue in zip(self.webhooks, self._queues, strict=True)]

    def send(self, payload: dict[str, Any]) -> None:
        """Queue ``payload`` for every webhook; never waits (a full queue drops it)."""
        self.start()  # on the running loop, once
        body = json.dumps(payload, separators=(",", ":")).encode()
        for index, queue in enumerate(self._queues):
            try:
                queue.put_nowait(body)
            except asyncio.QueueFull:
                self.outcomes["dropped"] += 1
                if index not in self._dropping:
                    self._dropping.add(index)
                    log.warning("budget alerts for %s are dropped: %d are waiting already "
                                "(counted in llm_gateway_budget_alert_deliveries_total"
                                "{outcome=\"dropped\"})", self.webhooks[index].origin,
                                self._queue_size)

    def pending(self) -> int:
        """Alerts queued or being delivered."""
        return sum(queue.qsize() for queue in self._queues) + self._delivering

    async def close(self, grace: float = CLOSE_GRACE_SECONDS) -> None:
        """Stop, after up to ``grace`` seconds for what is queued (the rest is dropped)."""
        if self._queues and self.pending():
            waits = [asyncio.ensure_future(queue.join()) for queue in self._queues]
            _, late = await asyncio.wait(waits, timeout=grace)
            for wait in late:
                wait.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _drain(self, hook: Webhook, queue: asyncio.Queue[bytes]) -> None:
        while True:
            body = await queue.get()
            self._delivering += 1
            try:
                await self._deliver(hook, body)
            except Exception:  # never the end of this webhook's deliveries
                log.exception("delivering a budget alert to %s failed", hook.origin)
                self.outcomes["failed"] += 1
            finally:
                self._delivering -= 1
                queue.task_done()

    async def _deliver(self, hook: Webhook, body: bytes) -> None:
        why = ""
        for attempt in range(1, self._attempts + 1):
            if attempt > 1:
                self.outcomes["retried"] += 1
                await asyncio.sleep(backoff(attempt - 1, *self._backoff))
            headers = {"content-type": "application/json", "user-agent": "llm-gateway",
                       SIGNATURE_HEADER: signature(hook.secret, body, int(self._clock()))}
            try:
                assert self._post is not None
                status = await asyncio.wait_for(self._post(hook.url, body, headers),
                                                self._timeout)
            except Exception as exc:  # no answer: a timeout, a refused connection
                why = type(exc).__name__
                continue
            if 200 <= status < 300:
                self.outcomes["delivered"] += 1
                return
            why = f"HTTP {status}"
        self.outcomes["failed"] += 1
        log.warning("a budget alert was not delivered to %s after %d attempts (last: %s)",
                    hook.origin, self._attempts, why)

    async def _httpx_post(self, url: str, body: bytes, headers: dict[str, str]) -> int:
        response = await self._client.post(url, content=body, headers=headers)
        return int(response.status_code)
