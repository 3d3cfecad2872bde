"""``n`` and the output limit in the admission estimate (issue 10, defect 8): a request
reserves output tokens for each of its ``n`` answers; ``n`` above ``routing.max_n`` and an
output limit beyond any model are 400s naming the field."""

from __future__ import annotations

import pytest

from core.config import ModelConfig, RoutingConfig, TargetConfig
from core.errors import InvalidRequestError
from core.routing import RouteRequest
from core.wire import ChatRequest, CompletionRequest, Message
from gateway.request.routing_view import MAX_OUTPUT_TOKENS, completion_output_tokens, route_request

MODEL = ModelConfig(targets=[TargetConfig(provider="oa", model="m")])


def chat(**fields: object) -> ChatRequest:
    return ChatRequest(model="chat", messages=[Message(role="user", content="hi")], **fields)  # type: ignore[arg-type]


def route(req: ChatRequest, **kwargs: int) -> RouteRequest:
    return route_request(req, MODEL, None, {}, tenant_name=None, with_prefix=False, **kwargs)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, 256),
        ({"n": 1}, 256),
        ({"n": 4}, 4 * 256),
        ({"max_tokens": 100, "n": 60}, 6000),
        ({"max_completion_tokens": 50, "max_tokens": 900, "n": 3}, 150),
    ],
)
def test_the_output_estimate_covers_every_answer(fields: dict, expected: int) -> None:
    request = route(chat(**fields))
    assert request.output_tokens == expected
    assert request.answer_tokens * request.n == expected


def test_the_default_cap_on_n_is_routing_max_n() -> None:
    cap = RoutingConfig().max_n
    assert cap == 128
    assert route(chat(n=cap)).n == cap
    with pytest.raises(InvalidRequestError) as info:
        route(chat(n=cap + 1))
    assert (info.value.status, info.value.param) == (400, "n")


def test_a_configured_cap_on_n() -> None:
    assert route(chat(n=8), max_n=8).n == 8
    with pytest.raises(InvalidRequestError) as info:
        route(chat(n=9), max_n=8)
    assert info.value.param == "n"


@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize(
    "value", [MAX_OUTPUT_TOKENS + 1, 10**400, 10**5000], ids=["int32+1", "1e400", "1e5000"]
)
def test_an_output_limit_beyond_any_model_is_400(name: str, value: int) -> None:
    with pytest.raises(InvalidRequestError) as info:
        route(chat(**{name: value}))
    assert (info.value.status, info.value.param) == (400, name)
    assert len(info.value.message) < 200  # the number is not echoed


def test_an_output_limit_at_the_bound_is_kept() -> None:
    assert route(chat(max_tokens=MAX_OUTPUT_TOKENS)).max_tokens == MAX_OUTPUT_TOKENS


def completion(**fields: object) -> CompletionRequest:
    return CompletionRequest(model="c", prompt="hi", **fields)  # type: ignore[arg-type]


def test_completions_reserve_for_every_answer_too() -> None:
    assert completion_output_tokens(completion()) == 256
    assert completion_output_tokens(completion(max_tokens=100, n=60)) == 6000
    assert completion_output_tokens(completion(max_tokens=0)) == 0
    for fields, param in [({"n": 129}, "n"), ({"max_tokens": 10**400}, "max_tokens")]:
        with pytest.raises(InvalidRequestError) as info:
            completion_output_tokens(completion(**fields))
        assert info.value.param == param
    with pytest.raises(InvalidRequestError):
        completion_output_tokens(completion(n=9), max_n=8)
