"""One pipelined connection to one Redis server (``Node``), for Lua scripts on the request
path: frames out in call order, replies matched to callers in the same order.

One connection per server suffices: Redis runs commands one at a time anyway, and a
pipelined connection carries well over 100 000 calls a second. It is opened at the first
call and again after it breaks; while calls wait on it, no reply for ``reply_timeout``
drops it (every call waiting on it fails: Redis is not answering). A call that finds its
connection already gone is tried once more on a new one (a Redis restart closes the old
one); a call whose connection breaks after it was written is not (the script may have
run). Failing to open a connection raises ``NotConnected``: nothing was sent, so a caller
that knows another server (a Cluster's new slot owner) may send it there.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import hiredis
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

CONNECT_TIMEOUT_SECONDS = 1.0
# A busy replica's event loop can leave a reply unread for a good part of a second; a
# shorter timeout would wrongly declare Redis down.
REPLY_TIMEOUT_SECONDS = 2.0

Address = tuple[str, int]
# Where the node is now (a Sentinel's answer), asked at every (re)connection.
Locate = Callable[[], Awaitable[Address]]


class NotConnected(RedisConnectionError):
    """No connection could be opened: nothing was sent, the call may go elsewhere."""


def reply_error(reply: Any, *prefixes: str) -> bool:
    """Whether ``reply`` is an error reply starting with one of ``prefixes``."""
    return isinstance(reply, ResponseError) and str(reply).startswith(prefixes)


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA1, by which Redis caches it."""

    text: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.text.encode()).hexdigest())


class _Pipe(asyncio.Protocol):
    """One connection: frames out in call order, replies back to the waiting calls in the
    same order (Redis answers a connection's commands in order)."""

    def __init__(self, reply_timeout: float = REPLY_TIMEOUT_SECONDS) -> None:
        self._reply_timeout = reply_timeout
        self._replies = 0  # replies read so far: the watchdog's evidence of life
        self._watchdog: asyncio.TimerHandle | None = None
        self._reader = hiredis.Reader(replyError=ResponseError)
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._transport: asyncio.Transport | None = None
        self.closed = False
        self._lost: Exception = RedisConnectionError("Redis closed the connection")
        # Frames not written yet, and when they will be: at once (the calls made in one
        # turn of the loop share a write), or after a deferred call's grace.
        self._outgoing: list[bytes] = []
        self._flush: asyncio.Handle | None = None
        self._flush_soon = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        waiting = self._waiting
        while (reply := self._reader.gets()) is not False:
            if not waiting:  # a reply nobody asked for: the stream is out of step
                self.abort(RedisConnectionError("Redis sent a reply nobody asked for"))
                return
            self._replies += 1
            future = waiting.popleft()
            if not future.done():  # a caller that timed out is gone; its reply too
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for handle in (self._flush, self._watchdog):
            if handle is not None:
                handle.cancel()
        failure = self._lost
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(failure)

    def call(self, frame: bytes, grace: float = 0.0) -> asyncio.Future[Any]:
        """Send ``frame``; its reply, when it comes. With a ``grace``, the frame may wait
        that long for another call to share its write, if calls are under way."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._waiting:
            # Idle: nothing will come to share the write soon, and Redis had better run
            # this now than before the next request's scripts (measured: c=1 faster).
            grace = 0.0
        self._waiting.append(future)
        self._outgoing.append(frame)
        if not grace:
            if not self._flush_soon:
                if self._flush is not None:
                    self._flush.cancel()
                self._flush, self._flush_soon = loop.call_soon(self.write), True
        elif self._flush is None:
            self._flush = loop.call_later(grace, self.write)
        if self._watchdog is None:
            self._watchdog = loop.call_later(self._reply_timeout, self._watch, self._replies)
        return future

    def _watch(self, replies_before: int) -> None:
        """While calls wait, some reply must come within the reply timeout (Redis answers
        in order, one command at a time): else Redis is not answering, and the connection
        is dropped. One timer per connection, not one per call: this is every request's
        path."""
        self._watchdog = None
        if not self._waiting or self.closed:
            return
        if self._replies == replies_before:
            self.abort(RedisTimeoutError(f"Redis did not answer within {self._reply_timeout:g}s"))
            return
        self._watchdog = asyncio.get_running_loop().call_later(
            self._reply_timeout, self._watch, self._replies)

    def write(self) -> None:
        """Write every frame waiting to go, in one write."""
        if self._flush is not None:
            self._flush.cancel()
        self._flush, self._flush_soon = None, False
        if self._outgoing and not self.closed and self._transport is not None:
            self._transport.write(b"".join(self._outgoing))
        self._outgoing.clear()

    def pending(self) -> list[asyncio.Future[Any]]:
        return [future for future in self._waiting if not future.done()]

    def abort(self, why: Exception) -> None:
        """Drop the connection; every call still waiting fails with ``why``."""
        self._lost = why
        self.closed = True
        if self._transport is not None:
            self._transport.abort()  # connection_lost follows, on the loop




ASKING = hiredis.pack_command(("ASKING",))


class Node:
    """The connection to one server (``options``: redis-py's parse_url keys; ``locate``,
    when given, says where the server is each time a connection is opened), and the
    scripts it has loaded. ``primary_only``: a server that is not a primary (a Sentinel's
    stale answer, a primary since demoted) is refused at the handshake."""

    def __init__(self, options: dict[str, Any], locate: Locate | None = None, *,
                 connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
                 reply_timeout: float = REPLY_TIMEOUT_SECONDS, primary_only: bool = False,
                 on_load: Callable[[], None] = lambda: None) -> None:
        self._options = options
        self._locate = locate
        self._connect_timeout = connect_timeout
        self._reply_timeout = reply_timeout
        self._primary_only = primary_only
        self._on_load = on_load
        self.pipe: _Pipe | None = None
        self._connecting: asyncio.Future[_Pipe] | None = None
        self._loading: dict[str, asyncio.Future[Any]] = {}

    async def run(self, script: Script, frame: bytes, grace: float = 0.0, *,
                  asking: bool = False) -> Any:
        """The reply to ``frame`` (an EVALSHA of ``script``), loading the script if the
        server lost it; an error reply is returned, not raised. ``asking``: after an
        ``ASKING`` (a Cluster slot being migrated here)."""
        reply = await self._send(frame, grace, asking)
        if reply_error(reply, "NOSCRIPT"):
            # The server lost its script cache (restart, failover, SCRIPT FLUSH).
            await self._load(script)
            reply = await self._send(frame, 0.0, asking)
            if reply_error(reply, "NOSCRIPT"):
                raise NoScriptError(str(reply))
        return reply

    async def _send(self, frame: bytes, grace: float, asking: bool) -> Any:
        if not asking:
            return await self.call(frame, grace)
        pipe = await self._connected()
        asked = pipe.call(ASKING)  # the same write: nothing comes between the two
        reply = await pipe.call(frame)
        await asked
        return reply

    async def close(self) -> None:
        """Close the connection, once the calls made on it have their replies (a deferred
        call is written now)."""
        pipe, self.pipe = self.pipe, None
        if pipe is not None and not pipe.closed:
            await self._close(pipe)

    def retire(self) -> None:
        """Stop using the connection (its server is no longer the one to use): the next
        call opens a new one; the calls already on it get their replies first."""
        pipe, self.pipe = self.pipe, None
        if pipe is not None and not pipe.closed:
            task = asyncio.ensure_future(self._close(pipe))
            task.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def _close(self, pipe: _Pipe) -> None:
        pipe.write()
        if pending := pipe.pending():
            await asyncio.wait(pending, timeout=self._reply_timeout)
        pipe.abort(RedisConnectionError("the client was closed"))

    async def _load(self, script: Script) -> None:
        """Load ``script``; the calls that found it missing together share one load."""
        loading = self._loading.get(script.sha)
        if loading is None:
            loading = self._loading[script.sha] = asyncio.ensure_future(
                self.call(hiredis.pack_command(("SCRIPT", "LOAD", script.text))))
            loading.add_done_callback(lambda _: self._loading.pop(script.sha, None))
            self._on_load()
        sha = await asyncio.shield(loading)
        if isinstance(sha, ResponseError):
            raise sha

    async def call(self, frame: bytes, grace: float = 0.0) -> Any:
        pipe = self.pipe
        fresh = pipe is None or pipe.closed
        if fresh:
            pipe = await self._connected()
        assert pipe is not None
        try:
            return await pipe.call(frame, grace)  # its watchdog bounds the wait
        except RedisConnectionError:
            if fresh:
                raise
        # A connection that had broken unnoticed (a Redis restart closes it): once more on
        # a new one, as redis-py retries a broken connection. Never after a timeout.
        return await (await self._connected()).call(frame)

    async def _connected(self) -> _Pipe:
        """The open connection, opened now if there is none; callers that arrive while it
        is being opened share it. Failing to open one raises NotConnected."""
        if self.pipe is not None and not self.pipe.closed:
            return self.pipe
        if self._connecting is not None:
            return await asyncio.shield(self._connecting)
        connecting = self._connecting = asyncio.get_running_loop().create_future()
        try:
            pipe = await asyncio.wait_for(self._open(), self._connect_timeout)
        except BaseException as exc:
            if isinstance(exc, TimeoutError):
                failure: Exception = NotConnected("Redis did not accept a connection "
                                                  f"within {self._connect_timeout:g}s")
            elif isinstance(exc, OSError):
                failure = NotConnected(f"Redis is not reachable: {exc}")
            elif isinstance(exc, RedisConnectionError):
                failure = exc if isinstance(exc, NotConnected) else NotConnected(str(exc))
            else:  # cancelled, or a bug: whoever shares the attempt fails too
                failure = NotConnected(f"opening the connection failed: {exc!r}")
            connecting.set_exception(failure)
            connecting.exception()  # retrieved here: no "never retrieved" warning
            if failure is exc or not isinstance(exc, Exception):
                raise
            raise failure from exc
        finally:
            self._connecting = None
        self.pipe = pipe
        connecting.set_result(pipe)
        return pipe

    async def _open(self) -> _Pipe:
        options = self._options
        loop = asyncio.get_running_loop()

        def new_pipe() -> _Pipe:
            return _Pipe(self._reply_timeout)

        if options.get("connection_class") is UnixDomainSocketConnection:
            _, pipe = await loop.create_unix_connection(new_pipe, options["path"])
        else:
            tls = None
            if options.get("connection_class") is SSLConnection:
                tls = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
                if str(options.get("ssl_cert_reqs", "required")).lower() in ("none", "0"):
                    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
            host, port = (await self._locate() if self._locate is not None else
                          (options.get("host", "localhost"), int(options.get("port", 6379))))
            _, pipe = await loop.create_connection(new_pipe, host, port, ssl=tls)
        try:
            await self._handshake(pipe)
        except BaseException:
            pipe.abort(RedisConnectionError("handshake failed"))
            raise
        return pipe

    async def _handshake(self, pipe: _Pipe) -> None:
        options = self._options
        handshake = []
        if options.get("password") is not None:
            credentials = ([options["username"]] if options.get("username") else []) + [
                options["password"]]
            handshake.append(pipe.call(hiredis.pack_command(("AUTH", *credentials))))
        if options.get("db"):
            handshake.append(pipe.call(hiredis.pack_command(("SELECT", options["db"]))))
        if self._primary_only:
            handshake.append(pipe.call(hiredis.pack_command(("ROLE",))))
        replies = await asyncio.gather(*handshake)
        for reply in replies:
            if isinstance(reply, ResponseError):
                # Redis's own words (never the password): "WRONGPASS ...", "NOAUTH ...".
                raise RedisConnectionError(f"Redis refused the connection: {reply}")
        if self._primary_only and replies[-1][0] != b"master":
            raise RedisConnectionError("the server named as the primary is a "
                                       f"{replies[-1][0].decode()} (a failover under way)")
