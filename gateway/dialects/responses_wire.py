"""Wire shapes of the Responses API that both directions share: the request fields a response
object echoes, the output items, usage, and the ``response`` object itself.

Field names and nesting follow OpenAI's ``response`` object (checked against the official
SDK's ``openai.types.responses.Response`` in the tests). Output items are mutable Structs so
the stream encoder can fill in text as it arrives and send the same objects at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from msgspec import Struct

from core.wire import Usage

if TYPE_CHECKING:
    from gateway.dialects.responses import ResponsesIngress

Status = Literal["in_progress", "completed", "incomplete", "failed"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


# ---------------------------------------------------------------- request fields echoed back
class FunctionToolSpec(Struct, omit_defaults=True):
    """A Responses tool: function tools carry name/description/parameters/strict at the top
    level (Chat Completions nests them under ``function``). Other ``type``s are OpenAI's
    built-in tools, refused by the decoder."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceSpec(Struct, omit_defaults=True):
    type: str
    name: str | None = None


class TextFormat(Struct, omit_defaults=True):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(Struct, omit_defaults=True):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(Struct, omit_defaults=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


# ---------------------------------------------------------------- output items
class OutputText(Struct, tag="output_text", tag_field="type"):
    text: str
    annotations: list[Any] = []


class OutputRefusal(Struct, tag="refusal", tag_field="type"):
    refusal: str


class SummaryText(Struct, tag="summary_text", tag_field="type"):
    text: str


class ReasoningItem(Struct, tag="reasoning", tag_field="type", kw_only=True):
    id: str
    summary: list[SummaryText]


class MessageItem(Struct, tag="message", tag_field="type", kw_only=True):
    id: str
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[OutputText | OutputRefusal]


class FunctionCallItem(Struct, tag="function_call", tag_field="type", kw_only=True):
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


OutputItem = ReasoningItem | MessageItem | FunctionCallItem


class ItemIds:
    """Item ids derived from the response id and the item's output index: unique within a
    response, and the same in a stream's events and in its final response object."""

    def __init__(self, response_id: str) -> None:
        self._base = response_id.removeprefix("resp_")

    def message(self, index: int) -> str:
        return f"msg_{self._base}_{index}"

    def reasoning(self, index: int) -> str:
        return f"rs_{self._base}_{index}"

    def function_call(self, index: int) -> str:
        return f"fc_{self._base}_{index}"

    def call_id(self, index: int) -> str:
        """For an upstream that gave a tool call no id (a client must answer by call_id)."""
        return f"call_{self._base}_{index}"


# ---------------------------------------------------------------- usage and the response
class InputTokensDetails(Struct):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(Struct):
    reasoning_tokens: int = 0


class ResponseUsage(Struct):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(Struct):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(Struct):
    code: str
    message: str


class ResponseObject(Struct, kw_only=True):
    """OpenAI's ``response`` object; ``None`` fields are sent as ``null``, as OpenAI does."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Status
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: ReasoningConfig | None
    store: bool
    temperature: float | None
    text: TextConfig
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceSpec
    tools: list[FunctionToolSpec]
    top_p: float | None
    truncation: Literal["auto", "disabled"]
    usage: ResponseUsage | None
    user: str | None
    metadata: dict[str, str]


_PLAIN_TEXT = TextConfig(format=TextFormat("text"))


def response_object(
    ingress: ResponsesIngress,
    response_id: str,
    created_at: int,
    *,
    status: Status,
    output: list[OutputItem],
    usage: ResponseUsage | None = None,
    incomplete_details: IncompleteDetails | None = None,
    error: ResponseError | None = None,
) -> ResponseObject:
    """The response object for ``ingress``: the request's echo fields plus the outcome."""
    return ResponseObject(
        id=response_id,
        created_at=created_at,
        status=status,
        error=error,
        incomplete_details=incomplete_details,
        instructions=ingress.instructions,
        max_output_tokens=ingress.max_output_tokens,
        model=ingress.chat.model,
        output=output,
        parallel_tool_calls=ingress.parallel_tool_calls,
        previous_response_id=ingress.previous_response_id,
        reasoning=ingress.reasoning,
        store=ingress.store,
        temperature=ingress.temperature,
        text=ingress.text if ingress.text is not None else _PLAIN_TEXT,
        tool_choice=ingress.tool_choice,
        tools=ingress.tools,
        top_p=ingress.top_p,
        truncation=ingress.truncation or "disabled",  # OpenAI's default
        usage=usage,
        user=ingress.user,
        metadata=ingress.metadata or {},
    )


def response_status(finish_reason: str | None) -> tuple[Status, IncompleteDetails | None]:
    """The response status for a canonical finish reason: cut short by the token limit or a
    content filter -> ``incomplete`` with the reason; anything else -> ``completed``."""
    if finish_reason == "length":
        return "incomplete", IncompleteDetails("max_output_tokens")
    if finish_reason == "content_filter":
        return "incomplete", IncompleteDetails("content_filter")
    return "completed", None


def response_usage(usage: Usage | None) -> ResponseUsage | None:
    """Canonical usage in the Responses names (``None`` when the upstream reported none)."""
    if usage is None:
        return None
    prompt_details = usage.prompt_tokens_details
    written = prompt_details.cache_creation_tokens if prompt_details else None
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(usage.cached_tokens, written or 0),
        output_tokens=usage.completion_tokens,
        output_tokens_details=OutputTokensDetails(usage.reasoning_tokens),
        total_tokens=usage.total_tokens or usage.prompt_tokens + usage.completion_tokens,
    )
