"""Test plumbing: real servers on real sockets, in threads or subprocesses."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

from llm_gateway.keys import KeyRecord, new_key_record
from llm_gateway.stores.sqlite import SqliteStore

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def need_service(what: str, reachable: bool) -> None:
    """Outside CI a missing service skips with the reason; in CI it fails the test."""
    if reachable:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{what} is not reachable, and CI requires it")
    pytest.skip(f"{what} is not reachable (start it, or run in CI where it is required)")


@contextmanager
def serve_in_thread(app: object, host: str = "127.0.0.1") -> Iterator[str]:
    """Run an ASGI app on uvicorn in a background thread; yields its base URL."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(
        app, lifespan="on", log_level="warning", access_log=False  # type: ignore[arg-type]
    ))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.005)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()


def create_key(database_url: str, **options: object) -> tuple[KeyRecord, str]:
    """Insert a key straight into a SQLite store (what `keys create` does)."""

    async def work() -> tuple[KeyRecord, str]:
        store = SqliteStore.from_url(database_url)
        try:
            await store.migrate()
            record, key = new_key_record(
                name=str(options.pop("name", "test")), subject_id=None, now=time.time(),
                **options,  # type: ignore[arg-type]
            )
            await store.insert_key(record)
            return record, key
        finally:
            await store.close()

    return asyncio.run(work())


@contextmanager
def gateway_process(
    env: dict[str, str], *args: str, ready_path: str = "/healthz", port: int | None = None
) -> Iterator[str]:
    """Run `llm-gateway serve` (or another subcommand) as a real process; yields its URL."""
    port = port or free_port()
    full_env = {**os.environ, "BIND_ADDR": f"127.0.0.1:{port}", **env}
    command = [str(BIN / "llm-gateway"), *(args or ("serve",))]
    process = subprocess.Popen(
        command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(base + ready_path, process)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def wait_until_up(url: str, process: subprocess.Popen[str] | None = None,
                  timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            output = process.stdout.read() if process.stdout else ""
            raise AssertionError(f"process exited with {process.returncode}:\n{output}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} did not come up in {timeout}s")
