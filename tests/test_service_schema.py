"""Bad bodies from the OpenAPI spec itself: schemathesis generates requests
for every operation (bounded in count and time) against a real server, and
none may get a server error or a stack trace."""

from __future__ import annotations

import json

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


def test_stateful_sequences_get_no_server_error(api_schema, api_server):
    """upload -> list -> ask -> delete, as the OpenAPI links allow, in
    bounded generated sequences."""
    from hypothesis.stateful import run_state_machine_as_test

    machine = api_schema.as_state_machine()

    class Checked(machine):
        def validate_response(self, response, case, **kwargs):
            assert response.status_code < 500, (case.method, case.path, response.text[:300])
            assert "Traceback" not in response.text

        def get_call_kwargs(self, case):
            return {"base_url": api_server.url, "timeout": 60}

    run_state_machine_as_test(Checked, settings=settings(max_examples=8, stateful_step_count=5, deadline=None,
                                                         database=None, suppress_health_check=list(HealthCheck)))


def test_any_chat_completions_body_gets_no_server_error(api_server):
    """A hypothesis property over the chat body: any JSON, any text
    (surrogates included), never a 5xx."""
    import httpx
    from hypothesis import strategies as st

    text = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=40)
    scalar = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text
    part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "weird"]), "text": scalar})
    content = scalar | st.lists(part | scalar, max_size=3)
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "bogus"]),
                                     "content": content})
    body = st.fixed_dictionaries({"messages": st.lists(message, max_size=3)},
                                 optional={"stream": st.booleans(), "max_tokens": st.integers(-5, 5), "user": scalar,
                                           "session": scalar, "target_ttft_s": scalar | st.floats()})

    @given(body=body)
    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def check(body):
        raw = json.dumps(body, ensure_ascii=True, allow_nan=True).encode()  # lone surrogates survive as \\ud800
        r = httpx.post(f"{api_server.url}/v1/chat/completions", content=raw, timeout=60,
                       headers={"content-type": "application/json"})
        assert r.status_code < 500, (body, r.text[:300])

    check()
