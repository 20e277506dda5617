"""Serving the gateway's ASGI apps (``serve``, ``demo``) on uvicorn: the one place their
server settings live. Several listeners (the public one, the admin one) share one process
and one event loop, so they share the gateway too."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections.abc import Sequence

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from llm_gateway.adapters.connection_limits import connection_options
from llm_gateway.config import HostPort, Settings

log = logging.getLogger("llm_gateway")


def server_config(app: object, bind: HostPort, settings: Settings) -> uvicorn.Config:
    """uvicorn's settings for every listener of the gateway."""
    # No access log: per-request logging costs CPU on the hot path, and usage records
    # already hold what an access log would (without prompts or keys).
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=bind.host,
        port=bind.port,
        access_log=False,
        # Nothing reads the client address, and no uvicorn banner goes to clients.
        proxy_headers=False,
        server_header=False,
        lifespan="on",
        log_level="info",
        timeout_graceful_shutdown=10,
        # Slow, idle and oversized clients are reaped on every listener.
        **connection_options(settings),
    )


def _bind(bind: HostPort) -> socket.socket | None:
    """A listening socket for a side listener, or None (logged) when the address is taken:
    the public API must not go down because the admin port is."""
    family = socket.AF_INET6 if ":" in bind.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind.host, bind.port))
    except OSError as exc:
        sock.close()
        log.error("listener %s not started: %s (choose another address, or `off`)",
                  bind, exc.strerror)
        return None
    log.info("listening on http://%s", bind)
    return sock


def run_server(app: object, settings: Settings,
               also: Sequence[tuple[object, HostPort]] = ()) -> None:
    """Serve ``app`` on ``settings.bind`` and each ``(app, address)`` of ``also`` beside it,
    in one event loop, until a signal; when one listener stops, all do."""
    servers: list[tuple[uvicorn.Server, list[socket.socket] | None]] = [
        (uvicorn.Server(server_config(app, settings.bind, settings)), None)]
    for side_app, bind in also:
        sock = _bind(bind)
        if sock is not None:
            servers.append((uvicorn.Server(server_config(side_app, bind, settings)), [sock]))
    try:
        status = asyncio.run(_serve_all(servers),
                             loop_factory=servers[0][0].config.get_loop_factory())
    except KeyboardInterrupt:
        status = None
    finally:
        for _, sockets in servers:
            for sock in sockets or ():
                sock.close()
    if status is not None:
        sys.exit(status)
    if not servers[0][0].started:
        sys.exit(STARTUP_FAILURE)


async def _serve_all(servers: Sequence[tuple[uvicorn.Server, list[socket.socket] | None]],
                     ) -> int | str | None:
    """Every server until one stops; then the others. A server that cannot start calls
    sys.exit (a failed lifespan: 3); caught here, in its task, so the loop ends cleanly and
    the process exits with that status, not with a traceback."""

    async def serve(server: uvicorn.Server, sockets: list[socket.socket] | None,
                    ) -> int | str | None:
        try:
            await server.serve(sockets=sockets)
        except SystemExit as exc:
            return exc.code
        return None

    tasks = [asyncio.create_task(serve(server, sockets)) for server, sockets in servers]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for server, _ in servers:
        server.should_exit = True
    return next((status for status in await asyncio.gather(*tasks) if status), None)
