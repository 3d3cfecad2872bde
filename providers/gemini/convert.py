"""OpenAI chat request -> Gemini ``generateContent`` request (pure: no I/O, no clock).

Rules (Gemini's own constraints in parentheses):
- system/developer messages -> ``systemInstruction`` (one text part each);
- user -> ``user``, assistant -> ``model``, tool -> a ``functionResponse`` part in a ``user``
  turn; consecutive turns of one role are merged (Gemini wants them alternating);
- images: ``data:`` URLs -> ``inlineData``, http(s) URLs -> ``fileData`` with a MIME type from
  the extension (default ``image/jpeg``); ``input_audio`` and ``file`` data URLs -> inlineData;
- a tool result names its function by the earlier assistant tool call with the same id
  (Gemini matches results by name, so call ids are not sent);
- tool parameters and response schemas lose the JSON-Schema keys Gemini rejects (``schema``);
- ``reasoning_effort`` -> ``thinkingConfig``: ``thinkingBudget`` minimal 512, low 1024,
  medium 8192, high 24576 (Google's own OpenAI-compatible endpoint maps low/medium/high to
  1K/8K/24K; 512 is the smallest budget every 2.5 model accepts), with ``includeThoughts`` so
  thought summaries come back; ``none`` -> budget 0 (thinking off; Gemini 2.5 Pro cannot turn
  it off and answers 400, which the client then sees). Without an effort nothing is sent and
  the model thinks as it likes. ``maxOutputTokens`` already counts thinking (as OpenAI's
  limits count reasoning tokens), so the client's limit is sent unchanged.

Requests Gemini cannot express raise ``InvalidRequestError`` naming the offending field.
"""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

import msgspec

from core.errors import InvalidRequestError
from core.wire import (
    AudioPart,
    ChatRequest,
    ContentPart,
    ImagePart,
    Message,
    NamedToolChoice,
    ReasoningEffort,
    ResponseFormat,
    TextPart,
)
from providers.gemini.schema import to_gemini_schema
from providers.gemini.wire import (
    Blob,
    Content,
    FileData,
    FunctionCall,
    FunctionCallingConfig,
    FunctionDeclaration,
    FunctionResponse,
    GeminiTool,
    GenerateContentRequest,
    GenerationConfig,
    Part,
    ThinkingConfig,
    ToolConfig,
)

_ROLES = {"user": "user", "assistant": "model", "tool": "user"}
_MODES = {"auto": "AUTO", "required": "ANY", "none": "NONE"}
_IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".webp": "image/webp",
    ".gif": "image/gif",
    ".heic": "image/heic",
    ".heif": "image/heif",
}
_DEFAULT_IMAGE_TYPE = "image/jpeg"
_AUDIO_TYPES = {"wav": "audio/wav", "mp3": "audio/mp3"}
_JSON = "application/json"
THINKING_BUDGETS: dict[ReasoningEffort, int] = {
    "none": 0,
    "minimal": 512,
    "low": 1024,
    "medium": 8192,
    "high": 24576,
}


def to_gemini_request(req: ChatRequest) -> GenerateContentRequest:
    """The ``generateContent`` body for ``req`` (the model goes in the URL, not the body)."""
    contents = _contents(req.messages)
    if not contents:
        raise InvalidRequestError(
            "Gemini needs at least one user or assistant message", param="messages"
        )
    tools = _tools(req)
    return GenerateContentRequest(
        contents=contents,
        system_instruction=_system_instruction(req.messages),
        tools=tools,
        tool_config=_tool_config(req) if tools else None,
        generation_config=_generation_config(req),
    )


# ---------------------------------------------------------------- messages
def _text_of(content: str | list[ContentPart] | None, param: str) -> str:
    """The text of a message that may only carry text (system, tool, assistant)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, TextPart):
            raise InvalidRequestError(
                "only text parts are allowed here", param=f"{param}.content[{index}]"
            )
        texts.append(part.text)
    return "".join(texts)


def _system_instruction(messages: list[Message]) -> Content | None:
    parts = [
        Part(text=_text_of(m.content, f"messages[{i}]"))
        for i, m in enumerate(messages)
        if m.role in ("system", "developer")
    ]
    return Content(parts=parts) if parts else None


def _contents(messages: list[Message]) -> list[Content]:
    names: dict[str, str] = {}  # tool call id -> function name, as the conversation goes
    merged: list[Content] = []
    for index, message in enumerate(messages):
        if message.role in ("system", "developer"):
            continue
        param = f"messages[{index}]"
        if message.role == "assistant":
            parts = _assistant_parts(message, param, names)
        elif message.role == "tool":
            parts = [_tool_result_part(message, param, names)]
        else:
            parts = _user_parts(message.content, param)
        if not parts:
            continue  # an empty assistant turn says nothing; Gemini rejects empty parts
        role = _ROLES[message.role]
        if merged and merged[-1].role == role:
            merged[-1] = Content(role=role, parts=[*merged[-1].parts, *parts])
        else:
            merged.append(Content(role=role, parts=parts))
    return merged


def _user_parts(content: str | list[ContentPart] | None, param: str) -> list[Part]:
    if content is None:
        return []
    if isinstance(content, str):
        return [Part(text=content)]
    return [_part(part, f"{param}.content[{i}]") for i, part in enumerate(content)]


def _part(part: ContentPart, param: str) -> Part:
    if isinstance(part, TextPart):
        return Part(text=part.text)
    if isinstance(part, ImagePart):
        return _image_part(part.image_url.url, param)
    if isinstance(part, AudioPart):
        fmt = part.input_audio.format
        mime = _AUDIO_TYPES.get(fmt, f"audio/{fmt}")
        return Part(inline_data=Blob(mime_type=mime, data=part.input_audio.data))
    file_data = part.file.get("file_data")
    if isinstance(file_data, str) and file_data.startswith("data:"):
        return Part(inline_data=_data_url(file_data, "application/octet-stream", param))
    raise InvalidRequestError("Gemini accepts files only as base64 data URLs", param=param)


def _image_part(url: str, param: str) -> Part:
    if url.startswith("data:"):
        return Part(inline_data=_data_url(url, _DEFAULT_IMAGE_TYPE, param))
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https"):
        raise InvalidRequestError("image URLs must be data:, http: or https:", param=param)
    path = parsed.path.lower()
    suffix = path[path.rfind(".") :] if "." in path.rsplit("/", 1)[-1] else ""
    mime = _IMAGE_TYPES.get(suffix, _DEFAULT_IMAGE_TYPE)
    return Part(file_data=FileData(mime_type=mime, file_uri=url))


def _data_url(url: str, default_mime: str, param: str) -> Blob:
    """``data:[<mime>][;base64],<payload>`` -> base64 bytes and MIME type."""
    header, comma, payload = url[len("data:") :].partition(",")
    if not comma:
        raise InvalidRequestError("malformed data URL", param=param)
    mime, *options = header.split(";")
    if "base64" in options:
        data = "".join(payload.split())
    else:
        data = base64.b64encode(unquote_to_bytes(payload)).decode("ascii")
    return Blob(mime_type=mime or default_mime, data=data)


def _assistant_parts(message: Message, param: str, names: dict[str, str]) -> list[Part]:
    text = _text_of(message.content, param)
    parts = [Part(text=text)] if text else []
    for index, call in enumerate(message.tool_calls or []):
        names[call.id] = call.function.name
        args = _arguments(call.function.arguments, f"{param}.tool_calls[{index}].function")
        parts.append(Part(function_call=FunctionCall(name=call.function.name, args=args)))
    return parts


def _arguments(arguments: str, param: str) -> dict[str, Any]:
    if not arguments.strip():
        return {}
    try:
        value = msgspec.json.decode(arguments)
    except msgspec.DecodeError as exc:
        raise InvalidRequestError("tool call arguments are not valid JSON", param=param) from exc
    if not isinstance(value, dict):
        raise InvalidRequestError("tool call arguments must be a JSON object", param=param)
    return value


def _tool_result_part(message: Message, param: str, names: dict[str, str]) -> Part:
    name = names.get(message.tool_call_id or "") or message.name
    if not name:
        raise InvalidRequestError(
            f"tool_call_id {message.tool_call_id!r} matches no earlier assistant tool call",
            param=f"{param}.tool_call_id",
        )
    text = _text_of(message.content, param)
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        value = None
    # Gemini's ``response`` must be an object; anything else travels as text.
    response = value if isinstance(value, dict) else {"content": text}
    return Part(function_response=FunctionResponse(name=name, response=response))


# ---------------------------------------------------------------- tools and generation config
def _parameters(schema: dict[str, Any] | None, param: str) -> dict[str, Any] | None:
    if not schema:
        return None
    cleaned = to_gemini_schema(schema, param)
    # Gemini rejects an OBJECT schema without properties ("should be non-empty"): a function
    # without parameters is declared without a schema instead.
    if cleaned.get("type") == "object" and not cleaned.get("properties"):
        return None
    return cleaned


def _tools(req: ChatRequest) -> list[GeminiTool] | None:
    if not req.tools:
        return None
    declarations = [
        FunctionDeclaration(
            name=tool.function.name,
            description=tool.function.description,
            parameters=_parameters(tool.function.parameters, f"tools[{i}].function.parameters"),
        )
        for i, tool in enumerate(req.tools)
    ]
    return [GeminiTool(function_declarations=declarations)]


def _tool_config(req: ChatRequest) -> ToolConfig | None:
    choice = req.tool_choice
    if choice is None:
        return None
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in {tool.function.name for tool in req.tools or []}:
            raise InvalidRequestError(
                f"tool_choice names unknown tool {name!r}", param="tool_choice"
            )
        config = FunctionCallingConfig(mode="ANY", allowed_function_names=[name])
    else:
        config = FunctionCallingConfig(mode=_MODES[choice])
    return ToolConfig(function_calling_config=config)


def _response_format(fmt: ResponseFormat | None) -> tuple[str | None, dict[str, Any] | None]:
    if fmt is None or fmt.type == "text":
        return None, None
    spec = fmt.json_schema if fmt.type == "json_schema" else None
    if spec is None or not spec.schema:
        return _JSON, None
    return _JSON, to_gemini_schema(spec.schema, "response_format.json_schema.schema")


def _generation_config(req: ChatRequest) -> GenerationConfig | None:
    mime, schema = _response_format(req.response_format)
    config = GenerationConfig(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        max_output_tokens=req.output_limit(),
        stop_sequences=req.stop_list() or None,
        seed=req.seed,
        candidate_count=req.n,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        response_mime_type=mime,
        response_schema=schema,
        thinking_config=thinking_config(req.reasoning_effort),
    )
    return None if config == GenerationConfig() else config


def thinking_config(effort: ReasoningEffort | None) -> ThinkingConfig | None:
    """``thinkingConfig`` for ``effort`` (see the module docstring); None without one."""
    if effort is None:
        return None
    budget = THINKING_BUDGETS[effort]
    # Thought summaries only exist when the model thinks; asking for them with budget 0
    # would say nothing.
    return ThinkingConfig(thinking_budget=budget, include_thoughts=True if budget else None)
