"""The documentation: the site builds strictly, the reference pages generated from the code
are the code's, and the README is a front door (short, every link resolving)."""

from __future__ import annotations

import operator
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from llm_gateway.billing import prices
from llm_gateway.cli import reference
from llm_gateway.config import VARIABLES, Settings, accepted_values
from llm_gateway.routing.config import parse_routes
from llm_gateway.routing.schema import ROUTE_SCHEMA, Required
from tests.support import REPO

pytestmark = pytest.mark.slow_once  # nothing here depends on Postgres or Redis

DOCS = REPO / "docs"
README = REPO / "README.md"
README_MAX_LINES = 200
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


@pytest.mark.parametrize("page", sorted(reference.PAGES))
def test_the_generated_reference_pages_are_the_codes(page: str) -> None:
    committed = (DOCS / "reference" / page).read_text()
    assert committed == reference.PAGES[page](), (
        f"docs/reference/{page} is stale: run `{reference.REGENERATE}` and commit it")


def test_every_setting_and_key_says_what_it_takes_and_means() -> None:
    silent = [v.name for v in VARIABLES if not v.meaning or not accepted_values(v.parse)]
    assert silent == [], "rows of config.VARIABLES without meaning= or an _accepts text"
    assert [row.path for row in ROUTE_SCHEMA if not (row.meaning and row.accepts)] == []
    assert set(prices.PRICE_KEYS) == set(prices._RATES) | {"from"}


# Where the parsed route table keeps each key whose default the schema gives as a value.
_PARSED = {
    "providers.NAME.profile": lambda t: t.providers["p"].profile,
    "providers.NAME.max_concurrency": lambda t: t.providers["p"].max_concurrency,
    "providers.NAME.timeouts.connect": lambda t: t.providers["p"].timeouts.connect,
    "providers.NAME.timeouts.first_byte": lambda t: t.providers["p"].timeouts.first_byte,
    "providers.NAME.timeouts.read": lambda t: t.providers["p"].timeouts.read,
    "providers.NAME.timeouts.stream_idle": lambda t: t.providers["p"].timeouts.stream_idle,
    "providers.NAME.limits.requests_per_minute": lambda t: t.providers["p"].requests_per_minute,
    "providers.NAME.limits.tokens_per_minute": lambda t: t.providers["p"].tokens_per_minute,
    "models.ALIAS.targets[].weight": lambda t: t.models["m"].targets[0].weight,
    "models.ALIAS.targets[].priority": lambda t: t.models["m"].targets[0].priority,
    "models.ALIAS.max_output_tokens": lambda t: t.models["m"].max_output_tokens,
    "unknown_models": lambda t: t.unknown_models,
    "routing.max_retry_wait_seconds": lambda t: t.max_retry_wait_seconds,
    "routing.failed_requests.limit": lambda t: t.failed_requests_limit,
    "routing.failed_requests.window_seconds": lambda t: t.failed_requests_window_seconds,
    **{f"routing.health.{name}": operator.attrgetter(f"health.{name}")
       for name in ("failures_to_degraded", "failures_to_down", "successes_to_healthy",
                    "cooldown_seconds", "max_cooldown_seconds", "degraded_weight")},
}


def _is_value(default: object) -> bool:
    return not isinstance(default, Required | dict) and not (
        isinstance(default, str) and (" " in default or default.endswith("'s")
                                      or default == "unset"))


def test_the_route_schemas_defaults_are_what_an_omitted_key_becomes() -> None:
    table = parse_routes({"providers": {"p": {"base_url": "http://127.0.0.1:9"}},
                          "models": {"m": {"targets": [{"provider": "p", "model": "x"}]}}},
                         {}, Settings())
    valued = {row.path: row.default for row in ROUTE_SCHEMA if _is_value(row.default)}
    assert set(valued) <= set(_PARSED), "a default the test does not check"
    assert {path: _PARSED[path](table) for path in valued} == valued


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        if os.environ.get("CI"):
            pytest.fail("mkdocs is not installed: the test lock installs it (the docs extra)")
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    built = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stderr
    assert "WARNING" not in built.stderr, built.stderr
    assert (tmp_path / "site" / "reference" / "configuration.html").exists()


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    for command in ("make demo", "make test"):
        assert command in README.read_text()


def _slug(heading: str) -> str:
    """The id Python-Markdown's toc extension (as MkDocs runs it) gives a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors_of(page: Path) -> set[str]:
    found: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6} (.*?)(?:\s*\{#([\w-]+)\})?$", line)):
            found.add(heading.group(2) or _slug(heading.group(1)))
    return found


def test_every_readme_link_resolves() -> None:
    broken = []
    for target in LINK.findall(README.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a web address: not this repository's to check
        path, _, anchor = target.partition("#")
        where = (REPO / path) if path else README
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors_of(where):
            broken.append(f"{target}: no such heading in {path or 'README.md'}")
    assert broken == []


def test_the_readmes_benchmark_figures_are_the_performance_pages() -> None:
    """The headline table is a copy of the dated one on the performance page."""
    readme = README.read_text()
    table = readme.split("## Performance", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    page = (DOCS / "performance.md").read_text()
    figures = [cell for row in rows[1:] for cell in re.findall(r"\d+(?:\.\d+)?", row)]
    assert figures, "the README shows no benchmark figures"
    assert all(figure in page for figure in figures)
