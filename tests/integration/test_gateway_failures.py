"""End to end: every error mapping, fallback, mid-stream failure and client disconnect."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "Say hello"}]


def post(gateway, payload=None, content=None, **kwargs):
    return httpx.post(
        gateway.base_url + "/chat/completions", json=payload, content=content, timeout=10, **kwargs
    )


def assert_openai_error(response, status, param=None, code=None):
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert response.headers["x-request-id"]
    return error


@pytest.mark.parametrize("body", [b"{not json", b"", b"[1, 2]", b'{"model": "gpt-4o-mini"'])
def test_malformed_json_is_400(gateway, body):
    assert_openai_error(post(gateway, content=body), 400)


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"messages": USER}, "model"),
        ({"model": "gpt-4o-mini"}, "messages"),
        ({"model": "gpt-4o-mini", "messages": []}, "messages"),
        ({"model": "gpt-4o-mini", "messages": USER, "temperature": 3}, "temperature"),
        ({"model": "gpt-4o-mini", "messages": USER, "max_tokens": 0}, "max_tokens"),
        ({"model": "gpt-4o-mini", "messages": USER, "top_p": "high"}, "top_p"),
        (
            {"model": "gpt-4o-mini", "messages": [{"role": "wizard", "content": "x"}]},
            "messages[0].role",
        ),
        ({"model": "gpt-4o-mini", "messages": USER, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ],
)
def test_schema_violations_are_400_with_param(gateway, fake, payload, param):
    before = len(fake.requests)
    assert_openai_error(post(gateway, payload), 400, param=param)
    assert len(fake.requests) == before  # nothing reached the upstream


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=USER)
    assert info.value.body["code"] == "model_not_found"


def test_body_over_the_limit_is_413(gateway):
    big = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 30000}]}
    assert_openai_error(post(gateway, big), 413, code="payload_too_large")


def test_upstream_timeout_is_504(gateway):
    assert_openai_error(
        post(gateway, {"model": "slow", "messages": USER}), 504, code="upstream_timeout"
    )


def test_all_targets_failed_is_502(gateway):
    error = assert_openai_error(post(gateway, {"model": "all-fail", "messages": USER}), 502)
    assert "m-server-error" not in error["message"] or "oa" in error["message"]


def test_all_rate_limited_is_429_with_retry_after(client):
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="all-429", messages=USER)
    assert info.value.response.headers["retry-after"] == "7"


def test_no_usable_target_is_503(gateway):
    error = assert_openai_error(post(gateway, {"model": "keyless", "messages": USER}), 503)
    assert "SWITCHYARD_TEST_UNSET_KEY" in error["message"]


def test_upstream_400_is_passed_through_and_never_falls_back(gateway, fake):
    before = len(fake.requests)
    error = assert_openai_error(post(gateway, {"model": "bad-first", "messages": USER}), 400)
    assert error["message"] == "bad request from upstream"
    assert [r.json["model"] for r in fake.requests[before:]] == ["m-bad-request"]


@pytest.mark.parametrize(
    "alias", ["after-5xx", "after-429", "after-refused", "after-reset", "after-slow"]
)
def test_fallback_to_the_next_target(client, alias):
    raw = client.chat.completions.with_raw_response.create(model=alias, messages=USER)
    assert raw.parse().choices[0].message.content == "Hello from openai!"
    assert raw.headers["x-switchyard-upstream-model"] == "m-ok"
    assert "fallback after" in raw.headers["x-switchyard-route-reason"]


def test_connection_errors_are_retried_before_falling_back(client):
    raw = client.chat.completions.with_raw_response.create(model="after-refused", messages=USER)
    assert raw.headers["x-switchyard-attempts"] == "3"  # 2 tries on the dead target, then oa


def test_stream_falls_back_before_the_first_byte(client):
    chunks = list(client.chat.completions.create(model="after-5xx", messages=USER, stream=True))
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == "Hello from openai!"
    )


def test_failure_after_first_byte_ends_stream_with_error_event(client):
    received = []
    with pytest.raises(openai.APIError) as info:
        for chunk in client.chat.completions.create(model="midstream", messages=USER, stream=True):
            received.append(chunk)
    assert received and received[-1].choices[0].delta.content == "Hello"
    assert "upstream" in str(info.value.message)


def test_truncated_upstream_stream_ends_with_error_event(client):
    with pytest.raises(openai.APIError):
        list(client.chat.completions.create(model="truncated", messages=USER, stream=True))


def test_client_disconnect_cancels_the_upstream_stream(gateway, fake):
    fake.slow_seconds = 5.0
    before = fake.disconnects
    with httpx.stream(
        "POST",
        gateway.base_url + "/chat/completions",
        timeout=10,
        json={"model": "slow-stream", "messages": USER, "stream": True},
    ) as response:
        for line in response.iter_lines():
            if '"Hello"' in line:
                break
    deadline = time.monotonic() + 4
    while fake.disconnects == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fake.disconnects == before + 1


def test_unknown_route_and_method_are_openai_shaped(gateway):
    assert_openai_error(httpx.get(gateway.url + "/v1/nope"), 404)
    assert_openai_error(httpx.get(gateway.base_url + "/chat/completions"), 405)


def test_embeddings_errors(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="embed", input=[[1.5]])  # type: ignore[list-item]
    assert info.value.body["param"].startswith("input")
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="missing", input="x")


def test_process_survives_bad_input(gateway):
    for body in (b"\xff\xfe", b'{"model": 1}', b'{"model": "gpt-4o-mini", "messages": "x"}'):
        assert post(gateway, content=body).status_code == 400
    assert httpx.get(gateway.url + "/healthz").status_code == 200
