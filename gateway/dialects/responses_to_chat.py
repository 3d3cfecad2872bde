"""OpenAI's Responses API: what a request says, as canonical messages and fields.

- ``to_messages``: ``instructions`` -> a ``system`` message first; ``input`` as a string ->
  one user message. ``input`` items: messages (``role`` user/assistant/system/developer;
  ``type: message`` or no ``type``) keep their role; ``input_text``/``output_text`` -> text,
  ``input_image`` with ``image_url`` -> ``image_url`` part, ``input_file`` with
  ``file_data`` -> ``file`` part. Assistant text is joined into one string.
  ``function_call`` items join the assistant message before them as ``tool_calls`` (a new
  assistant message when there is none); ``function_call_output`` -> a ``tool`` message.
  ``reasoning`` items are dropped (see ``_item``). Refused with a 400 naming the item:
  ``item_reference``, ``file_id`` images and files, other item kinds (they belong to
  OpenAI-hosted tools).
- ``to_tools``: function tools (name/description/parameters/strict at the top level) ->
  ``{type: function, function: {...}}``; built-in tools are refused.
- ``to_tool_choice``: auto/none/required/``{type: function, name}``.
- ``to_response_format``: ``text.format`` -> ``response_format``.

Error ``param`` values are JSON paths in OpenAI's own notation, e.g.
``input[2].content[0].file_id``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec
from msgspec import Raw, Struct

from core.errors import InvalidRequestError
from core.wire import (
    ContentPart,
    FilePart,
    FunctionCall,
    FunctionDef,
    ImagePart,
    ImageURL,
    JSONSchemaSpec,
    Message,
    NamedToolChoice,
    ResponseFormat,
    TextPart,
    Tool,
    ToolCall,
    ToolChoice,
    ToolChoiceFunction,
)
from gateway.dialects.responses_wire import FunctionToolSpec, TextConfig, ToolChoiceSpec


# ---------------------------------------------------------------- input item shapes
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


_PEEK = msgspec.json.Decoder(_Peek)
_ITEM_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    "message": msgspec.json.Decoder(_MessageIn),
    "function_call": msgspec.json.Decoder(_FunctionCallIn),
    "function_call_output": msgspec.json.Decoder(_FunctionCallOutputIn),
}


# ---------------------------------------------------------------- translation
def to_messages(instructions: str | None, input_: str | list[Raw]) -> list[Message]:
    """``instructions`` and ``input`` as canonical messages (at least one)."""
    messages: list[Message] = []
    if instructions:
        messages.append(Message(role="system", content=instructions))
    if isinstance(input_, str):
        messages.append(Message(role="user", content=input_))
        return messages
    for index, raw in enumerate(input_):
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


def to_tools(tools: list[FunctionToolSpec]) -> list[Tool] | None:
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


def to_tool_choice(
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


def to_response_format(text: TextConfig | None) -> ResponseFormat | None:
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
