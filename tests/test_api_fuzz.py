"""Property-based fuzzing of the live API from its own OpenAPI document (schemathesis): whatever a
client sends, valid or not, the API answers without a 5xx, with a status code the document declares
for that route, in the content type and body shape it declares. Bounded and derandomized, so a run is
the same run every time: a failure here is a regression, never a bad draw."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import make_key

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES_PER_OPERATION = 25  # x 13 operations: a few hundred requests, well under a minute


def _operations() -> list[tuple[str, str]]:
    """Every (method, path) the app documents, so a new route is fuzzed without touching this file.
    The document is built from the app object; nothing connects to the placeholder database."""
    from service.app import create_app

    document = create_app("postgresql+psycopg://unused/unused", check_schema=False).openapi()
    return [(method.upper(), path) for path, operations in document["paths"].items() for method in operations]


@pytest.fixture
def api_schema(api_url, bucket):  # type: ignore[no-untyped-def]
    """The document as the running API serves it."""
    return schemathesis.openapi.from_url(f"{api_url}/openapi.json")


@pytest.mark.parametrize("method,path", _operations(), ids=lambda v: v)
def test_api_answers_generated_requests_as_documented(api_schema, api_url, db, method, path):
    headers = {"Authorization": f"Bearer {make_key(db, 'fuzz')}"}
    operation = api_schema[path][method]
    # Positive cases reach the handlers' logic; negative ones (wrong types, missing fields) its validation.
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))

    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def answers_as_documented(case: schemathesis.Case) -> None:
        case.call_and_validate(base_url=api_url, headers=headers, checks=CHECKS, timeout=30)

    answers_as_documented()
