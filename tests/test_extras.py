"""The core installs lean: a setting that needs an extra which is not installed fails with
one line naming the extra (CI's wheel-check runs the core alone for real)."""

from __future__ import annotations

import sys

import pytest

from llm_gateway.config import ConfigError
from llm_gateway.extras import EXTRAS, MissingExtra, need
from llm_gateway.stores import open_store


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_a_missing_extra_names_itself_and_how_to_install_it(
    extra: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = EXTRAS[extra][0]
    monkeypatch.setitem(sys.modules, module, None)  # import raises ModuleNotFoundError
    with pytest.raises(MissingExtra) as raised:
        need(extra)
    assert isinstance(raised.value, ConfigError)
    assert f"pip install 'llm-gateway[{extra}]'" in str(raised.value)
    assert "Traceback" not in str(raised.value)


def test_a_postgres_url_without_the_extra_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(MissingExtra, match=r"DATABASE_URL .*llm-gateway\[postgres\]"):
        open_store("postgresql://postgres@127.0.0.1/test")


def test_installed_extras_import() -> None:
    for extra in EXTRAS:
        assert need(extra).__name__ == EXTRAS[extra][0]
