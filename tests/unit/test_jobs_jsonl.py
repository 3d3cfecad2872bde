"""Batch input files: every bad line reported with its number and the field at fault; the
gateway's body check (model aliases, the tenant's model rules, the endpoint's schema);
output lines that stay one line of JSON whatever the body."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from core.clock import FakeClock
from core.config import parse_config
from core.tenancy import Principal
from gateway.jobs.validate import body_check
from policies.auth import Authenticator
from policies.jobs.jsonl import MAX_ERRORS, describe, parse_jsonl
from policies.jobs.objects import answered_line, dropped_line

CHAT = "/v1/chat/completions"


def line(custom_id: Any = "a", url: str = CHAT, method: str = "POST", **body: Any) -> str:
    fields = {"custom_id": custom_id, "method": method, "url": url}
    fields["body"] = body or {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({k: v for k, v in fields.items() if v is not None})


def errors_of(*lines: str, **kwargs: Any) -> list[tuple[int | None, str, str | None]]:
    _, errors = parse_jsonl("\n".join(lines).encode(), **kwargs)
    return [(e.line, e.code, e.param) for e in errors]


def test_a_valid_file_keeps_each_body_as_written() -> None:
    body = '{"model": "chat",  "messages": [{"role": "user", "content": "hi"}]}'
    text = f'{{"custom_id": "x", "method": "POST", "url": "{CHAT}", "body": {body}}}'
    requests, errors = parse_jsonl((text + "\r\n\n" + line("y") + "\n").encode())
    assert errors == []
    assert [(r.line, r.custom_id, r.model) for r in requests] == [
        (1, "x", "chat"),
        (3, "y", "chat"),
    ]
    assert requests[0].body == body.encode()  # the exact bytes, spacing included


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ("{not json", ("invalid_json_line", None)),
        ("[1, 2]", ("invalid_json_line", None)),
        (line(custom_id=None), ("missing_required_parameter", "custom_id")),
        (line(custom_id=""), ("missing_required_parameter", "custom_id")),
        (line(custom_id=7), ("invalid_value", "custom_id")),
        (line(custom_id="a\u0000b"), ("invalid_value", "custom_id")),  # no database holds NUL
        (line(method="GET"), ("invalid_method", "method")),
        (line(url="/v1/images/generations"), ("invalid_url", "url")),
        (line(url="/v1/embeddings"), ("invalid_url", "url")),  # not the batch's endpoint
        (
            '{"custom_id": "b", "method": "POST", "url": "/v1/chat/completions"}',
            ("missing_required_parameter", "body"),
        ),
        (line(messages=[]), ("missing_required_parameter", "body.model")),
        (line(model="chat", messages=[], stream=True), ("invalid_request", "body.stream")),
    ],
)
def test_each_bad_line_is_named_with_its_number(bad: str, expected: tuple[str, str]) -> None:
    assert errors_of(line("ok"), bad, endpoint=CHAT) == [(2, *expected)]


def test_a_duplicate_custom_id_is_an_error_of_the_later_line() -> None:
    assert errors_of(line("a"), line("b"), line("a")) == [(3, "duplicate_custom_id", "custom_id")]
    # an id is taken by its first line even when that line is bad otherwise
    assert errors_of(line("a", method="PUT"), line("a")) == [
        (1, "invalid_method", "method"),
        (2, "duplicate_custom_id", "custom_id"),
    ]


def test_empty_too_long_and_many_errors() -> None:
    assert errors_of("", "  ") == [(None, "empty_file", None)]
    assert errors_of(*(line(f"r{i}") for i in range(4)), max_requests=3)[0][1:] == (
        "too_many_requests",
        None,
    )
    _, errors = parse_jsonl(("{\n" * (MAX_ERRORS + 50)).encode())
    assert len(errors) == MAX_ERRORS
    assert describe(errors, 2).startswith("Line 1: ")
    assert describe(errors, 2).endswith(f"(and {MAX_ERRORS - 2} more)")


# ---------------------------------------------------------------- the gateway's check
CONFIG = """
tenants:
  acme: {models: [chat]}
  globex: {}
providers: {oa: {type: openai, base_url: "http://127.0.0.1:9/v1"}}
models:
  chat: {targets: [{provider: oa, model: m}]}
  embed: {targets: [{provider: oa, model: e}]}
"""


def check_for(tenant: str) -> Any:
    config = parse_config(CONFIG)
    runtime = SimpleNamespace(config=config, auth=Authenticator(config, {}, FakeClock()))
    return body_check(runtime, Principal(tenant=tenant, key_id="k", via="api_key"))  # type: ignore[arg-type]


def test_the_body_check_knows_aliases_model_rules_and_schemas() -> None:
    acme, globex = check_for("acme"), check_for("globex")
    lines = [
        line("ok"),
        line("unknown", model="gpt-9", messages=[]),
        line("denied", model="embed", messages=[{"role": "user", "content": "x"}]),
        line("schema", model="chat", messages=[{"role": "wizard", "content": "x"}]),
        line("temp", model="chat", messages=[{"role": "user", "content": "x"}], temperature="hot"),
    ]
    got = errors_of(*lines, endpoint=CHAT, check=acme)
    assert got == [
        (2, "model_not_found", "body.model"),
        (3, "model_not_allowed", "body.model"),
        (4, "invalid_request", "body.messages[0].role"),
        (5, "invalid_request", "body.temperature"),
    ]
    assert [e[0] for e in errors_of(*lines, endpoint=CHAT, check=globex)] == [2, 4, 5]
    embeddings = line("e", url="/v1/embeddings", model="embed", input=["a", "b"])
    assert errors_of(embeddings, endpoint="/v1/embeddings", check=globex) == []
    responses = line("r", url="/v1/responses", model="chat", input="hi")
    assert errors_of(responses, endpoint="/v1/responses", check=globex) == []
    stateful = line("s", url="/v1/responses", model="chat", input="hi", background=True)
    assert errors_of(stateful, check=globex)[0][:2] == (1, "invalid_request")


# ---------------------------------------------------------------- output lines
def test_output_lines_are_one_line_of_json_whatever_the_body() -> None:
    kept = json.loads(answered_line("a", 200, "req_1", b'{"x": 1.50}'))
    assert kept["id"].startswith("batch_req_") and kept["error"] is None
    assert kept["response"] == {"status_code": 200, "request_id": "req_1", "body": {"x": 1.5}}
    assert b'"x": 1.50' in answered_line("a", 200, "req_1", b'{"x": 1.50}')  # as written
    pretty = answered_line("b", 200, "req_2", b'{\n  "x": [1,\n 2]\n}')
    assert b"\n" not in pretty and json.loads(pretty)["response"]["body"] == {"x": [1, 2]}
    broken = json.loads(answered_line("c", 502, "req_3", b"upstream said\nno"))
    assert broken["response"]["body"]["error"]["message"] == "upstream said\nno"
    dropped = json.loads(dropped_line("d", "expired"))
    assert dropped["response"] is None and dropped["error"]["code"] == "batch_expired"
