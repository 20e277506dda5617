"""The admin API fuzzed from its own OpenAPI document: schemathesis reads
``GET /admin/v1/openapi.json`` from the real admin listener and sends, for every
operation, requests made from the document (valid ones and ones it breaks on purpose:
wrong types, integers past 64 bits, control characters, out-of-range numbers), with an
admin token. Every check schemathesis has runs on every answer but two
(``NOT_THE_DOCUMENTS``, below): no 5xx; status, content type, headers and body as
documented; the Allow header, required headers, unsupported methods; ``ignored_auth``
(an operation that answered 2xx refuses the same request without the token) and
``object_level_authorization``; ``use_after_free`` and ``ensure_resource_availability``
run too, though they find nothing outside a stateful run. Beside it, every operation,
with a valid request and an invalid one, is refused (401, as documented) without a token
or with one that is none (``NOT_A_TOKEN``): ``ignored_auth`` sees only the operations
that answered 2xx.

Bounded: a fixed number of examples per operation, derandomized (the same requests on
every run), no example database, no shrinking (a failure is reported as found, so a
failing run is bounded too; tests/fuzzing.py: more, locally); the two tests take ~25 s
on two cores, on SQLite or Postgres. Marked ``slow_once``: a second pass over the suite
(CI's, on Postgres) skips them with ``-m 'not slow_once'``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from asgi_middleware import create_app
from llm_gateway.admin.app import create_admin_app
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.fuzzing import fuzz_settings
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
    @fuzz_settings(EXAMPLES_PER_OPERATION, shrink=False)
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


# What a caller without a valid admin token may send in its place: nothing, a wrong token,
# another scheme, a gateway key, a token of the right form that was never issued.
NOT_A_TOKEN = [None, "Bearer llmga_not-a-token", "Basic b3BzOm9wcw==", "Bearer",
               "Bearer llmg_a-gateway-key", "llmga_no-scheme"]


def one_case(operation: Any, mode: GenerationMode) -> Any:
    """The first request of ``mode`` schemathesis makes for ``operation`` (derandomized)."""
    found: list[Any] = []

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=1, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    def first(case: Any) -> None:
        found.append(case)

    first()
    return found[0]


@pytest.mark.slow_once
def test_every_operation_refuses_a_request_without_a_valid_token(
    admin_listener: tuple[str, str],
) -> None:
    """Each of the document's operations, with a valid request and with an invalid one (a
    401 before any validation says what the body lacks), answered without a token or with
    one that is none: 401, as the document describes it. schemathesis's ``ignored_auth``
    above only looks at operations whose request answered 2xx."""
    admin, _ = admin_listener
    schema = schemathesis.openapi.from_url(f"{admin}/admin/v1/openapi.json")
    refused, seen = [], 0
    for operation in (result.ok() for result in schema.get_all_operations()):
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            case = one_case(operation, mode)
            for name in [name for name in case.headers or {} if name.lower() == "authorization"]:
                del case.headers[name]
            for credential in NOT_A_TOKEN:
                headers = {} if credential is None else {"Authorization": credential}
                response = case.call(base_url=admin, headers=headers)
                seen += 1
                if response.status_code != 401:
                    refused.append(f"{operation.label} ({mode.value}, {credential}): "
                                   f"{response.status_code} {response.text[:200]}")
                    continue
                case.validate_response(response, checks=[
                    not_a_server_error, status_code_conformance, content_type_conformance,
                    response_schema_conformance, response_headers_conformance])
    assert not refused, "\n".join(refused)
    assert seen == 2 * len(NOT_A_TOKEN) * sum(
        len(methods) for methods in schema.raw_schema["paths"].values())
