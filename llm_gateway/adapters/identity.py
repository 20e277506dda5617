"""Who an application's own LLM call is charged to: the identity bound to the current context.

An application that calls an LLM itself, while serving one of its users, binds that user
for the duration of the work (``GatewayMiddleware(app, govern_outbound=True)`` does it
per inbound request; ``acting_as`` does it by hand). A ``contextvars.ContextVar`` carries
it, so every call made meanwhile, in any asyncio task spawned from there and in threads
started with the context (Starlette's ``run_in_threadpool``, anyio's ``to_thread``), is
limited and charged to that caller. A plain ``threading.Thread`` does not carry the
context: run its target under ``contextvars.copy_context().run``.

The in-process transport resolves, in this order: the bound identity, then the key the
transport was built with; with neither it raises ``GatewayError``: a call nobody is
charged for is never made.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["GatewayError", "Identity", "acting_as", "bound", "current", "inbound_identity",
           "resolve"]


class GatewayError(Exception):
    """The in-process transport refused to make a call (no identity to charge it to), or
    the engine's event loop cannot take it.

    Raised from the transport, before anything is sent. The openai SDK 3.x (httpx2) lets
    it through as is; older SDKs (1.x) wrap every transport exception as
    ``openai.APIConnectionError`` (after their retries), with this error as ``__cause__``.
    """


@dataclass(frozen=True, slots=True)
class Identity:
    """One of the two: a credential the engine authenticates (a gateway key or a JWT),
    or a subject the application vouches for (no key: the application's own login)."""

    credential: str | None = None
    subject: str | None = None


_current: ContextVar[Identity | None] = ContextVar("llm_gateway_identity", default=None)


def current() -> Identity | None:
    return _current.get()


@contextmanager
def bound(identity: Identity) -> Iterator[Identity]:
    """Bind ``identity`` for the block (innermost wins); the previous one comes back after."""
    token = _current.set(identity)
    try:
        yield identity
    finally:
        _current.reset(token)


@contextmanager
def acting_as(*, subject: str | None = None, key: str | None = None) -> Iterator[Identity]:
    """Charge the LLM calls made in this block to ``subject`` (an id your application
    authenticated: it gets the default rate limit and the subject's budgets, no gateway
    key needed) or to the gateway ``key``. Usable in sync and async code alike::

        with llm_gateway.acting_as(subject="user-42"):
            client.chat.completions.create(...)
    """
    if (subject is None) == (key is None):
        raise ValueError("acting_as takes exactly one of subject= or key=")
    if not (subject or key):
        raise ValueError("acting_as needs a non-empty subject or key")
    with bound(Identity(credential=key, subject=subject)) as identity:
        yield identity


def inbound_identity(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> Identity | None:
    """The credential an inbound request carries in header ``name`` (ASGI's raw headers):
    ``Bearer <key or JWT>`` or the bare key. Not checked here: the engine authenticates it
    when an outbound call is admitted, once, like any other credential."""
    for header, value in headers:
        if header.lower() == name:
            text = value.decode("latin-1").strip()
            scheme, _, rest = text.partition(" ")
            token = rest.strip() if scheme.lower() == "bearer" else text
            return Identity(credential=token) if token else None
    return None


def resolve(default_key: str | None) -> Identity:
    """The identity an outbound call is charged to, or GatewayError when there is none."""
    identity = _current.get()
    if identity is not None:
        return identity
    if default_key:
        return Identity(credential=default_key)
    raise GatewayError(
        "No identity to charge this LLM call to: serve the request through "
        "GatewayMiddleware(app, govern_outbound=True), wrap the call in "
        "llm_gateway.acting_as(subject=... or key=...), or build the client with a gateway "
        "key (openai_client(key=...), GatewayTransport(gateway, key=...)). Nothing was sent."
    )
