"""The reference pages of the documentation site, generated from the code: the
configuration (every setting's row in ``config.VARIABLES``, the route sections' keys in
``routing.schema``, the keys of a ``prices:`` entry) and the admin API (its OpenAPI
document). ``make docs-reference`` writes them; tests/test_docs.py fails when the committed
pages differ from what this makes.

    python -m llm_gateway.cli.reference [--out docs/reference]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from llm_gateway.admin.openapi_page import admin_api_page
from llm_gateway.billing.prices import PRICE_KEYS
from llm_gateway.config import ROUTE_KEYS, VARIABLES, HostPort, Settings, accepted_values
from llm_gateway.routing.schema import ROUTE_SCHEMA, Required

PAGES = {"configuration.md": lambda: configuration_page(), "admin-api.md": lambda: admin_api()}
REGENERATE = "make docs-reference"
_GENERATED = (f"<!-- Generated from the code by `{REGENERATE}`; edit the code, not this "
              "page. -->\n")


def configuration_page() -> str:
    """Markdown: every variable and YAML key with what it takes, its default and meaning."""
    defaults = {item.name: _field_default(item) for item in dataclasses.fields(Settings)}
    lines = [
        _GENERATED, "# Configuration reference", "",
        "Every setting, as the code reads it. A variable wins over the same key, in lower "
        "case, of the YAML file that `--config FILE` or `LLM_GATEWAY_CONFIG` names; a key "
        "the file does not know stops start-up. How settings are read, and when they are "
        "read again: [How settings are read](../configuration.md).", "",
        "## Settings", "",
        "| variable, YAML key | takes | default | meaning |", "|---|---|---|---|",
    ]
    for variable in VARIABLES:
        key = f"`{variable.name.lower()}`"
        name = f"{key} (file only)" if variable.file_only else f"`{variable.name}`<br>{key}"
        lines.append(_row(name, accepted_values(variable.parse),
                          _shown(defaults[variable.field]), variable.meaning))
    lines += [
        "", "## Routes", "",
        "The file's " + ", ".join(f"`{key}`" for key in ROUTE_KEYS) + " sections: read "
        "again every second while the gateway runs ([Live changes](../providers.md#live-"
        "changes)). `NAME` stands for a provider's name, `ALIAS` for a model alias, `[]` "
        "for each item of a list. Guide: [Providers and routing](../providers.md).", "",
        "| key | takes | default | meaning |", "|---|---|---|---|",
    ]
    lines += [_row(f"`{row.path}`", row.accepts, _shown(row.default), row.meaning)
              for row in ROUTE_SCHEMA]
    lines += [
        "", "## Prices", "",
        "The file's `prices:` section seeds the price table: `prices.PROVIDER.MODEL` holds "
        "these keys (USD per million tokens, read as decimal text). Guide: "
        "[Accounting, prices and budgets](../accounting.md#prices-budgets-and-reports).", "",
        "| key | meaning |", "|---|---|",
    ]
    lines += [_row(f"`prices.PROVIDER.MODEL.{key}`", meaning)
              for key, meaning in PRICE_KEYS.items()]
    return "\n".join(lines) + "\n"


def admin_api() -> str:
    from llm_gateway.admin.api import build_admin_api

    document = build_admin_api(None).openapi()  # type: ignore[arg-type]
    return _GENERATED + admin_api_page(document)


def _field_default(item: dataclasses.Field[Any]) -> Any:
    if item.default is not dataclasses.MISSING:
        return item.default
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return None


def _shown(value: Any) -> str:
    """A default as the page shows it: a value in code, words as they are."""
    if value is None:
        return "unset"
    if isinstance(value, Required):
        return "required"
    if isinstance(value, str) and (" " in value or value.endswith("'s") or value == "unset"):
        return value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    if isinstance(value, HostPort | int | float | str):
        return f"`{value}`"
    if not value or (dataclasses.is_dataclass(value) and not any(
            getattr(value, item.name) for item in dataclasses.fields(value))):
        return "none"  # an empty section, or a change that changes nothing
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):
        return ", ".join(f"`{host}: {root}`" for host, root in value)
    if isinstance(value, tuple):
        return ", ".join(f"`{item}`" for item in value)
    return f"`{json.dumps(value, default=str)}`"


def _row(*cells: str) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_gateway.cli.reference",
                                     description="write the generated reference pages")
    parser.add_argument("--out", type=Path, default=Path("docs/reference"),
                        help="the directory to write them to (default: docs/reference)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, make in PAGES.items():
        (args.out / name).write_text(make())
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
