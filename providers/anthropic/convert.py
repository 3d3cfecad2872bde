"""Pure conversions between OpenAI chat requests/responses and Anthropic's Messages API.

Request rules (what the client sends -> what Anthropic gets):

- ``system``/``developer`` messages, wherever they appear, go to top-level ``system`` in
  order: one text -> a string, several -> a list of text blocks.
- ``tool`` messages become ``tool_result`` blocks in a user turn; consecutive turns of the
  same role (user and tool results both count as user) are merged into one message.
- assistant ``tool_calls`` -> ``tool_use`` blocks whose ``input`` is the parsed arguments.
- ``image_url``: data URLs -> base64 image source; http(s) URLs -> url image source.
- ``max_tokens`` is required by Anthropic: the client's limit (``max_completion_tokens`` wins)
  or the configured default. ``stop`` -> ``stop_sequences``, ``user`` -> ``metadata.user_id``.
- ``response_format`` json_schema -> a synthetic tool named after the schema, forced with
  ``tool_choice``; its ``tool_use`` comes back to the client as plain JSON text. json_object ->
  a system instruction to answer with a JSON object only.
- Not expressible, so rejected with ``InvalidRequestError``: ``n`` > 1, temperature > 1
  (Anthropic's range is 0..1), json_schema together with client tools, audio/file parts.
  ``seed``, ``presence_penalty`` and ``frequency_penalty`` have no Anthropic equivalent and are
  dropped, as Anthropic's own OpenAI-compatible endpoint does.
- ``reasoning_effort`` -> ``thinking`` with a budget (``providers.anthropic.thinking``, which
  also adjusts ``max_tokens`` and the sampling knobs Anthropic forbids with thinking).
- Prompt-cache breakpoints (``cache_control``) are added to the encoded body by
  ``providers.anthropic.cache_control``; ``build_located`` tells it where each client
  message's blocks landed.

Response rules: ``text`` blocks -> ``content``; ``thinking`` blocks -> ``reasoning_content``
(several are joined by a blank line); ``tool_use`` -> ``tool_calls``. ``redacted_thinking``
(encrypted, no text) and thinking signatures are not text a client can read and the
canonical form has no place to carry them back, so they are dropped. Usage: Anthropic counts
thinking in ``output_tokens`` and reports no separate figure, so ``reasoning_tokens`` stays
unset rather than estimated.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from core.errors import InvalidRequestError, UpstreamMalformedError
from core.wire import (
    AssistantMessage,
    ChatRequest,
    ChatResponse,
    Choice,
    ContentPart,
    FinishReason,
    FunctionCall,
    ImagePart,
    Message,
    TextPart,
    ToolCall,
    Usage,
    make_usage,
)
from providers.anthropic import wire
from providers.anthropic.thinking import apply_thinking

JSON_OBJECT_INSTRUCTION = (
    "Respond with a single valid JSON object and nothing else: no prose, no code fences."
)
EMPTY_SCHEMA: dict[str, object] = {"type": "object", "properties": {}}

Role = Literal["user", "assistant"]
THINKING_SEPARATOR = "\n\n"  # between thinking blocks (interleaved thinking has several)

_FINISH: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


# ---------------------------------------------------------------- request
def build_request(
    req: ChatRequest, model: str, default_max_tokens: int, *, stream: bool
) -> wire.MessagesRequest:
    """The Anthropic body for ``req`` sent to ``model``; raises ``InvalidRequestError`` for
    what Anthropic cannot express."""
    return build_located(req, model, default_max_tokens, stream=stream)[0]


def build_located(
    req: ChatRequest, model: str, default_max_tokens: int, *, stream: bool
) -> tuple[wire.MessagesRequest, dict[int, BlockLocation]]:
    """``build_request`` plus where each client message's last block landed (see
    ``BlockLocation``), so cache breakpoints the client put on a message can follow it."""
    _check_expressible(req)
    system, turns, ends = convert_located(req.messages)
    if req.response_format is not None and req.response_format.type == "json_object":
        system.append(JSON_OBJECT_INSTRUCTION)
    tools, tool_choice = convert_tools(req)
    body = wire.MessagesRequest(
        model=model,
        messages=turns,
        max_tokens=req.output_limit() or default_max_tokens,
        system=_system_field(system),
        stop_sequences=req.stop_list() or None,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        metadata=wire.Metadata(user_id=req.user) if req.user else None,
        tools=tools,
        tool_choice=tool_choice,
        stream=stream,
    )
    body = apply_thinking(body, req.reasoning_effort, req.output_limit(), default_max_tokens)
    return body, ends


def _check_expressible(req: ChatRequest) -> None:
    if req.n is not None and req.n > 1:
        raise InvalidRequestError(
            "anthropic returns one choice per request: n must be 1", param="n"
        )
    if req.temperature is not None and req.temperature > 1:
        raise InvalidRequestError(
            f"anthropic accepts temperature between 0 and 1, got {req.temperature}",
            param="temperature",
        )
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise InvalidRequestError(
                "response_format json_schema needs a json_schema object", param="response_format"
            )
        if req.tools:
            raise InvalidRequestError(
                "anthropic implements json_schema as a forced tool call, so it cannot be "
                "combined with tools",
                param="response_format",
            )


def _system_field(texts: list[str]) -> str | list[wire.TextBlock] | None:
    if not texts:
        return None
    if len(texts) == 1:
        return texts[0]
    return [wire.TextBlock(text) for text in texts]


def convert_messages(messages: list[Message]) -> tuple[list[str], list[wire.RequestMessage]]:
    """(system texts in order, alternating user/assistant turns)."""
    system, turns, _ = convert_located(messages)
    return system, turns


BlockLocation = tuple[int, int]
"""Where a client message's last block went: ``(-1, i)`` is the i-th system text,
``(t, b)`` is block ``b`` of turn ``t``."""


def convert_located(
    messages: list[Message],
) -> tuple[list[str], list[wire.RequestMessage], dict[int, BlockLocation]]:
    """``convert_messages`` plus, per message position that produced a block, the location
    of its last block (messages that converted to nothing are absent)."""
    system: list[str] = []
    turns: list[wire.RequestMessage] = []
    ends: dict[int, BlockLocation] = {}
    for position, msg in enumerate(messages):
        if msg.role in ("system", "developer"):
            texts = _system_texts(msg, position)
            system.extend(texts)
            if texts:
                ends[position] = (-1, len(system) - 1)
            continue
        role, blocks = _turn(msg, position)
        if not blocks:
            continue  # Anthropic rejects empty turns; an empty message says nothing anyway
        if turns and turns[-1].role == role:
            turns[-1].content.extend(blocks)
        else:
            turns.append(wire.RequestMessage(role=role, content=blocks))
        ends[position] = (len(turns) - 1, len(turns[-1].content) - 1)
    if not turns:
        raise InvalidRequestError(
            "anthropic needs at least one non-empty user or assistant message", param="messages"
        )
    return system, turns, ends


def _system_texts(msg: Message, position: int) -> list[str]:
    if msg.content is None or isinstance(msg.content, str):
        return [msg.content] if msg.content else []
    texts = []
    for part in msg.content:
        if not isinstance(part, TextPart):
            raise _bad_message(position, f"{msg.role} messages may contain only text")
        if part.text:
            texts.append(part.text)
    return texts


def _turn(msg: Message, position: int) -> tuple[Role, list[wire.RequestBlock]]:
    if msg.role == "assistant":
        return "assistant", _assistant_blocks(msg, position)
    if msg.role == "tool":
        if not msg.tool_call_id:
            raise _bad_message(position, "tool messages need tool_call_id")
        content = _result_content(msg.content, position)
        return "user", [wire.ToolResultBlock(tool_use_id=msg.tool_call_id, content=content)]
    return "user", list(_user_blocks(msg.content, position))


def _user_blocks(
    content: str | list[ContentPart] | None, position: int
) -> list[wire.TextBlock | wire.ImageBlock]:
    if content is None or isinstance(content, str):
        return [wire.TextBlock(content)] if content else []
    blocks: list[wire.TextBlock | wire.ImageBlock] = []
    for part in content:
        if isinstance(part, TextPart):
            if part.text:
                blocks.append(wire.TextBlock(part.text))
        elif isinstance(part, ImagePart):
            blocks.append(image_block(part.image_url.url, position))
        else:
            raise _bad_message(position, f"anthropic does not accept {type(part).__name__}s")
    return blocks


def _result_content(
    content: str | list[ContentPart] | None, position: int
) -> str | list[wire.TextBlock | wire.ImageBlock] | None:
    if content is None or isinstance(content, str):
        return content or None
    return _user_blocks(content, position) or None


def image_block(url: str, position: int) -> wire.ImageBlock:
    """An image block for a ``data:<type>;base64,<data>`` or http(s) URL."""
    if url.startswith(("http://", "https://")):
        return wire.ImageBlock(wire.URLSource(url))
    if url.startswith("data:"):
        header, comma, data = url[len("data:") :].partition(",")
        params = header.split(";")
        if comma and params[0] and params[-1] == "base64":
            return wire.ImageBlock(wire.Base64Source(media_type=params[0], data=data))
    raise _bad_message(position, "image_url must be an http(s) URL or a base64 data URL")


def _assistant_blocks(msg: Message, position: int) -> list[wire.RequestBlock]:
    blocks: list[wire.RequestBlock] = []
    if isinstance(msg.content, str):
        if msg.content:
            blocks.append(wire.TextBlock(msg.content))
    elif msg.content is not None:
        for part in msg.content:
            if not isinstance(part, TextPart):
                raise _bad_message(position, "assistant messages may contain only text")
            if part.text:
                blocks.append(wire.TextBlock(part.text))
    for call in msg.tool_calls or []:
        arguments = parse_arguments(call.function.arguments, position)
        blocks.append(wire.ToolUseBlock(id=call.id, name=call.function.name, input=arguments))
    return blocks


def parse_arguments(arguments: str, position: int) -> wire.JSONObject:
    """A tool call's JSON arguments as an object (empty arguments mean no arguments)."""
    if not arguments.strip():
        return {}
    try:
        value = msgspec.json.decode(arguments)
    except msgspec.DecodeError:
        raise _bad_message(position, "tool call arguments are not valid JSON") from None
    if not isinstance(value, dict):
        raise _bad_message(position, "tool call arguments must be a JSON object")
    return value


def _bad_message(position: int, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"messages[{position}]: {why}", param="messages")


def convert_tools(
    req: ChatRequest,
) -> tuple[list[wire.ToolParam] | None, wire.ToolChoiceParam | None]:
    """Anthropic ``tools`` and ``tool_choice`` (json_schema mode adds its forced tool)."""
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
        spec = fmt.json_schema
        tool = wire.ToolParam(
            name=spec.name,
            input_schema=spec.schema or EMPTY_SCHEMA,
            description=spec.description or "Give the answer as this tool's input.",
        )
        choice = wire.ToolChoiceParam("tool", name=spec.name, disable_parallel_tool_use=True)
        return [tool], choice
    if not req.tools:
        return None, None  # tool_choice without tools means nothing to Anthropic
    tools = [
        wire.ToolParam(
            name=t.function.name,
            input_schema=t.function.parameters or EMPTY_SCHEMA,
            description=t.function.description,
        )
        for t in req.tools
    ]
    return tools, _tool_choice(req, {t.name for t in tools})


def _tool_choice(req: ChatRequest, names: set[str]) -> wire.ToolChoiceParam | None:
    choice = req.tool_choice
    disable = True if req.parallel_tool_calls is False else None
    if choice == "none":
        return wire.ToolChoiceParam("none")  # "none" takes no parallel flag
    if choice is None or choice == "auto":
        return wire.ToolChoiceParam("auto", disable_parallel_tool_use=disable) if disable else None
    if choice == "required":
        return wire.ToolChoiceParam("any", disable_parallel_tool_use=disable)
    if choice.function.name not in names:
        raise InvalidRequestError(
            f"tool_choice names '{choice.function.name}', which is not among the tools",
            param="tool_choice",
        )
    return wire.ToolChoiceParam(
        "tool", name=choice.function.name, disable_parallel_tool_use=disable
    )


def json_tool_name(req: ChatRequest) -> str | None:
    """The synthetic tool's name when ``req`` asks for json_schema output, else None."""
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
        return fmt.json_schema.name
    return None


# ---------------------------------------------------------------- response
def finish_reason(stop_reason: str | None, json_tool: str | None) -> FinishReason:
    """OpenAI's finish_reason for Anthropic's ``stop_reason``; the forced json_schema tool
    call is the answer itself, so it finishes with ``stop``."""
    if stop_reason == "tool_use" and json_tool is not None:
        return "stop"
    return _FINISH.get(stop_reason or "", "stop")


def to_usage(usage: wire.ResponseUsage) -> Usage:
    """OpenAI usage: prompt tokens include the cached and cache-written ones, which
    Anthropic reports apart from ``input_tokens``."""
    read = usage.cache_read_input_tokens or 0
    written = usage.cache_creation_input_tokens
    prompt = usage.input_tokens + read + (written or 0)
    return make_usage(prompt, usage.output_tokens, cached=read, created=written)


def to_chat_response(
    msg: wire.MessagesResponse, *, created: int, json_tool: str | None, provider: str
) -> ChatResponse:
    """The OpenAI response for an Anthropic message (``created`` is supplied by the caller)."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for block in msg.content:
        if block.type == "text":
            texts.append(block.text or "")
        elif block.type == "thinking":
            thoughts.append(block.thinking or "")
        elif block.type == "tool_use":
            if block.id is None or block.name is None:
                raise UpstreamMalformedError(
                    f"upstream {provider} sent a tool_use block without id or name",
                    provider=provider,
                )
            arguments = wire.encoder.encode(block.input or {}).decode()
            if block.name == json_tool:
                texts.append(arguments)
            else:
                calls.append(ToolCall(id=block.id, function=FunctionCall(block.name, arguments)))
    message = AssistantMessage(
        content="".join(texts) if texts or not calls else None,
        tool_calls=calls or None,
        reasoning_content=THINKING_SEPARATOR.join(thoughts) if thoughts else None,
    )
    choice = Choice(0, message, finish_reason(msg.stop_reason, json_tool))
    return ChatResponse(
        id=msg.id, created=created, model=msg.model, choices=[choice], usage=to_usage(msg.usage)
    )
