"""The fake upstream's error bodies, in each provider's shape, and the chat fields each provider
accepts (both refuse a chat completion naming any other top-level field)."""

ERROR_SHAPES = ("venice", "openai")

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


def error_payload(
    shape: str, status: int, message: str, *, param: str | None = None
) -> dict[str, object]:
    """Venice: ``{"error": message}``; OpenAI: ``{"error": {message, type, param, code}}``."""
    if shape == "openai":
        default_kind = ("server_error", None) if status >= 500 else ("invalid_request_error", None)
        error_type, code = _OPENAI_ERROR_KINDS.get(status, default_kind)
        return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return {"error": message}


def validation_error_payload(shape: str, param: str, problem: str) -> dict[str, object]:
    """A 400 body for a missing or mistyped field."""
    if shape == "openai":
        return error_payload(shape, 400, problem, param=param)
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
