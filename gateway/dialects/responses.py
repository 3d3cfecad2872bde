"""OpenAI's Responses API (``POST /v1/responses``) as a codec over the canonical chat form.

Pure and synchronous: bytes in, canonical ``ChatRequest`` out; canonical ``ChatResponse`` in,
bytes out. The streaming half is ``responses_stream.StreamEncoder`` (re-exported here).

Request mapping (Responses -> Chat Completions):

- ``instructions`` -> a ``system`` message first; ``input`` as a string -> one user message.
- ``input`` items: messages (``role`` user/assistant/system/developer; ``type: message`` or no
  ``type``) keep their role; ``input_text``/``output_text`` -> text, ``input_image`` with
  ``image_url`` -> ``image_url`` part, ``input_file`` with ``file_data`` -> ``file`` part.
  Assistant text is joined into one string. ``function_call`` items join the assistant
  message before them as ``tool_calls`` (a new assistant message when there is none);
  ``function_call_output`` -> a ``tool`` message. ``reasoning`` items are dropped (see
  ``_item``). Refused with a 400 naming the item: ``item_reference``, ``file_id`` images and
  files, other item kinds (they belong to OpenAI-hosted tools).
- ``tools``: function tools (name/description/parameters/strict at the top level) ->
  ``{type: function, function: {...}}``; built-in tools are refused. ``tool_choice`` auto/
  none/required/``{type: function, name}``. ``text.format`` -> ``response_format``.
  ``reasoning.effort`` -> ``reasoning_effort`` (``xhigh``/``max`` -> ``high``, the canonical
  ceiling). ``max_output_tokens`` -> ``max_completion_tokens``; ``user`` (else
  ``safety_identifier``) -> ``user``; ``temperature``, ``top_p``, ``parallel_tool_calls``,
  ``stream`` as they are.
- Stored-state features the canonical form cannot carry are refused: ``conversation``,
  ``prompt`` (a stored prompt template), ``background: true``. ``previous_response_id`` and
  ``store`` are left to the route (``ResponsesIngress``). Unknown fields are ignored (they
  stay in ``ResponsesIngress.raw`` for a passthrough).

Response mapping: see ``encode_response``. Error ``param`` values are JSON paths in OpenAI's
own notation, e.g. ``input[2].content[0].file_id``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec
from msgspec import Raw, Struct

from core.errors import GatewayError, InvalidRequestError
from core.wire import (
    AssistantMessage,
    ChatRequest,
    ChatResponse,
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
    Temperature,
    TextPart,
    Tool,
    ToolCall,
    ToolChoice,
    ToolChoiceFunction,
    UnitFloat,
)
from gateway.dialects.responses_stream import StreamEncoder
from gateway.dialects.responses_wire import (
    FunctionCallItem,
    FunctionToolSpec,
    ItemIds,
    MessageItem,
    OutputItem,
    OutputRefusal,
    OutputText,
    ReasoningConfig,
    ReasoningItem,
    SummaryText,
    TextConfig,
    ToolChoiceSpec,
    response_object,
    response_status,
    response_usage,
)
from gateway.http import errors as http_errors

__all__ = [
    "ResponsesIngress",
    "StreamEncoder",
    "decode_request",
    "encode_response",
    "error_body",
]


# ---------------------------------------------------------------- request shapes
class _InputText(Struct, tag="input_text", tag_field="type"):
    text: str


class _OutputTextIn(Struct, tag="output_text", tag_field="type"):
    text: str  # annotations and logprobs of an earlier turn say nothing to the model


class _RefusalIn(Struct, tag="refusal", tag_field="type"):
    refusal: str


class _InputImage(Struct, tag="input_image", tag_field="type"):
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class _InputFile(Struct, tag="input_file", tag_field="type"):
    file_data: str | None = None
    file_id: str | None = None
    file_url: str | None = None
    filename: str | None = None


_Part = _InputText | _OutputTextIn | _RefusalIn | _InputImage | _InputFile


class _Peek(Struct):
    """Just enough of an input item to choose its shape (a message may omit ``type``)."""

    type: str | None = None


class _MessageIn(Struct):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[_Part]


class _FunctionCallIn(Struct):
    call_id: str
    name: str
    arguments: str


class _FunctionCallOutputIn(Struct):
    call_id: str
    output: str | list[_Part]


class _Request(Struct):
    """The request fields this codec reads; everything else is ignored here."""

    model: ModelName
    input: str | list[Raw]
    instructions: str | None = None
    tools: list[FunctionToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceSpec | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: Count | None = None
    temperature: Temperature | None = None
    top_p: UnitFloat | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    conversation: Raw | None = None
    prompt: Raw | None = None


_REQUEST = msgspec.json.Decoder(_Request)
_PEEK = msgspec.json.Decoder(_Peek)
_ITEM_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    "message": msgspec.json.Decoder(_MessageIn),
    "function_call": msgspec.json.Decoder(_FunctionCallIn),
    "function_call_output": msgspec.json.Decoder(_FunctionCallOutputIn),
}
# OpenAI's efforts above the canonical ceiling; the strongest canonical effort is the
# closest thing every target understands.
_EFFORTS: dict[str, ReasoningEffort] = {
    "none": "none",
    "minimal": "minimal",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


class ResponsesIngress(Struct, kw_only=True):
    """One decoded Responses request: the canonical request plus what the route and the
    response object need. ``chat.messages`` starts with the ``instructions`` system message
    when ``instructions`` is set (history from ``previous_response_id`` goes after it).

    The echo fields hold what the client sent (``None`` when it sent nothing), except
    ``tools`` (function tools only, ``[]`` when none), ``tool_choice`` (default ``auto``)
    and ``parallel_tool_calls`` (default true), which a response object always carries."""

    chat: ChatRequest
    raw: bytes
    stream: bool
    store: bool
    previous_response_id: str | None
    instructions: str | None
    tools: list[FunctionToolSpec]
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceSpec
    parallel_tool_calls: bool
    text: TextConfig | None
    reasoning: ReasoningConfig | None
    temperature: float | None
    top_p: float | None
    max_output_tokens: int | None
    metadata: dict[str, str] | None
    truncation: Literal["auto", "disabled"] | None
    user: str | None


# ---------------------------------------------------------------- request: decode
def decode_request(raw: bytes) -> ResponsesIngress:
    """The canonical form of the Responses request ``raw``.

    Raises ``InvalidRequestError`` (400) with ``param`` set for a body that is not JSON, not
    the schema, nested too deep, or asks for what the canonical form cannot carry."""
    req: _Request = http_errors.decode_body(_REQUEST, raw)
    _refuse_stateful(req)
    tools = req.tools or []
    chat = ChatRequest(
        model=req.model,
        messages=_messages(req),
        stream=req.stream,
        # a Responses stream always ends with usage, so the upstream must send it
        stream_options=StreamOptions(include_usage=True) if req.stream else None,
        tools=_tools(tools),
        tool_choice=_tool_choice(req.tool_choice),
        parallel_tool_calls=req.parallel_tool_calls,
        response_format=_response_format(req.text),
        max_completion_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        user=req.user or req.safety_identifier,
        reasoning_effort=_effort(req.reasoning),
    )
    return ResponsesIngress(
        chat=chat,
        raw=raw,
        stream=req.stream,
        store=True if req.store is None else req.store,  # OpenAI's default
        previous_response_id=req.previous_response_id,
        instructions=req.instructions,
        tools=tools,
        tool_choice="auto" if req.tool_choice is None else req.tool_choice,
        parallel_tool_calls=True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        text=req.text,
        reasoning=req.reasoning,
        temperature=req.temperature,
        top_p=req.top_p,
        max_output_tokens=req.max_output_tokens,
        metadata=req.metadata,
        truncation=req.truncation,
        user=req.user,
    )


def _effort(reasoning: ReasoningConfig | None) -> ReasoningEffort | None:
    return _EFFORTS[reasoning.effort] if reasoning and reasoning.effort else None


def _refuse_stateful(req: _Request) -> None:
    """400s for features that live in OpenAI's own stores and have no canonical form."""
    if req.conversation is not None and bytes(req.conversation) != b"null":
        raise InvalidRequestError(
            "conversation objects are stored by OpenAI and are not available through this "
            "gateway; send the conversation as input items",
            param="conversation",
        )
    if req.prompt is not None and bytes(req.prompt) != b"null":
        raise InvalidRequestError(
            "stored prompt templates are not available through this gateway; send the "
            "prompt as instructions and input",
            param="prompt",
        )
    if req.background:
        raise InvalidRequestError(
            "background responses are not supported by this gateway; use stream: true for "
            "long responses",
            param="background",
        )


def _messages(req: _Request) -> list[Message]:
    """``instructions`` and ``input`` as canonical messages (at least one)."""
    messages: list[Message] = []
    if req.instructions:
        messages.append(Message(role="system", content=req.instructions))
    if isinstance(req.input, str):
        messages.append(Message(role="user", content=req.input))
        return messages
    for index, raw in enumerate(req.input):
        _item(messages, raw, f"input[{index}]")
    if not messages:
        raise InvalidRequestError("input must contain at least one item", param="input")
    return messages


def _item(messages: list[Message], raw: Raw, where: str) -> None:
    """Append what the input item ``raw`` (at ``where``) says to ``messages``."""
    kind = _decode(_PEEK, raw, where).type or "message"
    if kind == "reasoning":
        # The model's own reasoning from an earlier turn: an opaque (often encrypted) state
        # only the OpenAI model that wrote it can use, and no chat target accepts it as
        # input. Dropping it is what a model that never reasoned would have seen.
        return
    if kind == "item_reference":
        raise InvalidRequestError(
            "item_reference points at an item stored by OpenAI, which this gateway does not "
            "keep; send the item itself",
            param=where,
        )
    decoder = _ITEM_DECODERS.get(kind)
    if decoder is None:
        raise InvalidRequestError(
            f"input items of type '{kind}' are not supported by this gateway (supported: "
            "message, function_call, function_call_output, reasoning)",
            param=f"{where}.type",
        )
    item = _decode(decoder, raw, where)
    if isinstance(item, _MessageIn):
        messages.append(_message(item, where))
    elif isinstance(item, _FunctionCallIn):
        _add_call(messages, ToolCall(item.call_id, FunctionCall(item.name, item.arguments)))
    else:
        content = _content(item.output, f"{where}.output")
        messages.append(Message(role="tool", content=content, tool_call_id=item.call_id))


def _add_call(messages: list[Message], call: ToolCall) -> None:
    """A function call joins the assistant message right before it (Chat Completions puts
    text and the calls of one turn in one message), else starts an assistant message."""
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        last.tool_calls = [*(last.tool_calls or []), call]
    else:
        messages.append(Message(role="assistant", tool_calls=[call]))


def _message(item: _MessageIn, where: str) -> Message:
    if item.role != "assistant":
        return Message(role=item.role, content=_content(item.content, f"{where}.content"))
    if isinstance(item.content, str):
        return Message(role="assistant", content=item.content)
    texts = []
    for index, part in enumerate(item.content):
        if isinstance(part, _InputText | _OutputTextIn):
            texts.append(part.text)
        elif isinstance(part, _RefusalIn):
            texts.append(part.refusal)  # a refusal is what the assistant said
        else:
            raise InvalidRequestError(
                "assistant messages may contain only text", param=f"{where}.content[{index}]"
            )
    return Message(role="assistant", content="".join(texts))


def _content(content: str | list[_Part], where: str) -> str | list[ContentPart]:
    """Message or tool-output content; one text part becomes a plain string, which every
    target and chat template accepts."""
    if isinstance(content, str):
        return content
    parts = [_part(part, f"{where}[{index}]") for index, part in enumerate(content)]
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        return parts[0].text
    return parts


def _part(part: _Part, where: str) -> ContentPart:
    if isinstance(part, _InputText | _OutputTextIn):
        return TextPart(part.text)
    if isinstance(part, _RefusalIn):
        return TextPart(part.refusal)
    if isinstance(part, _InputImage):
        if part.file_id is not None:
            raise InvalidRequestError(
                "images by file_id refer to OpenAI's file store, which this gateway cannot "
                "read; send image_url (an https or data: URL)",
                param=f"{where}.file_id",
            )
        if not part.image_url:
            raise InvalidRequestError("input_image needs image_url", param=f"{where}.image_url")
        return ImagePart(ImageURL(part.image_url, part.detail))
    if part.file_id is not None or part.file_url is not None:
        field = "file_id" if part.file_id is not None else "file_url"
        raise InvalidRequestError(
            f"input_file by {field} is not supported by this gateway; send file_data",
            param=f"{where}.{field}",
        )
    if not part.file_data:
        raise InvalidRequestError("input_file needs file_data", param=f"{where}.file_data")
    file: dict[str, Any] = {"file_data": part.file_data}
    if part.filename is not None:
        file["filename"] = part.filename
    return FilePart(file)


def _tools(tools: list[FunctionToolSpec]) -> list[Tool] | None:
    """Function tools in Chat Completions' nesting; built-in tools are refused."""
    converted = []
    for index, tool in enumerate(tools):
        if tool.type != "function":
            raise InvalidRequestError(
                f"the built-in tool '{tool.type}' runs inside OpenAI's platform and is not "
                "available through this gateway; only function tools are supported",
                param=f"tools[{index}].type",
            )
        if not tool.name:
            raise InvalidRequestError("function tools need a name", param=f"tools[{index}].name")
        spec = FunctionDef(tool.name, tool.description, tool.parameters, tool.strict)
        converted.append(Tool(spec))
    return converted or None


def _tool_choice(
    choice: Literal["none", "auto", "required"] | ToolChoiceSpec | None,
) -> ToolChoice | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.type != "function":
        raise InvalidRequestError(
            f"tool_choice of type '{choice.type}' is not supported by this gateway; use auto, "
            "none, required or {type: function, name}",
            param="tool_choice.type",
        )
    if not choice.name:
        raise InvalidRequestError("tool_choice needs the function's name", param="tool_choice.name")
    return NamedToolChoice(ToolChoiceFunction(choice.name))


def _response_format(text: TextConfig | None) -> ResponseFormat | None:
    """``text.format`` as Chat Completions' ``response_format`` (plain text is the default,
    so it maps to no format at all)."""
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat("json_object")
    if not fmt.name:
        raise InvalidRequestError("json_schema formats need a name", param="text.format.name")
    if fmt.schema is None:
        raise InvalidRequestError("json_schema formats need a schema", param="text.format.schema")
    spec = JSONSchemaSpec(fmt.name, fmt.schema, fmt.description, fmt.strict)
    return ResponseFormat("json_schema", spec)


_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")


def _decode(decoder: msgspec.json.Decoder[Any], raw: Raw, where: str) -> Any:
    """``raw`` (an item at JSON path ``where``) decoded; a 400 naming the full path if not."""
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _AT.search(text)
        message = text[: match.start()] if match else text
        path = where + (match.group("path") if match else "")
        missing = _MISSING.search(message)
        if missing:
            path = f"{path}.{missing.group('field')}"
        raise InvalidRequestError(f"Invalid request: {message} (at '{path}')", param=path) from exc


# ---------------------------------------------------------------- response
def encode_response(
    resp: ChatResponse, ingress: ResponsesIngress, response_id: str, created_at: int
) -> bytes:
    """The ``response`` object for a finished canonical answer, as OpenAI returns it.

    ``output`` in order: a ``reasoning`` item (the thinking text as its summary) when there
    is reasoning content, a ``message`` item (``output_text`` and/or ``refusal``), then one
    ``function_call`` item per tool call. ``finish_reason`` ``length`` -> status
    ``incomplete`` with reason ``max_output_tokens`` (``content_filter`` likewise), the last
    item marked incomplete. Item ids derive from ``response_id`` and the output index, so
    they are stable and match what ``StreamEncoder`` sends. ``model`` is the client's alias."""
    ids = ItemIds(response_id)
    choice = resp.choices[0] if resp.choices else None
    status, incomplete = response_status(choice.finish_reason if choice else None)
    output = output_items(choice.message, ids) if choice else []
    if incomplete is not None and output:
        _mark_incomplete(output[-1])
    body = response_object(
        ingress,
        response_id,
        created_at,
        status=status,
        output=output,
        usage=response_usage(resp.usage),
        incomplete_details=incomplete,
    )
    return _ENCODER.encode(body)


def output_items(message: AssistantMessage, ids: ItemIds) -> list[OutputItem]:
    """The output items of one assistant message, in OpenAI's order."""
    items: list[OutputItem] = []
    if message.reasoning_content:
        summary = [SummaryText(message.reasoning_content)]
        items.append(ReasoningItem(id=ids.reasoning(len(items)), summary=summary))
    content: list[OutputText | OutputRefusal] = []
    if message.content or (message.content is not None and not message.tool_calls):
        content.append(OutputText(message.content))  # an empty answer is still an answer
    if message.refusal:
        content.append(OutputRefusal(message.refusal))
    if content:
        items.append(MessageItem(id=ids.message(len(items)), status="completed", content=content))
    for call in message.tool_calls or []:
        index = len(items)
        items.append(
            FunctionCallItem(
                id=ids.function_call(index),
                call_id=call.id or ids.call_id(index),
                name=call.function.name,
                arguments=call.function.arguments,
                status="completed",
            )
        )
    return items


def _mark_incomplete(item: OutputItem) -> None:
    if isinstance(item, MessageItem | FunctionCallItem):
        item.status = "incomplete"


def error_body(exc: GatewayError) -> bytes:
    """A non-stream error: the Responses API uses the same ``{"error": {message, type,
    param, code}}`` shape as Chat Completions."""
    return http_errors.error_body(exc)


_ENCODER = msgspec.json.Encoder()


ResponsesBody = _Request  # the request's schema, for the OpenAPI document
