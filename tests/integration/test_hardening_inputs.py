"""Hostile request bodies over real HTTP (issue 10, defect 3 and its neighbours): every one
is a 4xx in OpenAI's error shape, never a 500, and nothing reaches the upstream."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fixtures.fake_openai import FakeOpenAI
from tests.integration.gateway_harness import Gateway, running_gateway

USER = [{"role": "user", "content": "hi"}]
ROUTES = ("/chat/completions", "/completions", "/embeddings")
MAX_JSON_DEPTH = 128  # gateway.http.errors.MAX_JSON_DEPTH, spelled out: the contract under test


@pytest.fixture(scope="module")
def gateway(fake: FakeOpenAI) -> Iterator[Gateway]:
    config = f"""
server: {{max_body_bytes: 1048576}}
providers:
  oa: {{type: openai, base_url: "{fake.url}/v1", api_key_env: T_OA}}
models:
  chat: {{targets: [{{provider: oa, model: m-ok}}]}}
  embed: {{targets: [{{provider: oa, model: text-embedding-3-small}}]}}
"""
    with running_gateway(config, {"T_OA": "sk-upstream"}) as gw:
        yield gw


def post(gateway: Gateway, route: str, content: bytes) -> httpx.Response:
    return httpx.post(
        gateway.base_url + route,
        content=content,
        headers={"content-type": "application/json"},
        timeout=30,
    )


def assert_openai_400(answer: httpx.Response, param: str | None = None) -> dict[str, object]:
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    assert answer.headers["x-request-id"]
    return error


def nested_object(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def nested_array(depth: int) -> str:
    return "[" * depth + "]" * depth


def chat_with_tool_parameters(parameters: str) -> bytes:
    tool = '{"type":"function","function":{"name":"f","parameters":' + parameters + "}}"
    head = '{"model":"chat","messages":[{"role":"user","content":"hi"}],"tools":['
    return (head + tool + "]}").encode()


def body_with_extra(route: str, extra: str) -> bytes:
    head = {
        "/chat/completions": '"model":"chat","messages":[{"role":"user","content":"hi"}]',
        "/completions": '"model":"chat","prompt":"hi"',
        "/embeddings": '"model":"embed","input":"hi"',
    }[route]
    return ("{" + head + ',"x_passthrough":' + extra + "}").encode()


def test_5000_levels_in_tool_parameters_is_400(gateway: Gateway, fake: FakeOpenAI) -> None:
    before = len(fake.requests)
    error = assert_openai_400(
        post(gateway, "/chat/completions", chat_with_tool_parameters(nested_object(5000)))
    )
    assert "nesting" in str(error["message"])
    assert error["code"] == "json_too_deep"
    assert len(fake.requests) == before


@pytest.mark.parametrize("route", ROUTES)
def test_100000_levels_in_a_passthrough_field_is_400(
    gateway: Gateway, fake: FakeOpenAI, route: str
) -> None:
    before = len(fake.requests)
    error = assert_openai_400(post(gateway, route, body_with_extra(route, nested_array(100_000))))
    assert f"{MAX_JSON_DEPTH} levels" in str(error["message"])
    assert len(fake.requests) == before


def test_nesting_at_the_limit_is_served(gateway: Gateway, fake: FakeOpenAI) -> None:
    """The limit counts every level of the body, the outer object included."""
    inner = MAX_JSON_DEPTH - 4  # under the body, the tools list, the tool, its function
    body = chat_with_tool_parameters(nested_object(inner))
    answer = post(gateway, "/chat/completions", body)
    assert answer.status_code == 200, answer.text
    assert fake.requests[-1].json["tools"][0]["function"]["parameters"]
    over = chat_with_tool_parameters(nested_object(inner + 1))
    assert_openai_400(post(gateway, "/chat/completions", over))


def test_brackets_inside_strings_do_not_count(gateway: Gateway) -> None:
    text = "[{" * 5000 + '\\"' + "}]" * 5000
    body = b'{"model":"chat","messages":[{"role":"user","content":"%s"}]}' % text.encode()
    answer = post(gateway, "/chat/completions", body)
    assert answer.status_code == 200, answer.text


M = b'[{"role":"user","content":"hi"}]'
HOSTILE_CHAT_BODIES: dict[str, tuple[bytes, str | None]] = {
    "nan temperature": (b'{"model":"chat","messages":M,"temperature":NaN}', None),
    "infinity max_tokens": (b'{"model":"chat","messages":M,"max_tokens":Infinity}', None),
    "1e400 temperature": (b'{"model":"chat","messages":M,"temperature":1e400}', "temperature"),
    "1e400 max_tokens": (b'{"model":"chat","messages":M,"max_tokens":1e400}', "max_tokens"),
    "huge int max_tokens": (
        b'{"model":"chat","messages":M,"max_tokens":' + b"9" * 400 + b"}",
        None,
    ),
    "negative max_tokens": (b'{"model":"chat","messages":M,"max_tokens":-5}', "max_tokens"),
    "1e400 n": (b'{"model":"chat","messages":M,"n":1e400}', "n"),
    "list body": (b'[{"model":"chat","messages":M}]', None),
    "number body": (b"42", None),
    "string body": (b'"chat"', None),
    "null body": (b"null", None),
    "empty object": (b"{}", "model"),
    "non-utf8 bytes": (b'{"model":"ch\xff\xfeat","messages":M}', None),
    "lone surrogate escape": (b'{"model":"\\ud800","messages":M}', None),
    "model is a number": (b'{"model":1e400,"messages":M}', "model"),
    "messages is an object": (b'{"model":"chat","messages":{"a":M}}', "messages"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_CHAT_BODIES))
def test_hostile_chat_bodies_are_400_in_openai_shape(
    gateway: Gateway, fake: FakeOpenAI, name: str
) -> None:
    template, param = HOSTILE_CHAT_BODIES[name]
    before = len(fake.requests)
    assert_openai_400(post(gateway, "/chat/completions", template.replace(b"M", M)), param)
    assert len(fake.requests) == before


def test_enormous_model_name_is_400_with_bounded_message(gateway: Gateway) -> None:
    """Model names are at most 256 characters: a longer one is never echoed or logged."""
    name = "m" * 500_000
    for path in ("/chat/completions", "/completions", "/embeddings"):
        extra = (
            b'"messages":[{"role":"user","content":"hi"}]'
            if "chat" in path
            else b'"prompt":"hi","input":"hi"'
        )
        body = b'{"model":"%s",%s}' % (name.encode(), extra)
        answer = post(gateway, path, body)
        assert answer.status_code == 400, answer.text[:300]
        assert answer.json()["error"]["param"] == "model"
        assert len(answer.content) < 1000


def test_duplicate_keys_are_served_with_the_last_value(gateway: Gateway, fake: FakeOpenAI) -> None:
    """JSON leaves duplicate keys to the parser: msgspec keeps the last one, like Python's
    json and OpenAI's own API. What matters is one consistent reading, never a 500."""
    body = b'{"model":"nope","model":"chat","messages":[{"role":"user","content":"hi"}]}'
    answer = post(gateway, "/chat/completions", body)
    assert answer.status_code == 200, answer.text


def test_a_too_deep_body_leaves_one_log_line_and_no_traceback(
    gateway: Gateway, capfd: pytest.CaptureFixture[str]
) -> None:
    capfd.readouterr()
    post(gateway, "/chat/completions", body_with_extra("/chat/completions", nested_array(100_000)))
    out, err = capfd.readouterr()
    lines = [line for line in (out + err).splitlines() if "request." in line]
    assert len(lines) == 1, lines
    assert "status=400" in lines[0] or '"status": 400' in lines[0]
    assert "Traceback" not in out + err and "RecursionError" not in out + err
