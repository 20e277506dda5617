"""The admin API fuzzed from its own OpenAPI document: schemathesis reads
``GET /admin/v1/openapi.json`` from the real admin listener and sends, for every
operation, requests made from the document (valid ones and ones it breaks on purpose:
wrong types, integers past 64 bits, control characters, out-of-range numbers), with an
admin token. No answer may be a 5xx, and every answer must be one the document
describes (status, content type, headers, body schema); an operation that answers 2xx
must refuse the same request without the token.

Bounded: a fixed number of examples per operation, derandomized (the same requests on
every run), no example database, no shrinking (a failure is reported as found, so a
failing run is bounded too); the whole test takes ~20 s on two cores, on SQLite or
Postgres. Marked ``slow_once``: a second pass over the suite (CI's, on Postgres) may skip
it with ``-m 'not slow_once'``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from asgi_middleware import create_app
from llm_gateway.admin.app import create_admin_app
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.test_admin_api import SECRET_KEY, make_admin_token, serve_together

EXAMPLES_PER_OPERATION = 20
# What the document cannot say, so schemathesis's guess at it is no finding: a valid
# request the service refuses for a rule beyond its schema (an ISO date in a string, a
# route the routing parser refuses, a rollback to no version: 400/404 as documented), and
# an invalid one answered 2xx because it is invalid only by a query parameter the API
# ignores, or by a missing Authorization header that this test adds back.
NOT_THE_DOCUMENTS = [positive_data_acceptance, negative_data_rejection]


@pytest.fixture
def admin_listener(tmp_path: Path, fake_url: str) -> Iterator[tuple[str, str]]:
    """(the admin listener's URL, an admin token), on a fresh gateway."""
    gateway_settings = make_settings(tmp_path, fake_url, secret_key=SECRET_KEY)
    gateway = build_gateway(gateway_settings)
    token = make_admin_token(gateway_settings)
    # The public app is served too: its lifespan starts and closes the shared gateway.
    with serve_together(create_app(gateway_settings, gateway=gateway),
                        create_admin_app(gateway)) as (_, admin):
        yield admin, token


def fuzz(operation: Any, mode: GenerationMode, admin: str, token: str) -> None:
    """``EXAMPLES_PER_OPERATION`` requests of ``mode`` to ``operation``, each answer checked
    by schemathesis's checks but ``NOT_THE_DOCUMENTS`` (no 5xx, status, content type,
    headers and body as documented, the token required)."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES_PER_OPERATION, derandomize=True, database=None,
              deadline=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    def one(case: Any) -> None:
        case.call_and_validate(base_url=admin, headers={"Authorization": f"Bearer {token}"},
                               excluded_checks=NOT_THE_DOCUMENTS)

    one()


# One test over every operation, through Hypothesis directly: schemathesis's pytest
# plugin (schemathesis.pytest.from_fixture) sets request.node._nodeid, which this pytest
# no longer has.
@pytest.mark.slow_once
def test_no_operation_answers_a_5xx_or_off_its_document(
    admin_listener: tuple[str, str],
) -> None:
    admin, token = admin_listener
    schema = schemathesis.openapi.from_url(f"{admin}/admin/v1/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    documented = sum(len(methods) for methods in schema.raw_schema["paths"].values())
    assert len(operations) == documented >= 28  # every route, none dropped as unreadable
    failed = []
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                fuzz(operation, mode, admin, token)
            # FailureGroup, schemathesis's report, is a BaseExceptionGroup.
            except (Exception, BaseExceptionGroup) as exc:  # every operation that failed
                failed.append(f"{operation.label} ({mode.value}): {exc}")
    assert not failed, "\n\n".join(failed)
