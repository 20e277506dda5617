"""Serving an ASGI app of the gateway's (``serve``, ``demo``) on uvicorn: the one place its
server settings live."""

from __future__ import annotations

import uvicorn

from llm_gateway.config import Settings


def run_server(app: object, settings: Settings) -> None:
    # No access log: per-request logging costs CPU on the hot path, and usage records
    # already hold what an access log would (without prompts or keys).
    uvicorn.run(
        app,  # type: ignore[arg-type]
        host=settings.bind_host,
        port=settings.bind_port,
        access_log=False,
        # Nothing reads the client address, and no uvicorn banner goes to clients.
        proxy_headers=False,
        server_header=False,
        lifespan="on",
        log_level="info",
        timeout_graceful_shutdown=10,
    )
