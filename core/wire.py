"""OpenAI wire types: the gateway's canonical request and response shapes.

Requests are decoded leniently (unknown fields are ignored here and forwarded untouched to
OpenAI-compatible upstreams from the raw bytes); responses are encoded with ``omit_defaults``
so only the fields that carry a value go on the wire. Constant discriminators (``object``,
``role: assistant``, ``type: function``) are msgspec tags, which are always encoded.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

JSONObject = dict[str, Any]


# ---------------------------------------------------------------- request: content parts
class TextPart(Struct, tag="text", tag_field="type"):
    text: str


class ImageURL(Struct):
    url: str
    detail: str | None = None


class ImagePart(Struct, tag="image_url", tag_field="type"):
    image_url: ImageURL


class InputAudio(Struct):
    data: str
    format: str


class AudioPart(Struct, tag="input_audio", tag_field="type"):
    input_audio: InputAudio


class FilePart(Struct, tag="file", tag_field="type"):
    file: JSONObject


ContentPart = TextPart | ImagePart | AudioPart | FilePart


# ---------------------------------------------------------------- request: messages and tools
class FunctionCall(Struct, omit_defaults=True):
    name: str
    arguments: str = ""


class ToolCall(Struct, omit_defaults=True, tag_field="type", tag="function"):
    id: str
    function: FunctionCall


class Message(Struct, omit_defaults=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDef(Struct, omit_defaults=True):
    name: str
    description: str | None = None
    parameters: JSONObject | None = None
    strict: bool | None = None


class Tool(Struct, omit_defaults=True, tag_field="type", tag="function"):
    function: FunctionDef


class ToolChoiceFunction(Struct):
    name: str


class NamedToolChoice(Struct, tag_field="type", tag="function"):
    function: ToolChoiceFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JSONSchemaSpec(Struct, omit_defaults=True):
    name: str
    schema: JSONObject | None = None
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(Struct, omit_defaults=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaSpec | None = None


class StreamOptions(Struct, omit_defaults=True):
    include_usage: bool = False


PositiveInt = Annotated[int, Meta(ge=1)]
# Request fields the gateway forwards but does not compute with still get bounds: an
# unbounded integer or name would travel to upstreams and logs at any size a client picks.
ModelName = Annotated[str, Meta(min_length=1, max_length=256)]
Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
Count = Annotated[int, Meta(ge=1, le=2**31 - 1)]
Temperature = Annotated[float, Meta(ge=0, le=2)]
UnitFloat = Annotated[float, Meta(ge=0, le=1)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high"]


class ChatRequest(Struct, omit_defaults=True):
    """The fields of a chat request the gateway acts on or converts for other vendors."""

    model: ModelName
    messages: Annotated[list[Message], Meta(min_length=1)]
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    stop: str | Annotated[list[str], Meta(max_length=4)] | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: UnitFloat | None = None
    top_k: Count | None = None
    seed: Int64 | None = None
    n: PositiveInt | None = None
    user: str | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # OpenAI's knob for reasoning models. OpenAI-compatible upstreams get it from the raw
    # bytes; the Anthropic and Gemini adapters map it to their thinking budgets.
    reasoning_effort: ReasoningEffort | None = None

    def output_limit(self) -> int | None:
        """The client's cap on generated tokens (``max_completion_tokens`` wins)."""
        return self.max_completion_tokens or self.max_tokens

    def stop_list(self) -> list[str]:
        """``stop`` normalised to a list."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def wants_usage_in_stream(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(Struct, omit_defaults=True):
    """Routing view of a legacy ``/v1/completions`` request (forwarded raw)."""

    model: ModelName
    prompt: str | list[str | int | list[int]]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Meta(ge=0)] | None = None
    temperature: Temperature | None = None
    top_p: UnitFloat | None = None
    stop: str | list[str] | None = None
    seed: Int64 | None = None
    n: PositiveInt | None = None


class EmbeddingRequest(Struct, omit_defaults=True):
    model: ModelName
    input: str | list[str | int | list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Count | None = None
    user: str | None = None

    def input_texts(self) -> list[str] | None:
        """The inputs as strings, or None when the client sent token ids."""
        if isinstance(self.input, str):
            return [self.input]
        if all(isinstance(item, str) for item in self.input):
            return [str(item) for item in self.input]
        return None


# ---------------------------------------------------------------- responses
class PromptTokensDetails(Struct, omit_defaults=True):
    cached_tokens: int = 0
    cache_creation_tokens: int | None = None


class CompletionTokensDetails(Struct, omit_defaults=True):
    """OpenAI's breakdown of ``completion_tokens``: the part spent on hidden reasoning.

    ``reasoning_tokens`` is already counted in ``completion_tokens`` (it is billed as output),
    so nothing adds it again."""

    reasoning_tokens: int = 0


class Usage(Struct, omit_defaults=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None

    @property
    def cached_tokens(self) -> int:
        return self.prompt_tokens_details.cached_tokens if self.prompt_tokens_details else 0

    @property
    def reasoning_tokens(self) -> int:
        """Reasoning tokens within ``completion_tokens`` (0 when the upstream did not say)."""
        details = self.completion_tokens_details
        return details.reasoning_tokens if details else 0


def make_usage(
    prompt: int, completion: int, cached: int = 0, created: int | None = None, reasoning: int = 0
) -> Usage:
    """Usage with ``total_tokens`` filled in and details only when they say something.

    ``completion`` must already include ``reasoning`` (OpenAI's convention)."""
    details = None
    if cached or created:
        details = PromptTokensDetails(cached_tokens=cached, cache_creation_tokens=created)
    completion_details = CompletionTokensDetails(reasoning) if reasoning else None
    return Usage(prompt, completion, prompt + completion, details, completion_details)


class AssistantMessage(Struct, omit_defaults=True, tag_field="role", tag="assistant"):
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    refusal: str | None = None
    # Thinking text, as vLLM, DeepSeek and OpenRouter put it in chat completions (not OpenAI's
    # own field: OpenAI does not return reasoning text in this API).
    reasoning_content: str | None = None


FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


class Choice(Struct):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason | str | None
    logprobs: JSONObject | None = None


class ChatResponse(Struct, omit_defaults=True, tag_field="object", tag="chat.completion"):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class FunctionDelta(Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Struct, omit_defaults=True):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta | None = None


class Delta(Struct, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    refusal: str | None = None
    reasoning_content: str | None = None  # streamed thinking text (see AssistantMessage)


class ChunkChoice(Struct):
    index: int
    delta: Delta
    finish_reason: FinishReason | str | None = None
    logprobs: JSONObject | None = None


class ChatChunk(Struct, omit_defaults=True, tag_field="object", tag="chat.completion.chunk"):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class EmbeddingItem(Struct):
    index: int
    embedding: list[float] | str
    object: Literal["embedding"] = "embedding"


class EmbeddingUsage(Struct):
    prompt_tokens: int = 0
    total_tokens: int = 0


class EmbeddingResponse(Struct):
    data: list[EmbeddingItem]
    model: str
    usage: EmbeddingUsage
    object: Literal["list"] = "list"


class ModelCard(Struct):
    id: str
    created: int
    owned_by: str
    object: Literal["model"] = "model"


class ModelList(Struct):
    data: list[ModelCard]
    object: Literal["list"] = "list"


# ---------------------------------------------------------------- provider results
class ChatResult(Struct):
    """A provider's answer: the decoded response, plus the upstream bytes when they can be
    forwarded as they are (OpenAI-compatible upstreams), so no field is lost in re-encoding."""

    response: ChatResponse
    raw: bytes | None = None


class StreamPart(Struct):
    """One streamed chunk, with the upstream's own JSON bytes when they can be forwarded."""

    chunk: ChatChunk
    raw: bytes | None = None


class RawResult(Struct):
    """A passthrough answer (completions, embeddings): bytes to forward and the usage in them."""

    body: bytes
    usage: Usage | None = None


class RawStreamPart(Struct):
    """One passthrough SSE data payload and the usage it reports, if any."""

    data: bytes
    usage: Usage | None = None
    has_choices: bool = True  # False for the usage-only chunk that ends a stream


class ErrorDetail(Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(Struct):
    error: ErrorDetail


encoder = msgspec.json.Encoder()
