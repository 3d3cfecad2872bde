"""The Anthropic Messages dialect (``POST /v1/messages``): request side.

``decode_request`` parses what Anthropic clients send (the ``anthropic`` SDK, Claude Code) and
translates it to the canonical ``ChatRequest`` (OpenAI Chat Completions shape), keeping the raw
body for targets that speak Anthropic themselves. The response side (``encode_response``,
``StreamEncoder``, ``error_body``, ``error_status``) lives in ``anthropic_messages_encode`` and
is re-exported here, so the route imports one module. Pure: no I/O, no clock, no ``json``.

Translation, Anthropic -> canonical:

- ``system`` (a string or text blocks) -> one leading system message; several blocks stay
  separate text parts (no separator is invented).
- ``tool_use`` blocks -> the assistant message's ``tool_calls``, ``input`` encoded as JSON text.
- ``tool_result`` blocks -> ``role: tool`` messages (string content; text blocks joined with
  newlines; ``is_error`` prefixes ``"Error: "``, as OpenAI tool messages have no error flag).
  A user turn mixing tool results and other blocks becomes the tool messages, then one user
  message with the rest (OpenAI wants tool messages right after the assistant's calls).
  Images inside a tool result cannot ride in an OpenAI tool message: they go to that user
  message.
- images -> ``image_url`` parts (base64 as ``data:`` URLs); PDF documents (base64) -> ``file``
  parts; plain-text documents -> text parts.
- ``thinking`` / ``redacted_thinking`` blocks of earlier turns are dropped: their signatures
  mean something only to Anthropic (whose targets get the raw body), and OpenAI-shaped
  upstreams take no reasoning as input.
- ``cache_control`` anywhere is left in the raw body only: the canonical form has no place for
  it, and the Anthropic adapter places its own breakpoints.
- ``tools`` -> function tools; a server or Anthropic-defined tool (``type`` other than
  ``custom``) is a 400, since no translated target can run it.
- ``tool_choice``: auto -> "auto", any -> "required", tool -> named, none -> "none";
  ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``. Without tools it is dropped.
- ``thinking``: disabled -> ``reasoning_effort: "none"``; enabled -> by ``budget_tokens``
  (< 2048 low, < 8192 medium, else high); adaptive -> the model's default (None), unless
  ``output_config.effort`` says (low/medium/high as is; xhigh/max -> high).
- ``output_config.format`` (json_schema) -> ``response_format`` json_schema named "output".
- ``stop_sequences`` -> ``stop`` (all of them: see ``to_chat_request``), ``max_tokens`` ->
  ``max_tokens``, ``metadata.user_id`` -> ``user``; temperature, top_p, top_k as they are.
- ``stream: true`` also sets ``stream_options.include_usage``: the final ``message_delta``
  needs the usage.

Bad input raises ``InvalidRequestError`` whose ``param`` is the JSON path in Anthropic's style
(``messages.0.content.1.source``) and whose message starts with it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from core.errors import InvalidRequestError
from core.wire import (
    ChatRequest,
    ContentPart,
    Count,
    FilePart,
    FunctionCall,
    FunctionDef,
    ImagePart,
    ImageURL,
    JSONSchemaSpec,
    Message,
    ModelName,
    NamedToolChoice,
    ReasoningEffort,
    ResponseFormat,
    StreamOptions,
    TextPart,
    Tool,
    ToolCall,
    ToolChoice,
    ToolChoiceFunction,
    UnitFloat,
)
from gateway.dialects.anthropic_messages_encode import (
    StreamEncoder,
    encode_response,
    error_body,
    error_status,
    message_id,
)

__all__ = [
    "MessagesIngress",
    "StreamEncoder",
    "decode_request",
    "encode_response",
    "error_body",
    "error_status",
    "message_id",
    "reasoning_effort",
    "to_chat_request",
]

JSONObject = dict[str, Any]


# ---------------------------------------------------------------- what clients send
class Source(Struct):
    """An image or document source: ``base64`` (media_type, data), ``url``, ``text``..."""

    type: str
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class Block(Struct):
    """Any content block. One lenient shape for every ``type``, checked by the translation,
    so an unsupported or malformed block is a 400 naming it, not a generic schema error.
    Fields of kinds the translation drops (``thinking``, ``signature``, ``cache_control``,
    ``citations``) are not declared: msgspec skips them without building anything."""

    type: str
    text: str | None = None
    source: Source | None = None
    id: str | None = None
    name: str | None = None
    input: JSONObject | None = None
    tool_use_id: str | None = None
    content: str | list[Block] | None = None
    is_error: bool | None = None
    title: str | None = None


class InMessage(Struct):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class SystemBlock(Struct):
    type: str
    text: str


class InTool(Struct):
    name: str
    type: str | None = None
    description: str | None = None
    input_schema: JSONObject | None = None


class InToolChoice(Struct):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class InThinking(Struct):
    type: str  # enabled | disabled | adaptive | between_tools; newer kinds mean "model default"
    budget_tokens: Annotated[int, Meta(ge=1)] | None = None


class InMetadata(Struct):
    user_id: str | None = None


class InOutputFormat(Struct):
    type: str
    schema: JSONObject | None = None


class InOutputConfig(Struct):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: InOutputFormat | None = None


class MessagesBody(Struct):
    """The fields of ``POST /v1/messages`` the translation uses; others are ignored (they
    stay in the raw body). Bounds follow Anthropic's (temperature 0..1)."""

    model: ModelName
    max_tokens: Count
    messages: list[InMessage]
    system: str | list[SystemBlock] | None = None
    tools: list[InTool] | None = None
    tool_choice: InToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_p: UnitFloat | None = None
    top_k: Count | None = None
    stream: bool = False
    metadata: InMetadata | None = None
    thinking: InThinking | None = None
    output_config: InOutputConfig | None = None
    service_tier: str | None = None


_DECODER = msgspec.json.Decoder(MessagesBody)


class MessagesIngress(Struct):
    """One decoded Messages request: the canonical request to route and execute, the raw
    body (passed through to Anthropic targets), and what the answer's encoding needs."""

    request: ChatRequest
    raw: bytes
    stream: bool
    wants_thinking: bool
    """The client enabled thinking (enabled or adaptive): only then may the answer carry
    thinking blocks (a client that did not ask often reads ``content[0].text``)."""
    service_tier: str | None = None


# ---------------------------------------------------------------- decoding
def decode_request(raw: bytes) -> MessagesIngress:
    """Parse and translate a Messages request body; ``InvalidRequestError`` (400) with
    ``param`` for anything malformed or not translatable. The caller bounds the body's size
    and JSON depth first, as for every route."""
    body = _decode(raw)
    thinking = body.thinking
    return MessagesIngress(
        request=to_chat_request(body),
        raw=raw,
        stream=body.stream,
        wants_thinking=thinking is not None and thinking.type != "disabled",
        service_tier=body.service_tier,
    )


def _decode(raw: bytes) -> MessagesBody:
    try:
        return _DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise _schema_error(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequestError(f"The request body is not valid JSON: {exc}") from None
    except RecursionError:  # the route's depth check makes this unreachable; never a 500
        raise InvalidRequestError("The request body is nested too deeply.") from None


_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")
_INDEX = re.compile(r"\[(\d+)\]")


def _schema_error(text: str) -> InvalidRequestError:
    """msgspec's ``Expected `str`, got `int` - at `$.messages[0].role``` as Anthropic puts
    it: ``messages.0.role: Expected `str`, got `int```, with ``param`` set to the path."""
    match = _AT.search(text)
    message = text[: match.start()] if match else text
    path = _INDEX.sub(r".\1", match.group("path")).lstrip(".") if match else ""
    missing = _MISSING.search(message)
    if missing:
        path = f"{path}.{missing.group('field')}" if path else missing.group("field")
        message = "Field required"
    return _bad(path, message) if path else InvalidRequestError(message)


def _bad(path: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"{path}: {why}", param=path)


# ---------------------------------------------------------------- the canonical request
def to_chat_request(body: MessagesBody) -> ChatRequest:
    """The canonical request for a decoded body.

    ``stop`` keeps every stop sequence although ``ChatRequest.stop`` declares at most 4
    (OpenAI's limit; Anthropic has none so low): constructing a Struct does not validate,
    and refusing a 5th here would refuse requests Anthropic targets serve."""
    messages = _system(body.system) + _conversation(body.messages)
    if not messages:
        raise _bad("messages", "at least one message with content is required")
    tools = _tools(body.tools)
    choice, parallel = _tool_choice(body.tool_choice, tools)
    return ChatRequest(
        model=body.model,
        messages=messages,
        stream=body.stream,
        stream_options=StreamOptions(include_usage=True) if body.stream else None,
        tools=tools or None,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        response_format=_response_format(body.output_config),
        stop=list(body.stop_sequences) if body.stop_sequences else None,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        user=body.metadata.user_id if body.metadata else None,
        reasoning_effort=reasoning_effort(body.thinking, body.output_config),
    )


def _system(system: str | list[SystemBlock] | None) -> list[Message]:
    if system is None or isinstance(system, str):
        return [Message("system", system)] if system else []
    parts: list[TextPart] = []
    for k, block in enumerate(system):
        if block.type != "text":
            raise _bad(f"system.{k}.type", f"system blocks must be text, got '{block.type}'")
        if block.text:
            parts.append(TextPart(block.text))
    if not parts:
        return []
    return [Message("system", parts[0].text if len(parts) == 1 else list(parts))]


def _conversation(messages: list[InMessage]) -> list[Message]:
    out: list[Message] = []
    for i, msg in enumerate(messages):
        if msg.role == "user":
            out.extend(_user_turn(msg.content, i))
        else:
            out.extend(_assistant_turn(msg.content, i))
    return out


# Blocks of earlier turns that carry nothing a translated target can use (see the module doc).
_DROPPED = frozenset({"thinking", "redacted_thinking"})


def _user_turn(content: str | list[Block], i: int) -> list[Message]:
    """Tool messages for the turn's tool results, then one user message with the rest."""
    if isinstance(content, str):
        return [Message("user", content)]
    tools: list[Message] = []
    parts: list[ContentPart] = []
    for j, block in enumerate(content):
        path = f"messages.{i}.content.{j}"
        if block.type == "tool_result":
            text, images = _tool_result(block, path)
            tools.append(Message("tool", text, tool_call_id=block.tool_use_id))
            parts.extend(images)
        elif block.type not in _DROPPED:
            parts.append(_user_part(block, path))
    if parts:
        tools.append(Message("user", _content(parts)))
    return tools


def _content(parts: list[ContentPart]) -> str | list[ContentPart]:
    """One text part is sent as a plain string, which every OpenAI-shaped server accepts."""
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        return parts[0].text
    return parts


def _user_part(block: Block, path: str) -> ContentPart:
    if block.type == "text":
        return TextPart(_text(block, path))
    if block.type == "image":
        return _image(block, path)
    if block.type == "document":
        return _document(block, path)
    raise _bad(f"{path}.type", _unsupported(block.type, "user"))


def _unsupported(kind: str, role: str) -> str:
    return (
        f"'{kind}' blocks are not supported in {role} messages by this gateway's Messages "
        "endpoint (it supports text, image, document, tool_use, tool_result and thinking)"
    )


def _text(block: Block, path: str) -> str:
    if block.text is None:
        raise _bad(f"{path}.text", "Field required")
    return block.text


def _image(block: Block, path: str) -> ImagePart:
    source = _source(block, path)
    if source.type == "base64" and source.media_type and source.data is not None:
        return ImagePart(ImageURL(f"data:{source.media_type};base64,{source.data}"))
    if source.type == "url" and source.url:
        return ImagePart(ImageURL(source.url))
    raise _bad(f"{path}.source", "images need a base64 source (media_type, data) or a url")


def _document(block: Block, path: str) -> ContentPart:
    source = _source(block, path)
    if source.type == "text" and source.data is not None:
        return TextPart(source.data)
    if source.type == "base64" and source.media_type and source.data is not None:
        data_url = f"data:{source.media_type};base64,{source.data}"
        return FilePart({"filename": block.title or "document.pdf", "file_data": data_url})
    raise _bad(f"{path}.source", "documents need a base64 or text source")


def _source(block: Block, path: str) -> Source:
    if block.source is None:
        raise _bad(f"{path}.source", "Field required")
    return block.source


def _tool_result(block: Block, path: str) -> tuple[str, list[ImagePart]]:
    """The tool message's text and the images that must ride in the next user message."""
    if not block.tool_use_id:
        raise _bad(f"{path}.tool_use_id", "Field required")
    texts: list[str] = []
    images: list[ImagePart] = []
    if isinstance(block.content, str):
        texts.append(block.content)
    for k, inner in enumerate(block.content if isinstance(block.content, list) else ()):
        part = _user_part(inner, f"{path}.content.{k}")
        if isinstance(part, ImagePart):
            images.append(part)
        elif isinstance(part, TextPart):
            texts.append(part.text)
        else:
            raise _bad(
                f"{path}.content.{k}", "tool results may hold text, images and text documents"
            )
    text = "\n".join(texts)
    return ("Error: " + text if block.is_error else text), images


def _assistant_turn(content: str | list[Block], i: int) -> list[Message]:
    """One assistant message (text, tool calls), or none when nothing translatable is left
    (a turn of only thinking): OpenAI refuses an assistant message without either."""
    if isinstance(content, str):
        return [Message("assistant", content)] if content else []
    texts: list[ContentPart] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(content):
        path = f"messages.{i}.content.{j}"
        if block.type == "text":
            texts.append(TextPart(_text(block, path)))
        elif block.type == "tool_use":
            calls.append(_tool_call(block, path))
        elif block.type not in _DROPPED:
            raise _bad(f"{path}.type", _unsupported(block.type, "assistant"))
    if not texts and not calls:
        return []
    return [Message("assistant", _content(texts) if texts else None, tool_calls=calls or None)]


def _tool_call(block: Block, path: str) -> ToolCall:
    if not block.id:
        raise _bad(f"{path}.id", "Field required")
    if not block.name:
        raise _bad(f"{path}.name", "Field required")
    arguments = msgspec.json.encode(block.input if block.input is not None else {}).decode()
    return ToolCall(id=block.id, function=FunctionCall(block.name, arguments))


def _tools(tools: list[InTool] | None) -> list[Tool]:
    out: list[Tool] = []
    for k, tool in enumerate(tools or ()):
        if tool.type not in (None, "custom"):
            raise _bad(
                f"tools.{k}",
                f"'{tool.type}' ({tool.name}) is an Anthropic server or built-in tool; this "
                "gateway can route the request to any model, so it accepts only custom tools "
                "with an input_schema",
            )
        if tool.input_schema is None:
            raise _bad(f"tools.{k}.input_schema", "Field required")
        function = FunctionDef(tool.name, tool.description, tool.input_schema)
        out.append(Tool(function))
    return out


def _tool_choice(
    choice: InToolChoice | None, tools: list[Tool]
) -> tuple[ToolChoice | None, bool | None]:
    """(``tool_choice``, ``parallel_tool_calls``). Without tools there is nothing to choose,
    and OpenAI refuses a ``tool_choice`` without ``tools``: both are dropped."""
    if choice is None or not tools:
        return None, None
    parallel = False if choice.disable_parallel_tool_use else None
    if choice.type == "none":
        return "none", None
    if choice.type == "auto":
        return "auto", parallel
    if choice.type == "any":
        return "required", parallel
    names = {tool.function.name for tool in tools}
    if choice.name is None:
        raise _bad("tool_choice.name", "Field required when tool_choice.type is 'tool'")
    if choice.name not in names:
        raise _bad("tool_choice.name", f"'{choice.name}' is not among the tools")
    return NamedToolChoice(ToolChoiceFunction(choice.name)), parallel


_EFFORT: dict[str, ReasoningEffort] = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


def reasoning_effort(
    thinking: InThinking | None, output: InOutputConfig | None = None
) -> ReasoningEffort | None:
    """The canonical ``reasoning_effort``: "none" when thinking is disabled; else
    ``output_config.effort`` when given; else from an enabled thinking budget (< 2048 low,
    < 8192 medium, else high); None (the model's default) for adaptive or no thinking."""
    if thinking is not None and thinking.type == "disabled":
        return "none"
    if output is not None and output.effort is not None:
        return _EFFORT[output.effort]
    if thinking is None or thinking.type != "enabled":
        return None
    budget = thinking.budget_tokens
    if budget is None:
        raise _bad("thinking.budget_tokens", "Field required when thinking is enabled")
    if budget < 2048:
        return "low"
    return "medium" if budget < 8192 else "high"


def _response_format(output: InOutputConfig | None) -> ResponseFormat | None:
    if output is None or output.format is None:
        return None
    fmt = output.format
    if fmt.type != "json_schema":
        raise _bad("output_config.format.type", f"expected 'json_schema', got '{fmt.type}'")
    if fmt.schema is None:
        raise _bad("output_config.format.schema", "Field required")
    return ResponseFormat("json_schema", JSONSchemaSpec(name="output", schema=fmt.schema))
