"""The Anthropic Messages dialect: a decoded body as the canonical ``ChatRequest``.

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

Bad input raises ``InvalidRequestError`` (``invalid_at``) whose ``param`` is the JSON path in
Anthropic's style (``messages.0.content.1.source``) and whose message starts with it.
"""

from __future__ import annotations

import msgspec

from core.errors import InvalidRequestError
from core.wire import (
    ChatRequest,
    ContentPart,
    FilePart,
    FunctionCall,
    FunctionDef,
    ImagePart,
    ImageURL,
    JSONSchemaSpec,
    Message,
    NamedToolChoice,
    ReasoningEffort,
    ResponseFormat,
    StreamOptions,
    TextPart,
    Tool,
    ToolCall,
    ToolChoice,
    ToolChoiceFunction,
)
from gateway.dialects.anthropic_messages_body import (
    Block,
    InMessage,
    InOutputConfig,
    InThinking,
    InTool,
    InToolChoice,
    MessagesBody,
    Source,
    SystemBlock,
)


def invalid_at(path: str, why: str) -> InvalidRequestError:
    """A 400 for the field at ``path`` (Anthropic's style: ``messages.0.content``)."""
    return InvalidRequestError(f"{path}: {why}", param=path)


def to_chat_request(body: MessagesBody) -> ChatRequest:
    """The canonical request for a decoded body.

    ``stop`` keeps every stop sequence although ``ChatRequest.stop`` declares at most 4
    (OpenAI's limit; Anthropic has none so low): constructing a Struct does not validate,
    and refusing a 5th here would refuse requests Anthropic targets serve."""
    messages = _system(body.system) + _conversation(body.messages)
    if not messages:
        raise invalid_at("messages", "at least one message with content is required")
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
            raise invalid_at(f"system.{k}.type", f"system blocks must be text, got '{block.type}'")
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
    raise invalid_at(f"{path}.type", _unsupported(block.type, "user"))


def _unsupported(kind: str, role: str) -> str:
    return (
        f"'{kind}' blocks are not supported in {role} messages by this gateway's Messages "
        "endpoint (it supports text, image, document, tool_use, tool_result and thinking)"
    )


def _text(block: Block, path: str) -> str:
    if block.text is None:
        raise invalid_at(f"{path}.text", "Field required")
    return block.text


def _image(block: Block, path: str) -> ImagePart:
    source = _source(block, path)
    if source.type == "base64" and source.media_type and source.data is not None:
        return ImagePart(ImageURL(f"data:{source.media_type};base64,{source.data}"))
    if source.type == "url" and source.url:
        return ImagePart(ImageURL(source.url))
    raise invalid_at(f"{path}.source", "images need a base64 source (media_type, data) or a url")


def _document(block: Block, path: str) -> ContentPart:
    source = _source(block, path)
    if source.type == "text" and source.data is not None:
        return TextPart(source.data)
    if source.type == "base64" and source.media_type and source.data is not None:
        data_url = f"data:{source.media_type};base64,{source.data}"
        return FilePart({"filename": block.title or "document.pdf", "file_data": data_url})
    raise invalid_at(f"{path}.source", "documents need a base64 or text source")


def _source(block: Block, path: str) -> Source:
    if block.source is None:
        raise invalid_at(f"{path}.source", "Field required")
    return block.source


def _tool_result(block: Block, path: str) -> tuple[str, list[ImagePart]]:
    """The tool message's text and the images that must ride in the next user message."""
    if not block.tool_use_id:
        raise invalid_at(f"{path}.tool_use_id", "Field required")
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
            raise invalid_at(
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
            raise invalid_at(f"{path}.type", _unsupported(block.type, "assistant"))
    if not texts and not calls:
        return []
    return [Message("assistant", _content(texts) if texts else None, tool_calls=calls or None)]


def _tool_call(block: Block, path: str) -> ToolCall:
    if not block.id:
        raise invalid_at(f"{path}.id", "Field required")
    if not block.name:
        raise invalid_at(f"{path}.name", "Field required")
    arguments = msgspec.json.encode(block.input if block.input is not None else {}).decode()
    return ToolCall(id=block.id, function=FunctionCall(block.name, arguments))


def _tools(tools: list[InTool] | None) -> list[Tool]:
    out: list[Tool] = []
    for k, tool in enumerate(tools or ()):
        if tool.type not in (None, "custom"):
            raise invalid_at(
                f"tools.{k}",
                f"'{tool.type}' ({tool.name}) is an Anthropic server or built-in tool; this "
                "gateway can route the request to any model, so it accepts only custom tools "
                "with an input_schema",
            )
        if tool.input_schema is None:
            raise invalid_at(f"tools.{k}.input_schema", "Field required")
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
        raise invalid_at("tool_choice.name", "Field required when tool_choice.type is 'tool'")
    if choice.name not in names:
        raise invalid_at("tool_choice.name", f"'{choice.name}' is not among the tools")
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
        raise invalid_at("thinking.budget_tokens", "Field required when thinking is enabled")
    if budget < 2048:
        return "low"
    return "medium" if budget < 8192 else "high"


def _response_format(output: InOutputConfig | None) -> ResponseFormat | None:
    if output is None or output.format is None:
        return None
    fmt = output.format
    if fmt.type != "json_schema":
        raise invalid_at("output_config.format.type", f"expected 'json_schema', got '{fmt.type}'")
    if fmt.schema is None:
        raise invalid_at("output_config.format.schema", "Field required")
    return ResponseFormat("json_schema", JSONSchemaSpec(name="output", schema=fmt.schema))
