"""A realistic fake OpenAI/Venice/Anthropic-compatible upstream, shipped with the project.

It is used by the test-suite, by ``llm-gateway demo`` and by benchmarks, so it is a pure ASGI app
(no framework) that does no per-request logging and never sleeps unless a delay is configured.

What it speaks, under ``api_prefix`` (default ``/api/v1``, like ``https://api.venice.ai/api/v1``):

* ``POST /chat/completions`` -- JSON or SSE (``"stream": true``) replies with deterministic content
  (see :func:`fake_reply_text`), usage, and in ``usage_mode="venice"`` Venice's ``usage.cost``.
  A top-level field the imitated provider does not document is a 400, as it is for real.
  Per request, headers steer it: ``x-fake-chunks``, ``x-fake-chunk-delay-ms``, and
  ``x-fake-cached-tokens: N`` (usage reports N prompt tokens read from the prompt cache, as
  ``prompt_tokens_details.cached_tokens``; without it, no details, as for an uncached prompt).
  With function ``tools`` it calls one as the other modes do (``x-fake-tool-call``,
  ``tool_choice``; a turn answering a ``tool`` message ends with text), reasons when asked
  (``reasoning_effort``; Venice's ``reasoning_content``), and refuses tool messages that answer
  no call, as the providers do (see ``fake_chat_reply``).
* ``POST /embeddings`` -- deterministic unit vectors, ``float`` or ``base64`` encoded.
* ``GET /models`` -- a small Venice-like catalogue (:data:`FAKE_MODELS`).
* in ``usage_mode="openai"`` also OpenAI's Responses API: ``POST /responses`` (JSON or its named
  SSE events), the stored responses (``GET``/``DELETE /responses/{id}``, ``.../cancel``,
  ``.../input_items``), ``/responses/input_tokens`` and ``/responses/compact``
  (see ``fake_responses``).
* any other path under the prefix -- a 200 "billing" body carrying :data:`BILLING_SECRET`, so
  tests can prove a gateway never lets such a request through.

``usage_mode="anthropic"`` imitates Anthropic's API under ``/v1`` instead: ``POST /messages``
(JSON or its event stream, tools, thinking, prompt-cache usage), ``/messages/count_tokens`` and
``GET /models``, Anthropic's errors, ``request-id`` and required ``anthropic-version`` (see
``fake_anthropic``). Headers steer what a request gets there too (``x-fake-tool-call``,
``x-fake-cache-read-tokens``, ...), as the modules' docstrings list.

Its bill: the usage and cost report APIs of OpenAI, Anthropic and Venice, served from a ledger
of what it actually served and taking only the admin key, which can be told to over- or
under-bill (``fake_reports``, ``fake_ledger``; ``FakeUpstream(billing_skew=...)``).

Every endpoint requires ``Authorization: Bearer <api_key>`` (or the bare key in another header:
``FakeUpstream(auth_header="api-key")``; Anthropic's ``x-api-key`` in anthropic mode). Failures
are injected with :meth:`FakeUpstream.push_fault`; every request is recorded in
:attr:`FakeUpstream.requests`.

This module is the import path of everything public, and runs the fake on uvicorn; the parts
live beside it: ``fake_content`` (what it answers), ``fake_errors`` (how it refuses),
``fake_faults``, ``fake_exchange`` (one request), ``fake_stream`` (pacing every API's stream,
with its faults), ``fake_endpoints`` (chat, embeddings, models) with ``fake_chat_reply`` (chat's
tool calls and reasoning), ``fake_responses`` (with its
``_request``, ``_reply``, ``_stream`` and ``_store`` modules), ``fake_anthropic`` (with its
``_request`` and ``_reply``), ``fake_agent_reply`` (what those two APIs decide alike) and
``fake_app``.

Run it standalone with ``python -m llm_gateway.testing.fake_upstream --port 3001``. To answer
as a server that frames no body (no length, no chunks: it ends with the connection), serve it
with ``fake_close_delimited.running_close_delimited`` instead of ``running_fake_upstream``.
"""

import argparse
import asyncio
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from llm_gateway.testing.fake_anthropic import FAKE_CLAUDE_MODELS, ClaudeModel
from llm_gateway.testing.fake_app import USAGE_MODES, FakeUpstream
from llm_gateway.testing.fake_content import (
    BILLING_SECRET,
    DEFAULT_FAKE_ADMIN_KEY,
    DEFAULT_FAKE_API_KEY,
    FAKE_MODELS,
    FAKE_THINKING_TEXT,
    THINKING_TOKENS,
    TOOL_CALL_HEADER,
    TOOL_CALL_TOKENS,
    WORDS_PER_CHUNK,
    FakeModel,
    fake_cost,
    fake_reply_chunk,
    fake_reply_text,
)
from llm_gateway.testing.fake_exchange import RecordedRequest
from llm_gateway.testing.fake_faults import DeliberateConnectionCut, Fault

__all__ = [
    "BILLING_SECRET",
    "DEFAULT_FAKE_ADMIN_KEY",
    "DEFAULT_FAKE_API_KEY",
    "FAKE_CLAUDE_MODELS",
    "FAKE_MODELS",
    "FAKE_THINKING_TEXT",
    "THINKING_TOKENS",
    "TOOL_CALL_HEADER",
    "TOOL_CALL_TOKENS",
    "WORDS_PER_CHUNK",
    "ClaudeModel",
    "DeliberateConnectionCut",
    "FakeModel",
    "FakeUpstream",
    "Fault",
    "RecordedRequest",
    "fake_cost",
    "fake_reply_chunk",
    "fake_reply_text",
    "main",
    "running_fake_upstream",
    "serve_fake_upstream",
]


def _connection_counting_protocol(fake: FakeUpstream) -> type[asyncio.Protocol]:
    """uvicorn's default HTTP protocol (httptools, else h11), counting accepted connections."""

    class ConnectionCountingProtocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            fake.connections += 1
            super().connection_made(transport)

    return ConnectionCountingProtocol


def _listening_socket(host: str, port: int) -> socket.socket:
    # Bound here rather than by uvicorn so port 0 resolves to a real port before the server starts.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)


def _base_url(host: str, port: int, fake: FakeUpstream, scheme: str = "http") -> str:
    url_host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{url_host}:{port}{fake.api_prefix}"


def _uvicorn_server(fake: FakeUpstream, *, embedded: bool,
                    tls: tuple[Path, Path] | None = None) -> uvicorn.Server:
    config = uvicorn.Config(
        fake,
        # A provider is reached over HTTPS: (certificate, key) serves the fake that way.
        ssl_certfile=str(tls[0]) if tls else None, ssl_keyfile=str(tls[1]) if tls else None,
        http=_connection_counting_protocol(fake),
        ws="none",
        lifespan="off",
        access_log=False,
        log_level="warning",
        # Embedded in tests or the demo, the host process owns logging configuration.
        log_config=None if embedded else LOGGING_CONFIG,
        # A backstop only: waiting requests end early when their client hangs up.
        timeout_graceful_shutdown=3,
    )
    return uvicorn.Server(config)


@contextmanager
def running_fake_upstream(
    fake: FakeUpstream | None = None, host: str = "127.0.0.1", port: int = 0,
    tls: tuple[Path, Path] | None = None,
) -> Iterator[tuple[FakeUpstream, str]]:
    """Serve ``fake`` on uvicorn in a background thread; yield ``(fake, base_url)``.

    ``port=0`` picks a free port. ``base_url`` includes the API prefix, e.g.
    ``http://127.0.0.1:41234/api/v1``, ready for ``openai.OpenAI(base_url=...)`` (the
    anthropic SDK adds ``/v1`` itself: give it the URL without the prefix); with ``tls`` (a
    certificate and its key, PEM files) it is served over HTTPS.
    """
    fake = fake if fake is not None else FakeUpstream()
    listener = _listening_socket(host, port)
    bound_port: int = listener.getsockname()[1]
    server = _uvicorn_server(fake, embedded=True, tls=tls)
    startup_failures: list[BaseException] = []

    def serve() -> None:
        try:
            server.run(sockets=[listener])
        except BaseException as failure:  # SystemExit included: uvicorn exits on startup errors
            startup_failures.append(failure)

    thread = threading.Thread(target=serve, name=f"fake-upstream:{bound_port}", daemon=True)
    thread.start()
    try:
        give_up_at = time.monotonic() + 10
        while not server.started:
            if not thread.is_alive() or time.monotonic() > give_up_at:
                cause = startup_failures[0] if startup_failures else None
                raise RuntimeError("the fake upstream did not start") from cause
            time.sleep(0.002)
        yield fake, _base_url(host, bound_port, fake, "https" if tls else "http")
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        listener.close()


def serve_fake_upstream(host: str, port: int, **fake_options: Any) -> None:
    """Serve a new ``FakeUpstream(**fake_options)`` until interrupted (for a CLI subcommand).

    Recording defaults to off here: nobody holds the fake to read it, and a long benchmark run
    would otherwise keep every request in memory.
    """
    fake_options.setdefault("record", False)
    fake = FakeUpstream(**fake_options)
    listener = _listening_socket(host, port)
    base_url = _base_url(host, listener.getsockname()[1], fake)
    print(f"fake upstream listening on {base_url} (api key {fake.api_key})", file=sys.stderr)
    sys.stderr.flush()
    try:
        _uvicorn_server(fake, embedded=False).run(sockets=[listener])
    finally:
        listener.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m llm_gateway.testing.fake_upstream",
        description="Run the fake OpenAI/Venice/Anthropic-compatible upstream.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3001)
    parser.add_argument("--api-key", default=DEFAULT_FAKE_API_KEY)
    parser.add_argument(
        "--auth-header",
        default="authorization",
        help="header carrying the key: authorization (Bearer <key>) or one with the bare key",
    )
    parser.add_argument("--api-prefix", default=None,
                        help="default: the imitated API's (/api/v1; /v1 for anthropic)")
    parser.add_argument("--chunks", type=int, default=8, help="content chunks per reply")
    parser.add_argument(
        "--chunk-delay", type=float, default=0.0, help="seconds between stream chunks"
    )
    parser.add_argument("--usage-mode", choices=USAGE_MODES, default="venice")
    parser.add_argument("--admin-key", default=DEFAULT_FAKE_ADMIN_KEY,
                        help="the key its usage and cost report APIs take")
    parser.add_argument("--ledger", action="store_true",
                        help="remember every billed request served, for its reports")
    parser.add_argument("--billing-skew", type=int, default=0, metavar="REQUESTS",
                        help="+N: its reports bill N requests never served; -N: leave out "
                             "the last N served (implies --ledger)")
    arguments = parser.parse_args(argv)
    serve_fake_upstream(
        arguments.host,
        arguments.port,
        api_key=arguments.api_key,
        auth_header=arguments.auth_header,
        api_prefix=arguments.api_prefix,
        usage_mode=arguments.usage_mode,
        chunk_count=arguments.chunks,
        chunk_delay=arguments.chunk_delay,
        admin_key=arguments.admin_key,
        ledger=arguments.ledger or arguments.billing_skew != 0,
        billing_skew=arguments.billing_skew,
    )


if __name__ == "__main__":
    main()
