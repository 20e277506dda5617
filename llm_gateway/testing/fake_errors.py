"""The fake upstream's error bodies, in each provider's shape, and the chat fields each provider
accepts (both refuse a chat completion naming any other top-level field).

Anthropic's shape is ``{"type": "error", "error": {"type", "message"}, "request_id"}``, the
request id being the one its ``request-id`` header carries; its error types follow the status
(platform.claude.com/docs/en/api/errors: 400 invalid_request_error, 401 authentication_error,
403 permission_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error,
500 api_error, 529 overloaded_error)."""

ERROR_SHAPES = ("venice", "openai", "anthropic", "gemini")

_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}

# OpenAI's (type, code) for an error status; anything unlisted below 500 is invalid_request_error.
_OPENAI_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    429: ("requests", "rate_limit_exceeded"),
}

from llm_gateway.providers.openai import OPENAI_CHAT_FIELDS  # noqa: E402
from llm_gateway.providers.venice import VENICE_CHAT_FIELDS  # noqa: E402

CHAT_FIELDS_BY_MODE = {"venice": VENICE_CHAT_FIELDS, "openai": OPENAI_CHAT_FIELDS}


# Google's status name (google.rpc.Code) for an HTTP status, as Gemini's errors carry it.
_GEMINI_STATUSES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                    404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 409: "ABORTED",
                    413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
                    500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def gemini_error(status: int, message: str, reason: str | None = None) -> dict[str, object]:
    """Gemini's ``{"error": {code, message, status}}``, with an ErrorInfo detail naming
    ``reason`` (API_KEY_INVALID) when there is one, as Google adds it."""
    error: dict[str, object] = {
        "code": status, "message": message,
        "status": _GEMINI_STATUSES.get(status, "INTERNAL" if status >= 500 else "UNKNOWN")}
    if reason is not None:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                             "reason": reason, "domain": "googleapis.com",
                             "metadata": {"service": "generativelanguage.googleapis.com"}}]
    return {"error": error}


def anthropic_error_type(status: int) -> str:
    return _ANTHROPIC_ERROR_TYPES.get(
        status, "api_error" if status >= 500 else "invalid_request_error")


def error_payload(
    shape: str, status: int, message: str, *, param: str | None = None,
    code: str | None = None, request_id: str | None = None,
) -> dict[str, object]:
    """Venice: ``{"error": message}``; OpenAI: ``{"error": {message, type, param, code}}``
    (``code`` replaces the status's usual one); Anthropic: ``{"type": "error", "error":
    {type, message}, "request_id"}``."""
    if shape == "openai":
        default_kind = ("server_error", None) if status >= 500 else ("invalid_request_error", None)
        error_type, usual_code = _OPENAI_ERROR_KINDS.get(status, default_kind)
        return {"error": {"message": message, "type": error_type, "param": param,
                          "code": code if code is not None else usual_code}}
    if shape == "anthropic":
        error = {"type": anthropic_error_type(status), "message": message}
        return {"type": "error", "error": error, "request_id": request_id}
    if shape == "gemini":
        return gemini_error(status, message)
    return {"error": message}


def validation_error_payload(
    shape: str, param: str, problem: str, *, request_id: str | None = None
) -> dict[str, object]:
    """A 400 body for a missing or mistyped field."""
    if shape == "openai":
        return error_payload(shape, 400, problem, param=param)
    if shape in ("anthropic", "gemini"):
        # Anthropic names the field's path first: "max_tokens: Field required".
        return error_payload(shape, 400, f"{param}: {problem}", request_id=request_id)
    # Venice answers validation failures with zod-style issues.
    issue = {"code": "invalid_type", "path": [param], "message": problem}
    return {"error": "Invalid request", "issues": [issue]}


def unknown_fields_payload(shape: str, fields: list[str]) -> dict[str, object]:
    """A 400 body for top-level fields the provider does not know, as that provider words it."""
    if shape == "openai":
        # OpenAI names them sorted, in one sentence that agrees with their number.
        names = ", ".join(sorted(fields))
        arguments = "argument" if len(fields) == 1 else "arguments"
        return error_payload(shape, 400, f"Unrecognized request {arguments} supplied: {names}")
    # zod's strict-object issue, in the order the fields came, with zod's .format() of it as
    # "details": Venice's documented validation error (api-reference/error-codes in its docs).
    message = "Unrecognized key(s) in object: " + ", ".join(f"'{name}'" for name in fields)
    issue = {"code": "unrecognized_keys", "keys": fields, "path": [], "message": message}
    return {
        "error": "Invalid request parameters",
        "details": {"_errors": [message]},
        "issues": [issue],
    }
