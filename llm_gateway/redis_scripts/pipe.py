"""Lua scripts on Redis, on the request path: one pipelined connection, no pool.

The limiter takes, and the budget ledger reserves and settles, with one script call per
request each. Through redis-py's asyncio client a call costs about 135 µs of CPU on the
gateway's loop (a pooled connection checked out and back, a timeout context, a retry
wrapper, generic command packing and parsing): more than all of the engine's own work for
that request. This client only writes EVALSHA frames (packed by hiredis, the parser
redis-py uses too) on one connection and matches replies to callers in order, so a call
costs about the round trip's loop wake-up (measured: 26 µs of CPU under uvloop), and
concurrent calls share a write and a read. redis-py stays for everything off the request
path (shared health, tests, the CLI) and as the vocabulary of errors: callers catch
``redis.exceptions`` as before.

One connection suffices: Redis runs commands one at a time anyway, and a pipelined
connection carries well over 100 000 calls a second. It is opened at the first call and
again after it breaks; while calls wait on it, no reply for ``reply_timeout`` drops it
(every call waiting on it fails: Redis is not answering). A call that finds its connection
already gone is tried once more on a new one (a Redis restart closes the old one); a call
whose connection breaks after it was written is not (the script may have run).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import ssl
from dataclasses import dataclass, field
from typing import Any

import hiredis
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

CONNECT_TIMEOUT_SECONDS = 1.0
# A busy replica's event loop can leave a reply unread for a good part of a second; a
# shorter timeout would wrongly declare Redis down.
REPLY_TIMEOUT_SECONDS = 2.0


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


class RedisScripts:
    """Runs scripts on the Redis at ``url`` (``redis://``, ``rediss://`` or ``unix://``,
    with the user, password and database they name)."""

    def __init__(self, url: str, *, connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
                 reply_timeout: float = REPLY_TIMEOUT_SECONDS) -> None:
        self._options = parse_url(url)
        self._connect_timeout = connect_timeout
        self._reply_timeout = reply_timeout
        self._pipe: _Pipe | None = None
        self._connecting: asyncio.Future[_Pipe] | None = None
        self._loading: dict[str, asyncio.Future[Any]] = {}
        self.script_loads = 0  # how often a script was (re)loaded: tests, diagnostics

    async def run(self, script: Script, keys: list[str], args: list[Any], *,
                  grace: float = 0.0) -> Any:
        """The script's reply. Raises redis-py's ConnectionError or TimeoutError when Redis
        does not answer, and ResponseError for an error the script raised. ``grace``: how
        long the call may wait to share a write with later calls while others are under
        way (for work no request waits on: the next call carries it, or the grace's end
        does)."""
        frame = hiredis.pack_command(("EVALSHA", script.sha, len(keys), *keys, *args))
        reply = await self._call(frame, grace)
        if isinstance(reply, ResponseError):
            if not str(reply).startswith("NOSCRIPT"):
                raise reply
            # The server lost its script cache (restart, failover, SCRIPT FLUSH).
            await self._load(script)
            reply = await self._call(frame)
            if isinstance(reply, ResponseError):
                raise NoScriptError(str(reply)) if str(reply).startswith("NOSCRIPT") else reply
        return reply

    async def ping(self) -> None:
        reply = await self._call(b"*1\r\n$4\r\nPING\r\n")
        if isinstance(reply, ResponseError):
            raise reply

    async def close(self) -> None:
        """Close the connection, once the calls made on it have their replies (a deferred
        call is written now)."""
        pipe, self._pipe = self._pipe, None
        if pipe is None or pipe.closed:
            return
        pipe.write()
        if pending := pipe.pending():
            await asyncio.wait(pending, timeout=self._reply_timeout)
        pipe.abort(RedisConnectionError("the client was closed"))

    async def _load(self, script: Script) -> None:
        """Load ``script``; the calls that found it missing together share one load."""
        loading = self._loading.get(script.sha)
        if loading is None:
            loading = self._loading[script.sha] = asyncio.ensure_future(
                self._call(hiredis.pack_command(("SCRIPT", "LOAD", script.text))))
            loading.add_done_callback(lambda _: self._loading.pop(script.sha, None))
            self.script_loads += 1
        sha = await asyncio.shield(loading)
        if isinstance(sha, ResponseError):
            raise sha

    async def _call(self, frame: bytes, grace: float = 0.0) -> Any:
        pipe = self._pipe
        fresh = pipe is None or pipe.closed
        if fresh:
            pipe = await self._connected()
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
        is being opened share it."""
        if self._pipe is not None and not self._pipe.closed:
            return self._pipe
        if self._connecting is not None:
            return await asyncio.shield(self._connecting)
        connecting = self._connecting = asyncio.get_running_loop().create_future()
        try:
            pipe = await asyncio.wait_for(self._open(), self._connect_timeout)
        except BaseException as exc:
            if isinstance(exc, TimeoutError):
                failure: Exception = RedisTimeoutError("Redis did not accept a connection "
                                                       f"within {self._connect_timeout:g}s")
            elif isinstance(exc, OSError):
                failure = RedisConnectionError(f"Redis is not reachable: {exc}")
            elif isinstance(exc, RedisConnectionError):
                failure = exc
            else:  # cancelled, or a bug: whoever shares the attempt fails too
                failure = RedisConnectionError(f"opening the connection failed: {exc!r}")
            connecting.set_exception(failure)
            connecting.exception()  # retrieved here: no "never retrieved" warning
            if failure is exc or not isinstance(exc, Exception):
                raise
            raise failure from exc
        finally:
            self._connecting = None
        self._pipe = pipe
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
            _, pipe = await loop.create_connection(
                new_pipe, options.get("host", "localhost"), int(options.get("port", 6379)),
                ssl=tls)
        handshake = []
        if options.get("password") is not None:
            credentials = ([options["username"]] if options.get("username") else []) + [
                options["password"]]
            handshake.append(pipe.call(hiredis.pack_command(("AUTH", *credentials))))
        if options.get("db"):
            handshake.append(pipe.call(hiredis.pack_command(("SELECT", options["db"]))))
        for reply in await asyncio.gather(*handshake):
            if isinstance(reply, ResponseError):
                pipe.abort(RedisConnectionError("handshake refused"))
                # Redis's own words (never the password): "WRONGPASS ...", "NOAUTH ...".
                raise RedisConnectionError(f"Redis refused the connection: {reply}")
        return pipe

