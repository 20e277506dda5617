"""Where a Sentinel-managed primary is: asked of the sentinels at each (re)connection.

Each sentinel in turn (the one that answered last first) is asked
``SENTINEL get-master-addr-by-name <service>`` on a short connection of its own; the first
address one gives is the primary's. A sentinel that is down, or does not know the
service, is passed over; when none answers, the call fails as Redis being down does
(``NotConnected``), and the failure policies answer it. Sentinels are asked without
credentials (Sentinel's own ``requirepass`` is not supported).
"""

from __future__ import annotations

import asyncio
from typing import Any

import hiredis
from redis.exceptions import ResponseError

from llm_gateway.redis_scripts.pipe import (
    CONNECT_TIMEOUT_SECONDS,
    Address,
    NotConnected,
    _Pipe,
)


class SentinelLocator:
    def __init__(self, sentinels: tuple[Address, ...], service: str, *,
                 timeout: float = CONNECT_TIMEOUT_SECONDS) -> None:
        self._sentinels = list(sentinels)
        self._service = service
        self._timeout = timeout
        self.asked = 0  # how often the sentinels were asked: tests, diagnostics

    async def __call__(self) -> Address:
        """The primary's address, as the first sentinel that knows it says."""
        self.asked += 1
        failures = []
        for index, sentinel in enumerate(list(self._sentinels)):
            try:
                reply = await asyncio.wait_for(self._ask(sentinel), self._timeout)
            except (OSError, TimeoutError, ResponseError, NotConnected) as exc:
                failures.append(f"{sentinel[0]}:{sentinel[1]}: {type(exc).__name__}")
                continue
            if not reply:
                failures.append(f"{sentinel[0]}:{sentinel[1]}: does not know the service")
                continue
            if index:  # ask the one that answered first next time
                self._sentinels.insert(0, self._sentinels.pop(index))
            return reply[0].decode(), int(reply[1])
        raise NotConnected(f"no sentinel gave the primary of {self._service!r} "
                           f"({'; '.join(failures)})")

    async def _ask(self, sentinel: Address) -> Any:
        loop = asyncio.get_running_loop()
        _, pipe = await loop.create_connection(lambda: _Pipe(self._timeout), *sentinel)
        try:
            reply = await pipe.call(hiredis.pack_command(
                ("SENTINEL", "get-master-addr-by-name", self._service)))
        finally:
            pipe.abort(NotConnected("asked"))
        if isinstance(reply, ResponseError):
            raise reply
        return reply
