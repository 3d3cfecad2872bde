"""Anthropic cache_control placement (providers/anthropic/cache_control.py) and OpenAI's
prompt_cache_key rewrite (providers/openai/wire.py), on the exact JSON sent upstream."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.wire import (
    ChatRequest,
    FunctionDef,
    JSONSchemaSpec,
    Message,
    ResponseFormat,
    TextPart,
    Tool,
)
from providers.anthropic import convert, wire
from providers.anthropic.cache_control import MAX_BREAKPOINTS, client_marks, encode_request
from providers.openai.wire import rewrite_body

EPHEMERAL = {"type": "ephemeral"}
LONG = "Follow the house style guide to the letter. " * 100  # 4,400 characters
SHORT = "Be brief."


def tool(name: str, description: str = "") -> Tool:
    return Tool(FunctionDef(name, description, {"type": "object", "properties": {}}))


def body(req: ChatRequest, raw: Any = None, min_chars: int | None = 4096) -> dict[str, Any]:
    raw_bytes = None if raw is None else json.dumps(raw).encode()
    encoded = encode_request(
        req, "claude-x", 1024, stream=False, raw_body=raw_bytes, min_chars=min_chars
    )
    decoded: dict[str, Any] = json.loads(encoded)
    return decoded


def request(*messages: Message, **options: Any) -> ChatRequest:
    return ChatRequest(model="alias", messages=list(messages), **options)


def marks_in(payload: dict[str, Any]) -> list[str]:
    """Where the breakpoints are, in Anthropic's prefix order."""
    found = [
        f"tools[{i}]" for i, t in enumerate(payload.get("tools") or []) if "cache_control" in t
    ]
    system = payload.get("system")
    if isinstance(system, list):
        found += [f"system[{i}]" for i, b in enumerate(system) if "cache_control" in b]
    for m, message in enumerate(payload["messages"]):
        found += [
            f"messages[{m}][{b}]"
            for b, block in enumerate(message["content"])
            if "cache_control" in block
        ]
    return found


# ---------------------------------------------------------------- automatic placement
def test_long_system_prompt_gets_a_breakpoint_on_its_last_block() -> None:
    payload = body(request(Message("system", LONG), Message("user", "Hi")))
    assert payload["system"] == [{"type": "text", "text": LONG, "cache_control": EPHEMERAL}]
    assert marks_in(payload) == ["system[0]"]


def test_several_system_blocks_mark_only_the_last() -> None:
    payload = body(
        request(Message("system", LONG), Message("developer", SHORT), Message("user", "Hi"))
    )
    assert payload["system"] == [
        {"type": "text", "text": LONG},
        {"type": "text", "text": SHORT, "cache_control": EPHEMERAL},
    ]


def test_short_prompt_is_left_exactly_as_convert_builds_it() -> None:
    req = request(Message("system", SHORT), Message("user", "Hi"), tools=[tool("f")])
    expected = json.loads(
        wire.encoder.encode(convert.build_request(req, "claude-x", 1024, stream=False))
    )
    assert body(req) == expected
    assert expected["system"] == SHORT  # still a plain string
    assert body(request(Message("system", LONG), Message("user", "Hi")), min_chars=None) == (
        json.loads(
            wire.encoder.encode(
                convert.build_request(
                    request(Message("system", LONG), Message("user", "Hi")),
                    "claude-x",
                    1024,
                    stream=False,
                )
            )
        )
    )


def test_long_tool_definitions_get_a_breakpoint_on_the_last_tool() -> None:
    tools = [tool("search", LONG), tool("fetch", "Fetch a page")]
    payload = body(request(Message("system", SHORT), Message("user", "Hi"), tools=tools))
    assert payload["tools"][1]["cache_control"] == EPHEMERAL
    assert marks_in(payload) == ["tools[1]"]  # a short system prompt after them: no write
    assert payload["system"] == SHORT


def test_long_tools_and_long_system_get_two_breakpoints() -> None:
    tools = [tool("search", LONG)]
    payload = body(request(Message("system", LONG), Message("user", "Hi"), tools=tools))
    assert marks_in(payload) == ["tools[0]", "system[0]"]


def test_tools_and_system_together_reaching_the_minimum_mark_the_system() -> None:
    half = "x" * 2500
    payload = body(
        request(Message("system", half), Message("user", "Hi"), tools=[tool("search", half)])
    )
    assert marks_in(payload) == ["system[0]"]


def test_json_schema_tool_counts_as_a_tool_definition() -> None:
    schema = {"type": "object", "description": LONG}
    fmt = ResponseFormat("json_schema", JSONSchemaSpec("answer", schema))
    payload = body(request(Message("user", "Hi"), response_format=fmt))
    assert marks_in(payload) == ["tools[0]"]


def test_placement_keeps_the_rest_of_the_body() -> None:
    req = request(
        Message("system", LONG), Message("user", "Hi"), temperature=0.5, max_tokens=77, stop=["END"]
    )
    payload = body(req, min_chars=100)
    assert payload["temperature"] == 0.5 and payload["max_tokens"] == 77
    assert payload["stop_sequences"] == ["END"] and payload["model"] == "claude-x"
    assert payload["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]


# ---------------------------------------------------------------- the client's own marks
def test_client_marks_on_parts_are_forwarded_and_disable_automatic_ones() -> None:
    raw = {
        "model": "alias",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": LONG}]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "Doc",
                        "cache_control": {"type": "ephemeral", "ttl": "1h"},
                    }
                ],
            },
            {"role": "assistant", "content": "Ok"},
            {"role": "user", "content": "Question"},
        ],
    }
    req = request(
        Message("system", [TextPart(LONG)]),
        Message("user", [TextPart("Doc")]),
        Message("assistant", "Ok"),
        Message("user", "Question"),
    )
    payload = body(req, raw)
    assert marks_in(payload) == ["messages[0][0]"]  # no automatic mark on the long system
    assert payload["messages"][0]["content"][0]["cache_control"] == {
        "type": "ephemeral",
        "ttl": "1h",
    }


def test_client_marks_follow_merged_turns_and_tools() -> None:
    raw = {
        "model": "alias",
        "tools": [
            {"type": "function", "function": {"name": "a"}},
            {"type": "function", "function": {"name": "b"}, "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "system", "content": SHORT, "cache_control": {"type": "ephemeral"}},
            {"role": "user", "content": "one"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "two"},
                    {"type": "text", "text": "three", "cache_control": {"type": "ephemeral"}},
                ],
            },
            {"role": "user", "content": "four"},
        ],
    }
    req = request(
        Message("system", SHORT),
        Message("user", "one"),
        Message("user", [TextPart("two"), TextPart("three")]),
        Message("user", "four"),
        tools=[tool("a"), tool("b")],
    )
    payload = body(req, raw)
    # The three user messages merge into one turn; "three" is its third block.
    assert marks_in(payload) == ["tools[1]", "system[0]", "messages[0][2]"]
    assert payload["messages"][0]["content"][2]["text"] == "three"


def test_more_than_four_client_marks_keep_the_last_four() -> None:
    texts = [f"turn {i}" for i in range(6)]
    raw = {
        "model": "alias",
        "messages": [
            {
                "role": "user" if i % 2 == 0 else "assistant",
                "content": [{"type": "text", "text": t, "cache_control": {"type": "ephemeral"}}],
            }
            for i, t in enumerate(texts)
        ],
    }
    req = request(*[Message("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)])
    payload = body(req, raw)
    assert marks_in(payload) == [f"messages[{i}][0]" for i in range(2, 6)]
    assert len(marks_in(payload)) == MAX_BREAKPOINTS


def test_cache_control_in_text_is_not_a_mark() -> None:
    raw = {"model": "alias", "messages": [{"role": "user", "content": "what is cache_control?"}]}
    assert client_marks(json.dumps(raw).encode()) is None
    assert client_marks(b"not json cache_control") is None
    assert client_marks(None) is None


@given(
    st.lists(st.sampled_from(["user", "assistant", "system"]), min_size=1, max_size=12),
    st.sets(st.integers(0, 11)),
    st.booleans(),
)
def test_never_more_than_four_breakpoints(roles: list[str], marked: set[int], tools: bool) -> None:
    roles = [*roles, "user"]
    messages = [
        Message(role, LONG if role == "system" else f"m{i}")  # type: ignore[arg-type]
        for i, role in enumerate(roles)
    ]
    raw_messages = [
        {
            "role": role,
            "content": [
                {
                    "type": "text",
                    "text": m.content,
                    **({"cache_control": EPHEMERAL} if i in marked else {}),
                }
            ],
        }
        for i, (role, m) in enumerate(zip(roles, messages, strict=True))
    ]
    tool_list = [tool("a", LONG), tool("b")] if tools else None
    raw = {
        "model": "alias",
        "messages": raw_messages,
        "tools": [
            {"type": "function", "function": {"name": n}, "cache_control": EPHEMERAL}
            for n in ("a", "b")
        ]
        if tools
        else None,
    }
    payload = body(request(*messages, tools=tool_list), raw)
    found = marks_in(payload)
    assert len(found) <= MAX_BREAKPOINTS
    if marked & set(range(len(roles))) or tools:
        assert found  # the client's marks are honoured


# ---------------------------------------------------------------- OpenAI prompt_cache_key
def test_prompt_cache_key_is_added_when_the_client_has_none() -> None:
    raw = json.dumps({"model": "alias", "messages": [], "extra": 1}).encode()
    out = json.loads(rewrite_body(raw, "gpt-x", prompt_cache_key="tenant-acme"))
    assert out == {"model": "gpt-x", "messages": [], "extra": 1, "prompt_cache_key": "tenant-acme"}
    assert "prompt_cache_key" not in json.loads(rewrite_body(raw, "gpt-x"))


@pytest.mark.parametrize("own", ["client-key", ""])
def test_clients_own_prompt_cache_key_wins(own: str) -> None:
    raw = json.dumps({"model": "alias", "messages": [], "prompt_cache_key": own}).encode()
    out = json.loads(rewrite_body(raw, "gpt-x", prompt_cache_key="tenant-acme"))
    assert out["prompt_cache_key"] == own
