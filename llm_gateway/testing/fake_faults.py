"""Failures a test can make the fake upstream commit, and the queue that hands them out."""

import logging
import threading
from dataclasses import dataclass, field

from llm_gateway.testing.fake_errors import ERROR_SHAPES


@dataclass
class Fault:
    """A failure applied to the next ``times`` requests whose path matches.

    Faults apply only to authenticated requests under the API prefix, so a stray bad-key request
    cannot use one up. The stream faults (``cut_after_chunks``, ``malformed_frame``,
    ``inband_error``) have non-stream counterparts so a fault is never silently wasted: a JSON
    response is cut halfway through its body, replaced by ``{not json``, or replaced by
    ``{"error": "<text>"}`` with status 200, respectively. For the same reason ``headers`` and
    ``body``, which dress an error status, require ``status``.

    The Anthropic and Responses endpoints apply the stream faults in their own wire format:
    ``inband_error`` becomes Anthropic's ``event: error`` (an ``overloaded_error``) or the
    Responses ``error`` and ``response.failed`` events, and their JSON counterparts an
    Anthropic error body or a failed response object, each with status 200. An
    Anthropic-shaped 429 carries ``retry-after`` (``retry_after``, else 30 s) and the
    ``anthropic-ratelimit-*`` headers, as Anthropic's do.

    ``ignore_output_cap`` and ``omit_usage`` make a server that overspends: the whole reply
    whatever cap was asked (x-fake-chunks long), and no count of it.
    """

    status: int | None = None  # answer with this HTTP status instead of success
    # "venice" -> {"error": msg}; "openai" -> {"error": {message,type,code}}; "anthropic" ->
    # {"type": "error", "error": {type, message}, "request_id"}. None: Anthropic's in the
    # fake's anthropic mode, else Venice's (the default it always had, in openai mode too).
    shape: str | None = None
    message: str = "Upstream failure injected by the fake"
    retry_after: str | None = None  # Retry-After header value on the error
    # Extra headers on the error, e.g. {"x-ratelimit-reset-requests": "30s"}. A "content-type"
    # here replaces application/json (useful with ``body``); content-length is always computed.
    headers: dict[str, str] = field(default_factory=dict)
    # The error body, verbatim, instead of ``shape``/``message``: for odd upstream answers (HTML
    # from a proxy, an error that echoes the request's credentials, ...).
    body: bytes | None = None
    delay: float = 0.0  # seconds to wait before sending response headers (for timeout tests)
    cut_after_chunks: int | None = None  # stream: send this many content chunks, then drop
    malformed_frame: bool = False  # stream: insert a `data: {not json` frame mid-stream
    inband_error: str | None = None  # stream: 200, then `data: {"error": text}`, then [DONE]
    # A server that ignores the request's output cap (max_tokens, max_completion_tokens,
    # max_output_tokens, maxOutputTokens): the reply is generated whole, as if none was
    # asked (the request as recorded still shows the cap it carried).
    ignore_output_cap: bool = False
    # A server that reports no usage (self-hosted OpenAI-compatible ones, without
    # stream_options): chat completions' JSON answer has no ``usage``, its stream no usage
    # chunk. Chat only: Anthropic's and the Responses API's usage fields are required.
    omit_usage: bool = False
    path: str | None = None  # only requests whose path ends with this; None = any
    times: int = 1

    def __post_init__(self) -> None:
        if self.shape is not None and self.shape not in ERROR_SHAPES:
            raise ValueError(f"Fault.shape must be one of {ERROR_SHAPES}, not {self.shape!r}")
        if self.times < 1:
            raise ValueError("Fault.times must be at least 1")
        if self.cut_after_chunks is not None and self.cut_after_chunks < 0:
            raise ValueError("Fault.cut_after_chunks must not be negative")
        if (self.headers or self.body is not None) and self.status is None:
            raise ValueError("Fault.headers and Fault.body dress an error: they need Fault.status")
        if any(name.lower() == "content-length" for name in self.headers):
            raise ValueError("Fault.headers must not set content-length; the fake computes it")

    def error_headers(self) -> list[tuple[str, str]]:
        """The error's headers: content type, Retry-After, then ``headers`` (which may replace
        the content type)."""
        custom = [(name.lower(), value) for name, value in self.headers.items()]
        sent: list[tuple[str, str]] = []
        if not any(name == "content-type" for name, _ in custom):
            sent.append(("content-type", "application/json"))
        if self.retry_after is not None:
            sent.append(("retry-after", self.retry_after))
        return sent + custom


# Where a request names its output cap: chat's, the Responses API's, Gemini's config's.
_CAP_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
_GEMINI_CAP_FIELDS = ("maxOutputTokens", "max_output_tokens")
# What Anthropic's required max_tokens reads as to a server that ignores it.
_NO_CAP = 1 << 30


def uncapped(payload: object, provider: str) -> object:
    """The request as a server that ignores its output cap reads it
    (``Fault.ignore_output_cap``)."""
    if not isinstance(payload, dict):
        return payload
    read = {name: value for name, value in payload.items() if name not in _CAP_FIELDS}
    if provider == "anthropic" and "max_tokens" in payload:
        read["max_tokens"] = _NO_CAP  # required there: as good as none
    config = payload.get("generationConfig")
    if isinstance(config, dict):
        read["generationConfig"] = {name: value for name, value in config.items()
                                    if name not in _GEMINI_CAP_FIELDS}
    return read


class DeliberateConnectionCut(Exception):
    """Raised from the ASGI app to drop a connection mid-response (``Fault.cut_after_chunks``).

    The server then closes the socket without the terminating chunk, so the client sees a broken
    response rather than a clean end. Its traceback is filtered out of uvicorn's error log.
    """


class _HideDeliberateCuts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        raised = record.exc_info[1] if record.exc_info else None
        return not isinstance(raised, DeliberateConnectionCut)


_HIDE_DELIBERATE_CUTS = _HideDeliberateCuts()


def hide_deliberate_cut_tracebacks() -> None:
    # uvicorn logs "Exception in ASGI application" with the traceback on "uvicorn.error".
    server_error_log = logging.getLogger("uvicorn.error")
    if _HIDE_DELIBERATE_CUTS not in server_error_log.filters:
        server_error_log.addFilter(_HIDE_DELIBERATE_CUTS)


@dataclass
class _QueuedFault:
    fault: Fault
    remaining: int


class FaultQueue:
    """Faults in the order they apply. Tests push from their thread while the server thread
    takes, hence the lock."""

    def __init__(self) -> None:
        self._queued: list[_QueuedFault] = []
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        # Read without the lock: a cheap "anything queued?" on every request; take() decides.
        return bool(self._queued)

    def push(self, fault: Fault) -> None:
        with self._lock:
            self._queued.append(_QueuedFault(fault, fault.times))

    def pending(self) -> list[Fault]:
        with self._lock:
            return [queued.fault for queued in self._queued]

    def clear(self) -> None:
        with self._lock:
            self._queued.clear()

    def take(self, path: str) -> Fault | None:
        """Use up one application of the first fault matching ``path``."""
        with self._lock:
            for position, queued in enumerate(self._queued):
                if queued.fault.path is None or path.endswith(queued.fault.path):
                    queued.remaining -= 1
                    if queued.remaining == 0:
                        del self._queued[position]
                    return queued.fault
        return None
