"""The pipelined script client the limiter and the ledger run on: replies matched in order,
calls of one turn in one write, deferred calls carried by the next, credentials and
databases from the URL, and what happens when Redis restarts, hangs or is not there."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llm_gateway.config import load_settings
from llm_gateway.redis_scripts import RedisScripts, Script
from tests.support import PrivateRedis, closed_port, free_port, private_redis, redis_reachable

ECHO = Script("return ARGV[1]")
INCR = Script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
# Keeps Redis busy for a while (tens of milliseconds): a call under way.
BUSY = Script("local n = 0 for i = 1, 10000000 do n = n + 1 end return n")
FAILS = Script("return redis.error_reply('BUDGET the script said no')")


class CountingWrites:
    """Counts the writes of the client's connection."""

    def __init__(self, scripts: RedisScripts) -> None:
        pipe = scripts._pipe
        assert pipe is not None and pipe._transport is not None
        self.writes = 0
        transport = pipe._transport
        original = transport.write

        def write(data: bytes) -> None:
            self.writes += 1
            original(data)

        transport.write = write  # type: ignore[method-assign]


def test_replies_reach_their_callers_in_order_under_concurrency(tmp_path: Path) -> None:
    with private_redis(tmp_path) as server:
        async def run() -> None:
            scripts = RedisScripts(server.url)
            try:
                replies = await asyncio.gather(
                    *(scripts.run(ECHO, [], [str(n)]) for n in range(500)))
                assert replies == [str(n).encode() for n in range(500)]
                assert scripts.script_loads == 1  # NOSCRIPT once, then cached
            finally:
                await scripts.close()

        asyncio.run(run())


def test_calls_of_one_turn_share_a_write_and_deferred_ones_ride_along(tmp_path: Path) -> None:
    with private_redis(tmp_path) as server:
        async def run() -> None:
            scripts = RedisScripts(server.url)
            try:
                for script in (INCR, BUSY):  # loaded: no NOSCRIPT round below
                    await scripts.run(script, ["{t}b"], [1])
                counter = CountingWrites(scripts)
                await asyncio.gather(scripts.run(INCR, ["{t}a"], [1]),
                                     scripts.run(INCR, ["{t}a"], [2]))
                assert counter.writes == 1
                # On an idle connection a deferred call goes at once...
                assert await scripts.run(INCR, ["{t}a"], [10], grace=30) == 13
                assert counter.writes == 2
                # ... but while calls are under way it waits for the next call's write...
                slow = asyncio.ensure_future(scripts.run(BUSY, [], []))
                await asyncio.sleep(0.005)  # written, and Redis busy with it
                deferred = asyncio.ensure_future(scripts.run(INCR, ["{t}a"], [100], grace=30))
                await asyncio.sleep(0)
                assert counter.writes == 3 and not deferred.done()
                assert await scripts.run(INCR, ["{t}a"], [1000]) == 1113
                assert await deferred == 113 and counter.writes == 4
                await slow
                # ... or for its grace to end, whichever comes first.
                slow = asyncio.ensure_future(scripts.run(BUSY, [], []))
                await asyncio.sleep(0.005)  # written, and Redis busy with it
                assert await scripts.run(INCR, ["{t}a"], [5], grace=0.05) == 1118
                assert counter.writes == 6
                await slow
                # Closing writes what is deferred and waits for its reply.
                slow = asyncio.ensure_future(scripts.run(BUSY, [], []))
                await asyncio.sleep(0.005)  # written, and Redis busy with it
                late = asyncio.ensure_future(scripts.run(INCR, ["{t}a"], [5], grace=30))
                await asyncio.sleep(0)
                await scripts.close()
                assert await late == 1123
                await slow
            finally:
                await scripts.close()

        asyncio.run(run())
        assert int(redis.Redis.from_url(server.url).get("{t}a") or 0) == 1123


def test_a_script_error_is_raised_and_the_connection_stays(tmp_path: Path) -> None:
    with private_redis(tmp_path) as server:
        async def run() -> None:
            scripts = RedisScripts(server.url)
            try:
                with pytest.raises(ResponseError, match="the script said no"):
                    await scripts.run(FAILS, [], [])
                pipe = scripts._pipe
                assert await scripts.run(ECHO, [], ["still"]) == b"still"
                assert scripts._pipe is pipe
            finally:
                await scripts.close()

        asyncio.run(run())


def test_a_restarted_redis_is_used_again_at_the_next_call(tmp_path: Path) -> None:
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        async def run() -> None:
            scripts = RedisScripts(server.url)
            try:
                assert await scripts.run(INCR, ["{r}n"], [1]) == 1
                server.stop()  # killed: the connection breaks, the script cache is gone
                server.start()
                # The old connection is found broken and the call is made again on a new
                # one; the script is loaded again (NOSCRIPT).
                assert await scripts.run(INCR, ["{r}n"], [1]) == 1
                assert scripts.script_loads == 2
            finally:
                await scripts.close()

        asyncio.run(run())
    finally:
        server.stop()


def test_credentials_and_database_come_from_the_url(tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path), "--requirepass", "s3cret-pass"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://:s3cret-pass@127.0.0.1:{port}/3"
    try:
        deadline = time.monotonic() + 10
        while not redis_reachable(url):
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)

        async def run() -> None:
            scripts = RedisScripts(url)
            wrong = RedisScripts(f"redis://:not-it@127.0.0.1:{port}/0")
            try:
                assert await scripts.run(INCR, ["{d}n"], [7]) == 7
                with pytest.raises(RedisConnectionError) as refused:
                    await wrong.ping()
                assert "not-it" not in str(refused.value)
                assert "s3cret" not in str(refused.value)
            finally:
                await scripts.close()
                await wrong.close()

        asyncio.run(run())
        assert redis.Redis.from_url(url).get("{d}n") == b"7"
        assert redis.Redis.from_url(url.replace("/3", "/0")).get("{d}n") is None
    finally:
        process.kill()
        process.wait(10)


def test_a_unix_socket_url_reaches_redis_over_its_socket(tmp_path: Path) -> None:
    """REDIS_URL=unix:///path (redis-py's form: no host) is a setting the gateway takes, and
    the script client talks to Redis over that socket."""
    with private_redis(tmp_path) as server:
        settings = load_settings({"REDIS_URL": server.socket_url})
        assert settings.redis_url == server.socket_url

        async def run() -> None:
            scripts = RedisScripts(settings.redis_url)
            try:
                assert await scripts.run(ECHO, [], ["over the socket"]) == b"over the socket"
            finally:
                await scripts.close()

        asyncio.run(run())


def test_nothing_listening_fails_at_once() -> None:
    async def run() -> None:
        scripts = RedisScripts(f"redis://127.0.0.1:{closed_port()}/0")
        started = time.monotonic()
        with pytest.raises(RedisConnectionError, match="not reachable"):
            await scripts.run(ECHO, [], ["x"])
        assert time.monotonic() - started < 1.5

    asyncio.run(run())


def test_a_redis_that_does_not_answer_times_out_every_waiting_call() -> None:
    async def run() -> None:
        accepted: list[asyncio.StreamWriter] = []

        async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)  # reads nothing, answers nothing

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        scripts = RedisScripts(f"redis://127.0.0.1:{port}/0", reply_timeout=0.2)
        try:
            started = time.monotonic()
            outcomes = await asyncio.gather(*(scripts.run(ECHO, [], [str(n)])
                                              for n in range(5)), return_exceptions=True)
            assert all(isinstance(o, RedisTimeoutError) for o in outcomes), outcomes
            assert time.monotonic() - started < 1.5
            assert len(accepted) == 1  # one connection for all five
            # The next call opens a new connection (and waits on it again).
            with pytest.raises(RedisTimeoutError):
                await scripts.run(ECHO, [], ["again"])
            assert len(accepted) == 2
        finally:
            await scripts.close()
            server.close()
            for writer in accepted:
                writer.close()

    asyncio.run(run())
