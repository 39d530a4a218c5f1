"""Bad bodies from the OpenAPI spec itself: schemathesis generates requests
for every operation (bounded in count and time) against a real server, and
none may get a server error or a stack trace."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from rag import Pipeline
from rag.service import LoopbackServer, ServiceSettings, create_app

from .conftest import write_corpus


@pytest.fixture(scope="module")
def api_server(tmp_path_factory, embedder, backend):
    root = tmp_path_factory.mktemp("schema")
    p = Pipeline.open(root / "index", embedder=embedder, backend=backend, conversations=root / "c.sqlite")
    p.ingest([write_corpus(root / "corpus")])
    # Short answers keep generated requests quick: more tokens get a 400.
    s = LoopbackServer(create_app(p, ServiceSettings(rate_limit_per_minute=0, max_tokens_limit=2)))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def api_schema(api_server):
    return schemathesis.openapi.from_url(f"{api_server.url}/openapi.json")


def test_generated_requests_get_no_server_error(api_schema, api_server):
    """Every operation of the OpenAPI spec, 12 generated requests each."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/ask", "/v1/chat/completions", "/v1/documents"}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def check(case):
            response = case.call(base_url=api_server.url, timeout=60)
            assert response.status_code < 500, (case.method, case.path, response.text[:300])
            assert "Traceback" not in response.text
            if response.status_code >= 400:
                assert "message" in response.json()["error"]  # every error is JSON with a message

        check()
