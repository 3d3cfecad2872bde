"""A schema-driven fuzz pass over every endpoint of a real ``switchyard serve`` process
(issue 10), with tenants on.

Part one runs schemathesis from the gateway's own ``/openapi.json`` (examples, coverage and
fuzzing phases; positive and negative data), rotating the credentials per case: a tenant's
key as bearer and as ``x-api-key``, a tenant whose model list is narrower, the admin key,
no key and an unknown key. Part two adds Hypothesis strategies of our own where the schema
cannot say enough: bodies of the right shape carrying hostile values (huge and non-finite
numbers, odd unicode, deep nesting), hostile usage-export times, credentials, raw bytes and
model ids.

Invariants, checked on every answer:
- no 5xx: the fake upstream answers every call, so no 502/503/504 is legitimate here;
- every 4xx body is OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}``;
- the answer matches the document (status, content type, body schema);
and at the end the process is alive, answers ``/healthz``, and its RSS stayed under
``RSS_LIMIT`` (peak sampled after every case).

Bounded: ``MAX_EXAMPLES`` per operation in schemathesis' fuzzing phase (its examples and
coverage phases add a fixed, deterministic set), ``PROPERTY_EXAMPLES`` per property, all
derandomized and without an example database, so a run is the same every time.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psutil
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from core.config import parse_config
from gateway.app import create_app
from gateway.routes.openapi import app_routes, build_document
from policies.auth import KeysFile
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.processes import GatewayProcess

pytestmark = pytest.mark.hostile

ADMIN = "sy-admin-fuzz-0123456789abcdef"
ALIASES = ("chat", "other")  # both answered by the fake upstream, on every endpoint
RSS_LIMIT = int(1.5 * 2**30)
MAX_EXAMPLES = 100  # per operation, schemathesis' fuzzing phase
PROPERTY_EXAMPLES = 150  # per hand-written property
ERROR_KEYS = {"message", "type", "param", "code"}
FUZZ_SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
PROPERTY_SETTINGS = settings(FUZZ_SETTINGS, max_examples=PROPERTY_EXAMPLES)


# ---------------------------------------------------------------- the gateway under test
@dataclass
class Fuzzed:
    """The running gateway, the credentials it knows, and what the run saw."""

    gateway: GatewayProcess
    credentials: dict[str, dict[str, str]]  # name -> headers
    peak_rss: int = 0
    cases: Counter[tuple[str, int]] = field(default_factory=Counter)  # (operation, status)
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)  # (property, status)
    started: float = field(default_factory=time.monotonic)

    def log_tail(self, chars: int = 4000) -> str:
        return self.gateway.log_path.read_text(errors="replace")[-chars:]

    def sample_rss(self) -> int:
        """The process's RSS now (and the peak so far); fails once it passes the limit."""
        assert self.gateway.proc is not None
        rss = int(psutil.Process(self.gateway.proc.pid).memory_info().rss)
        self.peak_rss = max(self.peak_rss, rss)
        assert rss < RSS_LIMIT, f"gateway RSS {rss / 2**20:.0f} MiB over the limit"
        return rss


def _config(folder: Path, upstream: str) -> str:
    """Tenants on, generous limits (so requests reach the upstream call), prices (so the
    spend estimate runs), one tenant limited to one alias (403 paths)."""
    target = "{provider: oa, model: m-fuzz, price: {input_per_mtok: 1, output_per_mtok: 2}}"
    limits = "{rpm: 1000000, tpm: 1000000000, concurrency: 64, usd_per_day: 1000000}"
    return f"""
server: {{watch_config: false}}
logging: {{level: warning, json: true}}
auth: {{admin_key_env: F_ADMIN, keys_file: {folder / "keys.json"}}}
tenants:
  fuzz: {{limits: {limits}}}
  narrow: {{limits: {limits}, models: [chat]}}
ledger: {{path: {folder / "usage.sqlite3"}}}
providers:
  oa: {{type: openai, base_url: "{upstream}/v1", api_key_env: F_OA}}
models:
  chat: {{targets: [{target}]}}
  other: {{targets: [{target}]}}
"""


def _credentials(keys: KeysFile) -> dict[str, dict[str, str]]:
    fuzz_key, _ = keys.create("fuzz", "fuzz")
    narrow_key, _ = keys.create("narrow", "fuzz")
    return {
        "fuzz-bearer": {"authorization": f"Bearer {fuzz_key}"},
        "fuzz-x-api-key": {"x-api-key": fuzz_key},
        "narrow-bearer": {"authorization": f"Bearer {narrow_key}"},
        "admin-bearer": {"authorization": f"Bearer {ADMIN}"},
        "admin-x-api-key": {"x-api-key": ADMIN},
        "none": {},
        "unknown-key": {"authorization": "Bearer sy-0000000000000000000000000000dead"},
    }


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    folder = tmp_path_factory.mktemp("fuzz")
    credentials = _credentials(KeysFile(folder / "keys.json"))
    with ExitStack() as stack:
        upstream = stack.enter_context(serve(FakeOpenAI()))
        config = folder / "gateway.yaml"
        config.write_text(_config(folder, upstream.url))
        env = {"F_ADMIN": ADMIN, "F_OA": "sk-upstream"}
        gateway = GatewayProcess(config, env, folder / "gateway.log")
        stack.callback(gateway.kill)
        gateway.start()
        yield Fuzzed(gateway, credentials)


# ---------------------------------------------------------------- invariants
def error_shape_problem(status: int, content_type: str, body: bytes, path: str = "") -> str | None:
    """Why a 4xx answer is not the route's error shape (Anthropic's on /v1/messages,
    OpenAI's elsewhere), or None when it is."""
    if not 400 <= status < 500:
        return None
    if not content_type.startswith("application/json"):
        return f"{status} with content type {content_type!r}"
    if path.startswith("/v1/messages"):
        return anthropic_shape_problem(status, body)
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return f"{status} body is not {{'error': {{...}}}}: {body[:300]!r}"
    if not isinstance(error, dict) or set(error) != ERROR_KEYS:
        return f"{status} error is {error!r}, not an object with {sorted(ERROR_KEYS)}"
    strings = isinstance(error["message"], str) and isinstance(error["type"], str)
    nullable = all(error[k] is None or isinstance(error[k], str) for k in ("param", "code"))
    return None if strings and nullable else f"{status} wrong types in {error!r}"


def anthropic_shape_problem(status: int, body: bytes) -> str | None:
    """Why a 4xx answer is not Anthropic's ``{"type": "error", "error": {...}}``."""
    try:
        answer = json.loads(body)
        error = answer["error"]
        ok = answer["type"] == "error" and all(
            isinstance(error[k], str) for k in ("type", "message")
        )
    except (ValueError, KeyError, TypeError):
        return f"{status} body is not Anthropic's error shape: {body[:300]!r}"
    return None if ok else f"{status} wrong Anthropic error {answer!r}"


def assert_sound(fuzzed: Fuzzed, answer: httpx.Response, what: str) -> None:
    """The invariants for one answer of a hand-written property."""
    prop = os.environ.get("PYTEST_CURRENT_TEST", "?").split("::")[-1].split(" ")[0]
    fuzzed.statuses[prop, answer.status_code] += 1
    context = f"{what} -> {answer.status_code} {answer.text[:300]!r}"
    assert answer.status_code < 500, f"{context}\ngateway log:\n{fuzzed.log_tail()}"
    problem = error_shape_problem(
        answer.status_code,
        answer.headers.get("content-type", ""),
        answer.content,
        answer.request.url.path,
    )
    assert problem is None, f"{context}: {problem}"
    fuzzed.sample_rss()


def openai_error_shape(ctx: Any, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """Schemathesis check: a 4xx answer is in the route's error shape."""
    problem = error_shape_problem(
        response.status_code,
        response.headers.get("content-type", [""])[0],
        response.content,
        case.path,
    )
    assert problem is None, problem


CHECKS = [
    not_a_server_error,
    openai_error_shape,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


# ---------------------------------------------------------------- part one: schemathesis
def steer(document: dict[str, Any]) -> dict[str, Any]:
    """The document, with the bodies' ``model`` drawn from the configured aliases (random
    strings would stop nearly every request at 404 before routing, admission and the
    upstream call; negative cases still mutate it, and the properties below send unknown
    models) and the ``model_id`` path parameter from the aliases or any string."""
    schemas = document["components"]["schemas"]
    for name in ("ChatRequest", "CompletionRequest", "EmbeddingRequest"):
        schemas[name]["properties"]["model"] = {"enum": list(ALIASES)}
    known: dict[str, Any] = {"anyOf": [{"enum": list(ALIASES)}, {"type": "string"}]}
    for parameter in document["paths"]["/v1/models/{model_id}"]["get"]["parameters"]:
        if parameter["name"] == "model_id":
            parameter["schema"] = known
    return document


def load_schema() -> Any:
    """The schema the gateway publishes, built in-process from the same code as the served
    one (``test_the_served_document_is_the_fuzzed_one`` checks that they are equal).

    Built at import, not from the live process through ``schemathesis.pytest.from_fixture``:
    schemathesis 4.32's lazy loader sets ``request.node._nodeid``, which pytest 9.2 no
    longer has (AttributeError before any case runs)."""
    app = create_app(parse_config("providers: {}\nmodels: {}\n"))
    schema = schemathesis.openapi.from_dict(steer(build_document(app_routes(app))))
    schema.config.generation.update(
        max_examples=MAX_EXAMPLES,
        deterministic=True,
        database="none",
        with_security_parameters=False,  # credentials come from the rotation below
    )
    return schema


def test_the_served_document_is_the_fuzzed_one(fuzzed: Fuzzed) -> None:
    answer = httpx.get(fuzzed.gateway.url + "/openapi.json", timeout=10)
    assert answer.status_code == 200, answer.text
    assert "authorization" not in answer.request.headers  # no credentials needed
    assert steer(answer.json()) == load_schema().raw_schema


TENANT_ROTATION = (
    "fuzz-bearer",
    "fuzz-bearer",
    "fuzz-x-api-key",
    "narrow-bearer",
    "fuzz-bearer",
    "none",
    "unknown-key",
    "admin-bearer",
)
ADMIN_ROTATION = (
    "admin-bearer",
    "admin-bearer",
    "admin-x-api-key",
    "fuzz-bearer",
    "none",
    "unknown-key",
)
_turn = itertools.count()


def credential_for(path: str) -> str:
    """The next credential in the rotation (deterministic: the cases are)."""
    rotation = ADMIN_ROTATION if path.startswith("/admin/") else TENANT_ROTATION
    return rotation[next(_turn) % len(rotation)]


schema = load_schema()


@schema.parametrize()
@FUZZ_SETTINGS
def test_every_operation_holds_its_invariants(case: schemathesis.Case, fuzzed: Fuzzed) -> None:
    headers = fuzzed.credentials[credential_for(case.path)]
    response = case.call(base_url=fuzzed.gateway.url, headers=headers, timeout=30)
    fuzzed.cases[f"{case.method} {case.path}", response.status_code] += 1
    if response.status_code >= 500:  # the traceback is in the gateway's log
        print(f"{case.method} {case.path} -> {response.status_code}\n{fuzzed.log_tail(2500)}")
    case.validate_response(response, checks=CHECKS, headers=headers)
    fuzzed.sample_rss()


# ---------------------------------------------------------------- part two: our own strategies
class Raw(str):
    """JSON text spliced into a body as is (numbers JSON cannot round-trip through Python:
    ``1e400``, ``-0``, 5,000 digits, deep nesting without Python recursion)."""


def encode(body: Any) -> bytes:
    """``body`` as JSON, with every ``Raw`` value written verbatim (NaN and Infinity, which
    Python writes as bare words, stay in too: hostile clients send them)."""
    raws: list[str] = []

    def mark(value: Any) -> Any:
        if isinstance(value, Raw):
            raws.append(value)
            return f"\ue000raw{len(raws) - 1}\ue001"
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    text = json.dumps(mark(body))
    for index, raw in enumerate(raws):
        text = text.replace(f'"\\ue000raw{index}\\ue001"', raw, 1)
    return text.encode()


NUMBERS = (
    "1e308",
    "-1e308",
    "1e309",
    "-1e400",
    "1e-400",
    "NaN",
    "Infinity",
    "-Infinity",
    str(2**64),
    str(-(2**63) - 1),
    "9" * 5000,
    "-0",
    "0.1e99999999999",
    "1E+2",
)
ODD_TEXT = (
    "\x00",
    "\\ud800",
    "\ud83d",
    "\u202e\u2066evil",
    "\ufeff",
    "\U0010ffff",
    "e\u0301" * 5000,
    "\U0001f600" * 2000,
    "a" * 200_000,
    "",
    " ",
    "null",
    "[DONE]",
)
scalars = st.one_of(
    st.sampled_from(NUMBERS).map(Raw),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(ODD_TEXT),
    st.text(max_size=64),
    st.booleans(),
    st.none(),
)
hostile = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(st.text(max_size=8), scalars, max_size=3),
)

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}}
BASES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": "chat",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [TOOL],
        "response_format": SCHEMA_FORMAT,
    },
    "/v1/completions": {"model": "chat", "prompt": "hi"},
    "/v1/embeddings": {"model": "chat", "input": "hi"},
}
FIELDS: dict[str, tuple[tuple[str | int, ...], ...]] = {
    "/v1/chat/completions": (
        ("model",),
        ("temperature",),
        ("top_p",),
        ("top_k",),
        ("n",),
        ("max_tokens",),
        ("max_completion_tokens",),
        ("seed",),
        ("presence_penalty",),
        ("frequency_penalty",),
        ("stop",),
        ("user",),
        ("stream",),
        ("stream_options",),
        ("tool_choice",),
        ("parallel_tool_calls",),
        ("logit_bias",),
        ("x_passthrough",),
        ("messages", 0, "content"),
        ("messages", 0, "name"),
        ("messages", 0, "role"),
        ("tools", 0, "function", "name"),
        ("tools", 0, "function", "parameters"),
        ("response_format", "json_schema", "schema"),
        ("response_format", "type"),
    ),
    "/v1/completions": (
        ("model",),
        ("prompt",),
        ("max_tokens",),
        ("temperature",),
        ("n",),
        ("seed",),
        ("stop",),
        ("stream",),
        ("x_passthrough",),
    ),
    "/v1/embeddings": (
        ("model",),
        ("input",),
        ("dimensions",),
        ("encoding_format",),
        ("user",),
        ("x_passthrough",),
    ),
}
NESTABLE: dict[str, tuple[tuple[str | int, ...], ...]] = {
    "/v1/chat/completions": (
        ("tools", 0, "function", "parameters", "properties"),
        ("response_format", "json_schema", "schema", "properties"),
        ("x_passthrough",),
        ("messages", 0, "content"),
        ("metadata",),
    ),
    "/v1/completions": (("prompt",), ("x_passthrough",)),
    "/v1/embeddings": (("input",), ("x_passthrough",)),
}


def placed(route: str, path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A fresh copy of ``route``'s valid base body with ``value`` at ``path``."""
    body = json.loads(json.dumps(BASES[route]))
    where = body
    for step in path[:-1]:
        where = where[step]
    where[path[-1]] = value
    return body


def nested(depth: int, kind: str) -> Raw:
    """``depth`` levels of arrays or objects around a number, as JSON text."""
    if kind == "array":
        return Raw("[" * depth + "1" + "]" * depth)
    return Raw('{"a":' * depth + "1" + "}" * depth)


def post(
    client: httpx.Client,
    fuzzed: Fuzzed,
    route: str,
    body: bytes,
    content_type: str = "application/json",
) -> httpx.Response:
    headers = {**fuzzed.credentials["fuzz-bearer"], "content-type": content_type}
    return client.post(route, content=body, headers=headers)


@pytest.fixture(scope="module")
def client(fuzzed: Fuzzed) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzzed.gateway.url, timeout=30) as client:
        yield client


@PROPERTY_SETTINGS
@given(data=st.data(), route=st.sampled_from(sorted(BASES)), value=hostile)
def test_hostile_values_in_every_field(
    client: httpx.Client, fuzzed: Fuzzed, data: st.DataObject, route: str, value: Any
) -> None:
    """A valid body with one field replaced by a hostile value: huge, negative-zero or
    non-finite numbers, lone surrogates, bidi controls, 200k characters, wrong types."""
    path = data.draw(st.sampled_from(FIELDS[route]), label="field")
    answer = post(client, fuzzed, route, encode(placed(route, path, value)))
    assert_sound(fuzzed, answer, f"POST {route} with {path}={str(value)[:200]!r}")


@PROPERTY_SETTINGS
@given(
    data=st.data(),
    route=st.sampled_from(sorted(BASES)),
    depth=st.sampled_from([32, 512, 5_000, 100_000]),
    kind=st.sampled_from(["array", "object"]),
)
def test_deep_nesting_anywhere_in_a_body(
    client: httpx.Client, fuzzed: Fuzzed, data: st.DataObject, route: str, depth: int, kind: str
) -> None:
    """Deeply nested JSON under the body limit, in typed fields and passthrough ones: a
    400 (or a 200 where the depth is harmless), never a 500."""
    path = data.draw(st.sampled_from(NESTABLE[route]), label="field")
    answer = post(client, fuzzed, route, encode(placed(route, path, nested(depth, kind))))
    assert_sound(fuzzed, answer, f"POST {route} with {depth} levels of {kind} at {path}")


TIMES = (
    "1e308",
    "-1e20",
    "1e400",
    "nan",
    "inf",
    "-inf",
    "NaN",
    "99999999999999999999",
    "-99999999999",
    "0",
    "-0",
    "1.5",
    "2024-13-45",
    "9999-12-31T23:59:59",
    "9999-12-31",
    "0001-01-01",
    "10000-01-01",
    "",
    " ",
    "\u0661\u0662\u0663",
    "1_000",
    "0x10",
    "2024-01-01T00:00:00+99:00",
    "2024-01-01T25:00:00Z",
)


@PROPERTY_SETTINGS
@given(
    route=st.sampled_from(["/v1/usage", "/admin/usage"]),
    start=st.one_of(st.none(), st.sampled_from(TIMES), st.text(max_size=24)),
    end=st.one_of(st.none(), st.sampled_from(TIMES), st.text(max_size=24)),
    group_by=st.one_of(st.none(), st.sampled_from(["day", "model", "key"]), st.text(max_size=8)),
    fmt=st.one_of(st.none(), st.sampled_from(["csv", "jsonl"]), st.text(max_size=8)),
)
def test_usage_export_parameters(
    client: httpx.Client,
    fuzzed: Fuzzed,
    route: str,
    start: str | None,
    end: str | None,
    group_by: str | None,
    fmt: str | None,
) -> None:
    """Out-of-range, non-finite and malformed times and choices: 400 naming the
    parameter, never a 500."""
    params = {
        k: v
        for k, v in {"from": start, "to": end, "group_by": group_by, "format": fmt}.items()
        if v is not None
    }
    who = "admin-bearer" if route.startswith("/admin") else "fuzz-bearer"
    answer = client.get(route, params=params, headers=fuzzed.credentials[who])
    assert_sound(fuzzed, answer, f"GET {route} {params!r}")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


header_text = st.binary(max_size=4096).map(
    lambda raw: bytes(b if 0x21 <= b <= 0x7E or b >= 0x80 else 0x41 for b in raw)
)
jwt_like = st.tuples(st.binary(max_size=256), st.binary(max_size=512), st.binary(max_size=64)).map(
    lambda parts: ".".join(_b64(p) for p in parts).encode()
)
alg_none = st.dictionaries(
    st.sampled_from(["tenant", "sub", "iat", "exp", "aud"]),
    st.one_of(st.integers(), st.text(max_size=16)),
    max_size=5,
).map(
    lambda claims: (
        _b64(b'{"alg":"none","typ":"JWT"}') + "." + _b64(json.dumps(claims).encode()) + "."
    ).encode()
)
SCHEMES = (b"Bearer ", b"bearer ", b"Basic ", b"Bearer  ", b"")


def _header(name: str) -> Any:
    """A (name, value) pair; HTTP forbids whitespace around a value, so it is trimmed."""
    return lambda value: (name, value.strip(b" "))


credentials = st.one_of(
    st.tuples(st.sampled_from(SCHEMES), st.one_of(header_text, jwt_like, alg_none))
    .map(lambda parts: parts[0] + parts[1])
    .map(_header("authorization")),
    st.one_of(header_text, jwt_like).map(_header("x-api-key")),
)


@PROPERTY_SETTINGS
@given(
    route=st.sampled_from(["/v1/models", "/v1/chat/completions", "/v1/usage", "/admin/targets"]),
    credential=credentials,
)
def test_hostile_credentials(
    client: httpx.Client, fuzzed: Fuzzed, route: str, credential: tuple[str, bytes]
) -> None:
    """Garbage, JWT-shaped garbage, ``alg: none`` tokens, other schemes, non-ASCII bytes:
    401 in OpenAI's shape, never a 500."""
    headers = {credential[0]: credential[1]}
    if route == "/v1/chat/completions":
        answer = client.post(route, content=encode(BASES[route]), headers=headers)
    else:
        answer = client.get(route, headers=headers)
    assert_sound(fuzzed, answer, f"{route} with {credential[0]}: {credential[1][:120]!r}")


VALID_CHAT = encode(BASES["/v1/chat/completions"])
CONTENT_TYPES = (
    "application/json",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json; charset=latin-1",
)
raw_bodies = st.one_of(
    st.binary(max_size=2048),
    st.sampled_from(
        [
            b"",
            b"[]",
            b"1",
            b"null",
            b'"chat"',
            b"\xef\xbb\xbf" + VALID_CHAT,
            VALID_CHAT.replace(b'"hi"', b'"\xff\xfe\xc3"'),
            b'{"model": "chat", "model": 1, "messages": [{"role": "user"}]}',
            b" " * 100_000 + VALID_CHAT,
            VALID_CHAT + b"garbage",
        ]
    ),
    st.integers(min_value=0, max_value=len(VALID_CHAT) - 1).map(lambda n: VALID_CHAT[:n]),
)


@PROPERTY_SETTINGS
@given(
    route=st.sampled_from([*sorted(BASES), "/admin/reload"]),
    body=raw_bodies,
    content_type=st.sampled_from(CONTENT_TYPES),
)
def test_raw_bytes_bodies(
    client: httpx.Client, fuzzed: Fuzzed, route: str, body: bytes, content_type: str
) -> None:
    """Bodies that are not JSON objects: random bytes, invalid UTF-8, a BOM, truncations,
    duplicate keys, trailing garbage, under any content type."""
    answer = post(client, fuzzed, route, body, content_type)
    assert_sound(fuzzed, answer, f"POST {route} ({content_type}) {body[:200]!r}")


model_ids = st.one_of(
    st.text(min_size=1, max_size=200),
    st.sampled_from(
        [
            "..",
            "../../admin/usage",
            "%2e%2e%2fadmin",
            "%00",
            "chat%00",
            "chat/",
            "/chat",
            "chat?x=1",
            "\u202echat",
            "x" * 4000,
            "chat#frag",
        ]
    ),
)


@PROPERTY_SETTINGS
@given(model_id=model_ids)
def test_model_ids_in_the_path(client: httpx.Client, fuzzed: Fuzzed, model_id: str) -> None:
    """Any model id in ``/v1/models/{id}``: 200 for a known alias, else 404 (or 401)."""
    answer = client.get(
        "/v1/models/" + quote(model_id, safe="/%?#"), headers=fuzzed.credentials["fuzz-bearer"]
    )
    assert_sound(fuzzed, answer, f"GET /v1/models/{model_id[:200]!r}")


# ---------------------------------------------------------------- at the end
def test_the_gateway_survived_the_fuzz(fuzzed: Fuzzed) -> None:
    """Runs last (file order): the process is alive, answers, and its RSS stayed bounded."""
    assert fuzzed.gateway.proc is not None and fuzzed.gateway.proc.poll() is None, (
        f"the gateway died:\n{fuzzed.log_tail()}"
    )
    assert httpx.get(fuzzed.gateway.url + "/healthz", timeout=5).status_code == 200
    rss = fuzzed.sample_rss()
    print(f"\nschemathesis: {sum(fuzzed.cases.values())} cases")
    for operation, statuses in per_operation(fuzzed.cases).items():
        print(f"  {operation}: {sum(statuses.values())} {dict(sorted(statuses.items()))}")
    print(f"properties: {sum(fuzzed.statuses.values())} requests")
    for prop, statuses in per_operation(fuzzed.statuses, by_name=True).items():
        print(f"  {prop}: {sum(statuses.values())} {dict(sorted(statuses.items()))}")
    print(
        f"RSS now {rss / 2**20:.0f} MiB, peak {fuzzed.peak_rss / 2**20:.0f} MiB; "
        f"{time.monotonic() - fuzzed.started:.0f} s in all"
    )


def per_operation(
    cases: Counter[tuple[str, int]], by_name: bool = False
) -> dict[str, Counter[int]]:
    """Statuses per documented operation (or per name); methods the document does not list
    (the coverage phase tries them all, expecting 405) are summed under one line."""
    documented = {
        f"{m.upper()} {p}" for p, item in load_schema().raw_schema["paths"].items() for m in item
    }
    grouped: dict[str, Counter[int]] = {}
    for (operation, status), count in sorted(cases.items()):
        name = operation if by_name or operation in documented else "undocumented methods"
        grouped.setdefault(name, Counter())[status] += count
    return grouped
