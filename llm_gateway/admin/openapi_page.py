"""The admin API's OpenAPI document as a Markdown page (pure: a dict in, text out).

The documentation site shows the document rendered without loading anything at view time
(Swagger UI and ReDoc fetch their assets from a CDN), searchable and link-checked as any
page. Every operation with its parameters, body and answers; every schema with its fields.
"""

from __future__ import annotations

import re
from typing import Any

_METHODS = ("get", "post", "put", "patch", "delete")


def admin_api_page(document: dict[str, Any]) -> str:
    """The page: the operations path by path, the answers every operation shares, then the
    schemas. The document's version is left out (it is every release's)."""
    info = document.get("info", {})
    lines = ["# Admin API reference", "", info.get("description", ""), "",
             "The OpenAPI 3.1 document itself is served at `GET /admin/v1/openapi.json` on "
             "the admin listener (no token needed). Guide: [Admin API and "
             "console](../admin.md).", ""]
    errors = _shared_errors(document)
    if errors:
        lines += ["## Errors", "",
                  "Every operation may answer these, in the `ErrorResponse` shape "
                  "(OpenAI's `{\"error\": {\"message\", \"type\", \"code\"}}`):", "",
                  "| status | when |", "|---|---|"]
        lines += [f"| {status} | {_cell(text)} |" for status, text in sorted(errors.items())]
        lines.append("")
    lines += ["## Operations", ""]
    for path, operations in document.get("paths", {}).items():
        for method in _METHODS:
            if method in operations:
                lines += _operation(method, path, operations[method], errors)
    lines += ["## Schemas", ""]
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        lines += _schema(name, schema)
    return "\n".join(lines).rstrip() + "\n"


def _shared_errors(document: dict[str, Any]) -> dict[str, str]:
    """The error answers (4xx, 5xx) that carry the same text wherever they appear."""
    seen: dict[str, set[str]] = {}
    for operations in document.get("paths", {}).values():
        for method in _METHODS:
            for status, answer in operations.get(method, {}).get("responses", {}).items():
                if status[0] in "45":
                    seen.setdefault(status, set()).add(answer.get("description", ""))
    return {status: texts.pop() for status, texts in seen.items() if len(texts) == 1}


def _operation(method: str, path: str, operation: dict[str, Any],
               errors: dict[str, str]) -> list[str]:
    lines = [f"### {method.upper()} {path}", "", operation.get("summary", ""), ""]
    if operation.get("description"):
        lines += [operation["description"], ""]
    lines.append("No token needed." if not operation.get("security")
                 else "Needs an admin token.")
    lines.append("")
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["| parameter | in | type | required | meaning |", "|---|---|---|---|---|"]
        for parameter in parameters:
            schema = parameter.get("schema", {})
            meaning = parameter.get("description") or schema.get("description", "")
            lines.append(f"| `{parameter['name']}` | {parameter.get('in', '')} | "
                         f"{_cell(_type(schema))} | {'yes' if parameter.get('required') else 'no'}"
                         f" | {_cell(meaning)} |")
        lines.append("")
    body = operation.get("requestBody")
    if body:
        schema = body.get("content", {}).get("application/json", {}).get("schema", {})
        lines += [f"Body: {_type(schema)}" + ("" if body.get("required") else " (optional)"), ""]
    answers, shared = [], []
    for status, answer in operation.get("responses", {}).items():
        if errors.get(status) == answer.get("description"):
            shared.append(status)
            continue
        schema = answer.get("content", {}).get("application/json", {}).get("schema")
        shape = f": {_type(schema)}" if schema else ""
        answers.append(f"- **{status}** {answer.get('description', '')}{shape}")
    if shared:
        answers.append(f"- {', '.join(shared)}: see [Errors](#errors)")
    return [*lines, *answers, ""]


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name}", ""]
    if schema.get("description"):
        lines += [schema["description"], ""]
    properties = schema.get("properties", {})
    if not properties:
        return [*lines, f"Type: {_type(schema)}", ""]
    required = set(schema.get("required", []))
    lines += ["| field | type | required | default | meaning |", "|---|---|---|---|---|"]
    for field, spec in properties.items():
        default = f"`{_json(spec['default'])}`" if "default" in spec else ""
        lines.append(f"| `{field}` | {_cell(_type(spec))} | "
                     f"{'yes' if field in required else 'no'} | {_cell(default)} | "
                     f"{_cell(spec.get('description', ''))} |")
    return [*lines, ""]


def _type(schema: dict[str, Any] | None) -> str:
    """A schema in a few words: a link to a named schema, a list of, one of, a type."""
    if not schema:
        return "any"
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_type(option) for option in schema[key])
    if "enum" in schema:
        return " or ".join(f"`{_json(value)}`" for value in schema["enum"])
    if "const" in schema:
        return f"`{_json(schema['const'])}`"
    kind = schema.get("type", "object")
    if kind == "array":
        return f"list of {_type(schema.get('items'))}"
    if kind == "object" and "additionalProperties" in schema and isinstance(
            schema["additionalProperties"], dict):
        return f"mapping of text to {_type(schema['additionalProperties'])}"
    return "text" if kind == "string" else str(kind)


def _anchor(name: str) -> str:
    """The id Python-Markdown's toc gives the heading ``### name``."""
    return re.sub(r"[^\w-]", "", name.lower())


def _json(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if not isinstance(value, str) else value


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")
