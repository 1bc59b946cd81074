"""Property-based fuzzing of the live API from its own OpenAPI document (schemathesis): whatever a
client sends, valid or not, the API answers without a 5xx, with a status code the document declares
for that route, in the content type and body shape it declares. Bounded and derandomized, so a run is
the same run every time: a failure here is a regression, never a bad draw."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
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

from tests.support.jobs import digits_spec, make_key

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES_PER_OPERATION = 30  # x 13 operations, submit x 3: about 450 requests, well under a minute
SUBMIT = ("POST", "/v1/jobs")  # the one route that stores what a client wrote: fuzzed hardest

# Text with what PostgreSQL refused with a 500: NUL in any string, and lone surrogates (UTF-16 halves
# that UTF-8 cannot encode). schemathesis' own cases bring varied text; these bring the breakers.
_TEXT = st.text(st.sampled_from(["\x00", "\n", "a", "Z", "-", "\u00e9", "\u2603", "\U0001f600"]), max_size=8)
_SURROGATES = st.sampled_from(["\ud800", "a\udfff"])
# NaN and Infinity are left to test_api_limits: the client library refuses to send them.
_LEAVES = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _TEXT
_JSON = st.recursive(_LEAVES | _SURROGATES, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(_TEXT | _SURROGATES, inner, max_size=4), max_leaves=16)
_LABELS = st.dictionaries(st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True),
                          st.from_regex(r"[a-z0-9_-]{0,8}", fullmatch=True), max_size=3)
# A consistent spec whose model.params are fuzzed: schemathesis alone rarely builds a spec that passes
# the consistency rules, so without these the path behind validation, to the database, goes untried.
# A user module's params are free-form (a built-in model's are checked at submit); the module is not fetched at submit.
_SPECS = st.builds(lambda params, labels: digits_spec(labels=labels, model={"module": "https://example.com/m.py",
                                                                            "params": params}),
                   st.dictionaries(_TEXT, _JSON, min_size=1, max_size=4), _LABELS)


def _operations() -> list[tuple[str, str]]:
    """Every (method, path) the app documents, so a new route is fuzzed without touching this file.
    The document is built from the app object; nothing connects to the placeholder database."""
    from service.app import create_app

    document = create_app("postgresql+psycopg://unused/unused", check_schema=False).openapi()
    return [(method.upper(), path) for path, operations in document["paths"].items() for method in operations]


@dataclass
class Target:
    schema: Any  # schemathesis' OpenAPI schema, as the running API serves it
    url: str
    headers: dict[str, str]
    job_id: str  # a real job of the caller's project, so routes under /v1/jobs/{job_id} get past the 404


@pytest.fixture
def target(api_url, bucket, db) -> Target:  # type: ignore[no-untyped-def]
    headers = {"Authorization": f"Bearer {make_key(db, 'fuzz')}"}
    job = httpx.post(f"{api_url}/v1/jobs", json=digits_spec(), headers=headers)
    assert job.status_code == 201, job.text
    return Target(schemathesis.openapi.from_url(f"{api_url}/openapi.json"), api_url, headers, job.json()["id"])


def _cases(operation: Any, job_id: str) -> st.SearchStrategy[schemathesis.Case]:
    # Positive cases reach the handlers' logic; negative ones (wrong types, missing fields) its validation.
    strategies = [operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE)]
    if "{job_id}" in operation.path:
        strategies.append(operation.as_strategy(GenerationMode.POSITIVE, path_parameters={"job_id": job_id}))
    if (operation.method.upper(), operation.path) == SUBMIT:
        specs = _SPECS.flatmap(lambda spec: operation.as_strategy(GenerationMode.POSITIVE, body=spec))
        strategies += [specs, specs]  # half of the submit cases
    return st.one_of(strategies)


@pytest.mark.parametrize("method,path", _operations(), ids=lambda v: v)
def test_api_answers_generated_requests_as_documented(target, method, path):
    examples = EXAMPLES_PER_OPERATION * (3 if (method, path) == SUBMIT else 1)

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=_cases(target.schema[path][method], target.job_id))
    def answers_as_documented(case: schemathesis.Case) -> None:
        case.call_and_validate(base_url=target.url, headers=target.headers, checks=CHECKS, timeout=30)

    answers_as_documented()
