"""The OpenAPI document at /openapi.json: every route the app registers is in it, it is a
valid OpenAPI 3.1 document, bodies and errors come from the msgspec wire types, and it is
served without credentials on a gateway that has tenants."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

from core.config import parse_config
from gateway.app import create_app
from gateway.routes.openapi import UNDOCUMENTED, app_routes, build_document, openapi_path

CONFIG = """
auth: {{keys_file: {keys}}}
tenants: {{acme: {{}}}}
ledger: {{path: {ledger}}}
providers: {{}}
models: {{}}
"""


@pytest.fixture
def client(tmp_path: Path) -> Any:
    (tmp_path / "keys.json").write_text('{"keys": []}')
    text = CONFIG.format(keys=tmp_path / "keys.json", ledger=tmp_path / "usage.sqlite3")
    with TestClient(create_app(parse_config(text))) as client:
        yield client


@pytest.fixture
def document(client: Any) -> dict[str, Any]:
    answer = client.get("/openapi.json")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    return json.loads(answer.content)


def test_every_registered_route_is_documented(client: Any, document: dict[str, Any]) -> None:
    routes = app_routes(client.app)
    assert len(routes) >= 12
    for method, path in routes:
        operation = document["paths"].get(path, {}).get(method.lower())
        assert operation is not None, f"{method} {path} is missing from /openapi.json"
        assert not operation.get(UNDOCUMENTED), f"{method} {path}: add it to OPERATIONS"
    documented = {(m.upper(), p) for p, item in document["paths"].items() for m in item}
    assert documented == set(routes)


def test_it_is_a_valid_openapi_3_1_document(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1")
    validate(document)  # raises on any violation of the OpenAPI 3.1 schema


def test_the_validator_would_notice_a_broken_document(document: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(document))
    broken["paths"]["/healthz"]["get"]["responses"] = "none"
    with pytest.raises(OpenAPIValidationError):
        validate(broken)


def test_bodies_queries_security_and_errors_are_described(document: dict[str, Any]) -> None:
    paths = document["paths"]
    body = paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/ChatRequest"}
    chat = document["components"]["schemas"]["ChatRequest"]
    assert {"model", "messages"} <= set(chat["required"])
    for path in ("/v1/completions", "/v1/embeddings"):
        assert "requestBody" in paths[path]["post"]
    usage = {p["name"] for p in paths["/v1/usage"]["get"]["parameters"]}
    assert usage == {"tenant", "from", "to", "group_by", "format"}
    assert set(document["components"]["securitySchemes"]) == {"bearerAuth", "apiKeyAuth"}
    assert paths["/healthz"]["get"]["security"] == []
    assert paths["/openapi.json"]["get"]["security"] == []
    error = {"$ref": "#/components/schemas/ErrorBody"}
    for status in ("400", "401", "404", "413", "429", "502", "503", "504"):
        content = paths["/v1/chat/completions"]["post"]["responses"][status]["content"]
        assert content["application/json"]["schema"] == error
    detail = document["components"]["schemas"]["ErrorDetail"]
    assert detail["required"] == ["code", "message", "param", "type"]


def test_the_document_needs_no_credentials_and_is_cached(client: Any) -> None:
    first = client.get("/openapi.json")
    assert client.get("/v1/models").status_code == 401  # tenants are on
    assert first.status_code == 200
    assert client.get("/openapi.json").content == first.content


def test_an_undescribed_route_still_appears_marked() -> None:
    document = build_document([("GET", "/v1/new/{thing}")])
    operation = document["paths"]["/v1/new/{thing}"]["get"]
    assert operation[UNDOCUMENTED] is True
    assert operation["parameters"][0]["in"] == "path"
    validate(document)


def test_litestar_path_types_are_dropped() -> None:
    assert openapi_path("/v1/models/{model_id:path}") == "/v1/models/{model_id}"
    assert openapi_path("/healthz") == "/healthz"
